"""Per-job control sockets: the daemon's end of the channel to `gpuq.runner`.

For each job it starts (or re-adopts after a restart) the daemon binds
``<runtime_dir>/ctl/<job_id>.sock`` (mode 0600 in a 0700 directory) before
the job's process exists, and passes the path in ``GPUQ_CONTROL_SOCKET``.
The runner connects from a background thread and says `Hello`; the hub
checks the peer's uid and the job id, answers `Welcome` and hands every
later message to its listener (`gpuq.daemon.suspend.ChannelListener`).

In lab mode a job runs as its owner (`owner_of` names them): the socket
then belongs to that user (still 0600), in a directory others may pass
through but not list (0711), and only root, the daemon's user and the
job's owner may talk on it; another user's process can neither connect
(the file's mode) nor be heard (the peer check).

One runner connection per job: a new hello replaces the previous connection
(a runner that reconnected). A malformed, oversized (`MAX_CONTROL_BYTES`),
unknown or unexpected message is logged and closes that connection; the
daemon carries on, and the runner reconnects. The socket file is removed
when the job ends and when the daemon stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol

from gpuq.control import (
    CONTROL_VERSION,
    MAX_CONTROL_BYTES,
    Ack,
    Hello,
    Message,
    Metrics,
    Welcome,
    parse_message,
    to_dict,
)
from gpuq.errors import GpuqError, ProtocolError
from gpuq.paths import ensure_private_dir
from gpuq.wire import decode, encode

log = logging.getLogger("gpuq.daemon")

CONTROL_DIR: Final = "ctl"
"""Subdirectory of the runtime directory that holds the per-job sockets."""
METRICS_INTERVAL: Final = 5.0
"""Most seconds between two metrics samples of a runner (sent in `Welcome`)."""
HELLO_TIMEOUT: Final = 10.0
"""Seconds a new connection has to say hello before it is closed."""


def report_interval(scheduler_interval: float) -> float:
    """Seconds between a runner's samples: `METRICS_INTERVAL`, or the scheduler's if shorter.

    Every periodic decision then sees what the runners measured since the
    previous one (their fitted models above all), as the simulator's
    policy sees each job's model of the tick before.
    """
    return min(METRICS_INTERVAL, scheduler_interval)


class ControlListener(Protocol):
    """What the hub tells the rest of the daemon."""

    def on_hello(self, job_id: int, hello: Hello) -> None:
        """A runner connected for `job_id` (and was welcomed)."""

    def on_message(self, job_id: int, message: Metrics | Ack) -> None:
        """A runner sent a metrics sample or an acknowledgement."""


@dataclass
class _Channel:
    """The listening socket of one job and its current runner connection."""

    listening: socket.socket
    path: Path
    owner: int | None = None
    """The uid the job runs as when not the daemon's (lab mode): the only other user heard."""
    writer: asyncio.StreamWriter | None = None
    hello: Hello | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class ControlHub:
    """Every job's control socket, on the daemon's event loop."""

    def __init__(
        self, directory: Path, metrics_interval: float | Callable[[], float] = METRICS_INTERVAL
    ) -> None:
        self.directory = directory
        self._metrics_interval = metrics_interval
        self.listener: ControlListener | None = None
        self.owner_of: Callable[[int], int | None] | None = None
        """The uid a job runs as if not the daemon's (lab mode), else None; the daemon sets it."""
        self._channels: dict[int, _Channel] = {}
        self._directory_ready = False
        self._directory_shared = False

    @property
    def metrics_interval(self) -> float:
        """Seconds between a runner's samples, as a new connection is told (a callable's now)."""
        interval = self._metrics_interval
        return interval() if callable(interval) else interval

    def path(self, job_id: int) -> Path:
        """Where the control socket of `job_id` lives."""
        return self.directory / f"{job_id}.sock"

    def open(self, job_id: int) -> Path | None:
        """Listen on the job's control socket; its path, or None if it cannot be bound.

        Binding happens here, synchronously, so the socket exists before the
        job starts; a stale file left by a killed daemon is replaced.
        """
        self.close(job_id)
        path = self.path(job_id)
        owner = self._owner(job_id)
        listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._prepare_directory(shared=owner is not None)
            path.unlink(missing_ok=True)
            old_umask = os.umask(0o177)
            try:
                listening.bind(str(path))
            finally:
                os.umask(old_umask)
            if owner is not None:  # the directory is root's: nobody can swap the file meanwhile
                os.chown(path, owner, -1, follow_symlinks=False)
            listening.listen(8)
            listening.setblocking(False)
        except (OSError, GpuqError) as exc:
            listening.close()
            log.warning("job %d: no control channel (%s): signals only", job_id, exc)
            return None
        channel = _Channel(listening, path, owner)
        self._channels[job_id] = channel
        loop = asyncio.get_running_loop()
        loop.add_reader(listening.fileno(), self._accept, job_id, channel)
        return path

    def _owner(self, job_id: int) -> int | None:
        """The user the job runs as, when not the daemon's own (lab mode)."""
        return None if self.owner_of is None else self.owner_of(job_id)

    def _prepare_directory(self, *, shared: bool) -> None:
        """Make the sockets' directory (0700), or let users pass through it (0711) when `shared`.

        Users' jobs find their own socket by its name there, but cannot list
        the directory or put anything in it.
        """
        if not self._directory_ready:
            ensure_private_dir(self.directory)
            self._directory_ready = True
        if shared and not self._directory_shared:
            os.chmod(self.directory, 0o711, follow_symlinks=False)
            self._directory_shared = True

    def close(self, job_id: int) -> None:
        """Stop listening for the job, drop its runner and remove the socket file."""
        channel = self._channels.pop(job_id, None)
        if channel is None:
            self.path(job_id).unlink(missing_ok=True)
            return
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            asyncio.get_running_loop().remove_reader(channel.listening.fileno())
        channel.listening.close()
        channel.path.unlink(missing_ok=True)
        if channel.writer is not None:
            channel.writer.close()
        for task in channel.tasks:
            task.cancel()

    def close_all(self) -> None:
        """Close every job's socket (daemon shutdown; runners reconnect to the next one)."""
        for job_id in list(self._channels):
            self.close(job_id)

    def runner(self, job_id: int) -> Hello | None:
        """The hello of the runner connected for `job_id`, or None if none is."""
        channel = self._channels.get(job_id)
        return None if channel is None or channel.writer is None else channel.hello

    def send(self, job_id: int, message: Message) -> bool:
        """Queue `message` for the job's runner; False if no runner is connected."""
        channel = self._channels.get(job_id)
        writer = None if channel is None else channel.writer
        if writer is None or writer.is_closing():
            return False
        writer.write(encode(to_dict(message)))
        return True

    # -- connections ------------------------------------------------------

    def _accept(self, job_id: int, channel: _Channel) -> None:
        try:
            conn, _ = channel.listening.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("job %d: control socket accept failed: %s", job_id, exc)
            return
        conn.setblocking(False)
        task = asyncio.get_running_loop().create_task(self._serve(job_id, channel, conn))
        channel.tasks.add(task)
        task.add_done_callback(channel.tasks.discard)

    async def _serve(self, job_id: int, channel: _Channel, conn: socket.socket) -> None:
        reader, writer = await asyncio.open_unix_connection(sock=conn, limit=MAX_CONTROL_BYTES)
        try:
            _check_peer(conn, channel.owner)
            hello = _expect_hello(job_id, await asyncio.wait_for(reader.readline(), HELLO_TIMEOUT))
            if channel.writer is not None:
                channel.writer.close()  # the runner reconnected: drop the old connection
            channel.writer, channel.hello = writer, hello
            writer.write(encode(to_dict(Welcome(CONTROL_VERSION, self.metrics_interval))))
            await writer.drain()
            if self.listener is not None:
                self.listener.on_hello(job_id, hello)
            await self._read_messages(job_id, reader)
        except ValueError:  # StreamReader's line limit
            log.warning("job %d control channel: message over %d bytes", job_id, MAX_CONTROL_BYTES)
        except ProtocolError as exc:
            log.warning("job %d control channel: %s; closing it", job_id, exc.message)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError) as exc:
            log.info("job %d control channel closed: %r", job_id, exc)
        except Exception:  # a bug in a listener must not take the daemon down
            log.exception("job %d control channel: internal error; closing it", job_id)
        finally:
            if channel.writer is writer:
                channel.writer, channel.hello = None, None
            writer.close()

    async def _read_messages(self, job_id: int, reader: asyncio.StreamReader) -> None:
        while True:
            line = await reader.readline()
            if not line:
                return
            if not line.strip():
                continue
            message = parse_message(decode(line))
            if not isinstance(message, Metrics | Ack):
                raise ProtocolError(f"unexpected {type(message).__name__} from a runner")
            if self.listener is not None:
                self.listener.on_message(job_id, message)


def _check_peer(conn: socket.socket, owner: int | None = None) -> None:
    """Only root, the daemon's user and the job's `owner` may use its channel (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid not in (0, os.getuid(), owner):
        raise ProtocolError(f"uid {uid} may not talk on this job's control channel")


def _expect_hello(job_id: int, line: bytes) -> Hello:
    """The first message must be a hello of our version for this very job."""
    if not line:
        raise ConnectionError("closed before hello")
    message = parse_message(decode(line))
    if not isinstance(message, Hello):
        raise ProtocolError(f"expected hello, got {type(message).__name__}")
    if message.version != CONTROL_VERSION:
        raise ProtocolError(f"control version {message.version} (daemon: {CONTROL_VERSION})")
    if message.job_id != job_id:
        raise ProtocolError(f"hello for job {message.job_id} on the socket of job {job_id}")
    return message
