"""Where `gpuq top` gets its data: the daemon, through `gpuq.client` only.

`Source` is the small blocking interface the app's thread workers call;
`DaemonSource` implements it over the socket, `gpuq.tui.replay.ReplaySource`
over recorded payloads. Streams (`subscribe`, `logs --follow`) block in a
worker thread, so each can be interrupted from the UI thread: that shuts its
socket down, which wakes the blocked read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuq.client import Client
from gpuq.config import Config
from gpuq.errors import DaemonUnavailable, ProtocolError

Job = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything shown at (re)connect: the server, every job, recent GPU samples."""

    node: str
    jobs: list[Job]
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)


class Stream(Protocol):
    """A blocking stream of event objects that another thread may interrupt."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield events until the stream ends, is interrupted, or the daemon goes."""
        ...

    def interrupt(self) -> None:
        """Make the blocked iteration end quietly (from any thread)."""
        ...


class Source(Protocol):
    """What the app asks of the daemon; every call blocks and raises GpuqError."""

    def snapshot(self) -> Snapshot:
        """Every job and the current GPUs."""
        ...

    def gpus(self) -> dict[str, Any]:
        """The `gpus` result."""
        ...

    def show(self, job_id: int) -> dict[str, Any]:
        """The `show` result of one job."""
        ...

    def jobs(self, ids: list[int]) -> list[Job]:
        """The current job objects of `ids` (unknown ids are left out)."""
        ...

    def metrics(self, job_id: int, since: float) -> list[dict[str, Any]] | None:
        """Runner metrics samples newer than `since`, or None if the daemon has none."""
        ...

    def act(self, method: str, ids: list[int], **extra: Any) -> list[dict[str, Any]]:
        """A bulk action (`cancel`, `hold`, ...); its per-job results."""
        ...

    def subscribe(self, topics: tuple[str, ...]) -> Stream:
        """The daemon's event stream for `topics`."""
        ...

    def logs(self, job_id: int, tail: int, follow: bool) -> Stream:
        """A job's output as `{"data": str}` events."""
        ...

    def close(self) -> None:
        """Interrupt every open stream and drop connections (at exit)."""
        ...


class ClientStream:
    """One streaming request on its own connection; see `Stream`."""

    def __init__(
        self,
        connect: Callable[[], Client],
        method: str,
        params: dict[str, Any],
        on_close: Callable[[ClientStream], None] = lambda stream: None,
    ) -> None:
        self._connect = connect
        self._method = method
        self._params = params
        self._on_close = on_close
        self._client: Client | None = None
        self._interrupted = False
        self.result: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield events; an interrupt ends the iteration without an error."""
        client = self._connect()
        self._client = client
        try:
            if self._interrupted:
                return
            for kind, item in client.stream(self._method, **self._params):
                if kind == "result":
                    self.result = item
                    return
                yield item
        except DaemonUnavailable:
            if not self._interrupted:
                raise
        finally:
            client.close()
            self._on_close(self)

    def interrupt(self) -> None:
        """End the iteration from another thread."""
        self._interrupted = True
        client = self._client
        if client is not None:
            client.interrupt()


class DaemonSource:
    """`Source` over the daemon socket of one configuration.

    Short requests share one connection (re-opened after a failure); each
    stream gets its own. It never starts a daemon: `gpuq top` does that once,
    before the app runs, like every other command.
    """

    def __init__(self, config: Config, list_limit: int | None = 20000) -> None:
        self._config = config
        self._list_limit = list_limit
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._streams: set[ClientStream] = set()
        self._streams_lock = threading.Lock()

    def _connect(self) -> Client:
        try:
            client = Client.connect(self._config, autostart=False)
        except OSError as exc:  # refused, permission, reset: all mean "not reachable now"
            raise DaemonUnavailable(f"cannot connect to the daemon: {exc}") from exc
        return client

    def _call(self, method: str, **params: Any) -> dict[str, Any]:
        with self._lock:
            if self._client is None:
                self._client = self._connect()
            try:
                return self._client.call(method, **params)
            except (DaemonUnavailable, OSError) as exc:
                self._client.close()
                self._client = None
                if isinstance(exc, OSError):
                    raise DaemonUnavailable(f"lost the connection to the daemon: {exc}") from exc
                raise

    def snapshot(self) -> Snapshot:
        """Every job (the newest `list_limit`) and the current GPUs."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
        jobs = self._call("list", include_done=True, limit=self._list_limit)["jobs"]
        gpus = self._call("gpus")
        node = self._client.hello.get("node", "") if self._client is not None else ""
        return Snapshot(node=str(node), jobs=jobs, gpu_samples=[gpus])

    def gpus(self) -> dict[str, Any]:
        """The `gpus` result."""
        return self._call("gpus")

    def show(self, job_id: int) -> dict[str, Any]:
        """The `show` result of one job."""
        return self._call("show", id=job_id)

    def jobs(self, ids: list[int]) -> list[Job]:
        """The current job objects of `ids` (unknown ids are left out)."""
        jobs: list[Job] = self._call("list", ids=ids, include_done=True)["jobs"]
        return jobs

    def metrics(self, job_id: int, since: float) -> list[dict[str, Any]] | None:
        """Samples newer than `since`; None from a daemon without the `metrics` request."""
        try:
            result = self._call("metrics", id=job_id, since=since)
        except ProtocolError:
            return None
        samples: list[dict[str, Any]] = result.get("samples", [])
        return samples

    def act(self, method: str, ids: list[int], **extra: Any) -> list[dict[str, Any]]:
        """A bulk action; its per-job results."""
        results: list[dict[str, Any]] = self._call(method, ids=ids, **extra)["results"]
        return results

    def _stream(self, method: str, **params: Any) -> ClientStream:
        stream = ClientStream(self._connect, method, params, self._forget)
        with self._streams_lock:
            self._streams.add(stream)
        return stream

    def _forget(self, stream: ClientStream) -> None:
        with self._streams_lock:
            self._streams.discard(stream)

    def subscribe(self, topics: tuple[str, ...]) -> Stream:
        """The daemon's event stream for `topics`."""
        return self._stream("subscribe", topics=list(topics))

    def logs(self, job_id: int, tail: int, follow: bool) -> Stream:
        """A job's standard output as `{"data": str}` events."""
        return self._stream("logs", id=job_id, tail=tail, follow=follow)

    def close(self) -> None:
        """Interrupt every open stream and close the shared connection."""
        with self._streams_lock:
            streams = list(self._streams)
        for stream in streams:
            stream.interrupt()
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
