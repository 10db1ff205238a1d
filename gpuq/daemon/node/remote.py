"""`RemoteNode`: another server, as the head daemon's `Node`, over `ssh HOST gpuq bridge`.

The server's own daemon runs the head's attempts there (`gpuq.daemon.hosted`);
this side keeps a mirror of them and of the server's GPUs, refreshed by a
long poll (`node.sync`) in a thread of its own: a job's end reaches the head
within a round trip, and a silent server is noticed within the poll's
timeout. Launches, signals and reads go through a second session in
another thread, one at a time, so nothing here ever blocks the event loop on
the network: a call answers from the mirror and its effect follows.

The head is the truth about what should run there (`expect`): a job is
expected from its launch until its end is recorded, and every sync names
the expected attempts. An attempt the server runs that the head no longer
expects (superseded while the server was cut off) is stopped: TERM, then
KILL after the grace period. A server silent for `cluster.down_after`
seconds is down: its GPUs leave the view and each attempt it ran ends as
lost, so the head can run the job elsewhere.

A runner there talks to the server's daemon, which relays: what it says
comes back with the next sync, in order and once each, and what the head
sends it goes through the action thread (`RemoteControl`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuq.cluster.remote import SshClient, resolve_address
from gpuq.config import Config, ServerDecl
from gpuq.control import Ack, Hello, Message, Metrics, parse_message, to_dict
from gpuq.daemon import faults
from gpuq.daemon.control import ControlListener
from gpuq.daemon.executor import LaunchSpec, OnSpawned, Outcome
from gpuq.daemon.servers import Health
from gpuq.daemon.spawner import Spawned
from gpuq.errors import DaemonUnavailable, GpuqError
from gpuq.gpus import JobHolding
from gpuq.models import GpuInfo

log = logging.getLogger("gpuq.daemon")

POLL_SECONDS = 1.0
"""How long a sync waits on the server for a change: the GPU view's freshness."""
DIRS_KEPT_SECONDS = 3600.0
"""How long a working directory the scheduler asked about is checked at each sync.

An hour: a user submitting from one project directory now and then finds
the answer already there, and the checks (one `isdir` each) cost little.
"""


class RemoteControl:
    """Control channels to runners on another server, relayed by its daemon.

    What a runner says reaches the head with the next sync (`messages`);
    what the head sends goes through the action thread (`node.control`).
    """

    def __init__(self, node: RemoteNode) -> None:
        self._node = node
        self.hellos: dict[int, Hello] = {}

    def open(self, job_id: int) -> Path | None:
        """Where the job's runner connects there (the server binds it at launch)."""
        mirror = self._node._last
        return None if mirror is None else mirror.control_dir / f"{job_id}.sock"

    def close(self, job_id: int) -> None:
        """Forget the job's runner (the server closes its socket when the attempt ends)."""
        self.hellos.pop(job_id, None)

    def close_all(self) -> None:
        """Forget every runner."""
        self.hellos.clear()

    def runner(self, job_id: int) -> Hello | None:
        """The hello of the job's runner, while the server says it is connected."""
        mirror = self._node.mirror
        report = {} if mirror is None else mirror.attempts.get(job_id, {})
        return self.hellos.get(job_id) if report.get("runner") else None

    def send(self, job_id: int, message: Message) -> bool:
        """Relay `message` to the job's runner; False if none is connected there."""
        if self.runner(job_id) is None:
            return False
        self._node.send_control(job_id, message)
        return True


@dataclass
class Mirror:
    """What the head last learned from the server (one sync's answer)."""

    devices: list[GpuInfo]
    memory_head: dict[str, int]
    jobs_on_gpu: dict[str, list[int]]
    busy: frozenset[str]
    attempts: dict[int, dict[str, Any]]
    jobs_dir: Path
    log_dir: Path
    control_dir: Path
    messages: list[dict[str, Any]]
    backend: str
    device_env: dict[str, str]
    dirs_missing: frozenset[str]
    version: int
    time: float


class RemoteNode:
    """Another server's daemon running this head's jobs (module docstring)."""

    def __init__(
        self,
        server: ServerDecl,
        head: str,
        config_of: Callable[[], Config],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.name = server.host
        self.server = server
        self.head = head
        self.mirror: Mirror | None = None
        """The latest answer; None until the first, and again once the server is down."""
        self.health = Health(server.host, since=time.time())
        """Up, down or unknown, since when and why (`gpuq daemon status`)."""
        self._last: Mirror | None = None
        self._config_of = config_of
        self._loop = loop
        self._control = RemoteControl(self)
        self.on_news: Callable[[], None] | None = None
        """Called when an answer tells the scheduler something new (a directory checked)."""
        self.listener: ControlListener | None = None
        """Who hears what runners there say (the head's `suspend.ChannelListener`)."""
        self._acked = -1
        self._outbox = ""
        self._lock = threading.Lock()
        self._expect: dict[int, int] = {}
        self._launched_at: dict[int, int] = {}
        """Job -> the server's version right after its launch: older answers predate it."""
        self._launching: set[int] = set()
        self._watchers: dict[int, Callable[[int, Outcome], None]] = {}
        self._adopting: dict[int, tuple[Callable[[int], None], Callable[[int, Outcome], None]]] = {}
        self._stale_since: dict[tuple[int, int], float] = {}
        self.address: str | None = None
        """The IP address ssh reaches the server at (multi-node jobs' rendezvous), once known."""
        self.address_error = ""
        """Why the address is not known, if finding it failed."""
        self._dirs: dict[str, float] = {}
        """Directories the scheduler asked about, and when: each is checked there for an hour."""
        self._asked: frozenset[str] = frozenset()
        self._dir_answers: dict[str, bool] = {}
        """Answers of `node.dirs`, until a sync has asked about the same directory."""
        self._dirs_asking: set[str] = set()
        self._actions: queue.Queue[_Action | None] = queue.Queue()
        self._closed = threading.Event()
        self._threads = [
            threading.Thread(target=self._sync_forever, name=f"gpuq-sync-{self.name}", daemon=True),
            threading.Thread(target=self._act_forever, name=f"gpuq-act-{self.name}", daemon=True),
        ]

    def start(self) -> None:
        """Start polling the server and carrying out actions."""
        for thread in self._threads:
            thread.start()

    # -- the Node interface ------------------------------------------------

    @property
    def control(self) -> RemoteControl:
        """Control channels to the runners of jobs there, relayed by the server's daemon."""
        return self._control

    @property
    def gpu_backend(self) -> str:
        """The server's GPU backend, as it last said."""
        return "unknown" if self.mirror is None else self.mirror.backend

    @property
    def log_dir(self) -> Path:
        """Where the server keeps this head's jobs' default logs."""
        return self._known().log_dir

    def job_dir(self, job_id: int) -> Path:
        """The job's directory on the server (made there at launch)."""
        return self._known().jobs_dir / str(job_id)

    def device_env(self) -> dict[str, str]:
        """What jobs there learn of their devices (fake GPUs: where their load is)."""
        return dict(self._known().device_env)

    def _known(self) -> Mirror:
        """The latest answer, or the last one before the server went down."""
        if self._last is None:
            raise RuntimeError(f"server {self.name} has not answered yet")
        return self._last

    def launch(self, job_id: int, spec: LaunchSpec, on_spawned: OnSpawned) -> None:
        """Ask the server to start the attempt; `on_spawned` follows its answer."""
        attempt = int(spec.env.get("GPUQ_ATTEMPT", "0"))
        gpus = tuple(g for g in spec.env.get("GPUQ_GPU_UUIDS", "").split(",") if g)
        with self._lock:
            self._expect[job_id] = attempt
        self._launching.add(job_id)
        params = {
            "head": self.head,
            "job": job_id,
            "attempt": attempt,
            "launch": spec.to_dict(),
            "gpus": list(gpus),
        }

        def act(session: SshClient) -> None:
            reply = session.call("node.launch", **params)
            self._loop.call_soon_threadsafe(self._launched, job_id, reply, on_spawned)

        self._act(act, lambda error: self._launch_failed(job_id, error.message, on_spawned))

    def _launched(self, job_id: int, reply: Mapping[str, Any], on_spawned: OnSpawned) -> None:
        faults.crash_point("remote-launched")
        self._launching.discard(job_id)
        self._launched_at[job_id] = int(reply.get("version", 0))
        on_spawned(Spawned(int(reply["pid"]), None))

    def _launch_failed(self, job_id: int, why: str, on_spawned: OnSpawned) -> None:
        if job_id not in self._launching:
            return  # already answered
        self._launching.discard(job_id)
        with self._lock:
            self._expect.pop(job_id, None)
        on_spawned(Spawned(None, None, f"{self.name}: {why}"))

    def watch(
        self,
        job_id: int,
        pid: int,
        on_exit: Callable[[int, Outcome], None],
        pidfd: int | None = None,
    ) -> None:
        """Call `on_exit(job_id, outcome)` when the server reports the attempt ended."""
        self._watchers[job_id] = on_exit

    def adopt(
        self,
        job_id: int,
        attempt: int,
        on_exit: Callable[[int, Outcome], None],
        on_running: Callable[[int], None],
        on_missing: Callable[[int, Outcome], None],
    ) -> None:
        """Expect an attempt a previous head started, and watch it (head restart).

        The first answer about it calls `on_running` (it runs), `on_exit`
        (it ended) or `on_missing` (the server never started it).
        """
        with self._lock:
            self._expect[job_id] = attempt
        self._watchers[job_id] = on_exit
        self._adopting[job_id] = (on_running, on_missing)

    def unwatch_all(self) -> None:
        """Stop watching (head shutdown: the attempts run on, adopted again at restart)."""
        self._watchers.clear()
        self._adopting.clear()

    def signal(self, job_id: int, signum: int) -> bool:
        """Send `signum` to the attempt there; False if it has not started yet."""
        attempt = self._expect.get(job_id)
        if attempt is None or job_id in self._launching:
            return False
        self._send_signal(job_id, attempt, signum)
        return True

    def send_control(self, job_id: int, message: Message) -> None:
        """Relay a control message to the attempt's runner there (`RemoteControl.send`)."""
        attempt = self._expect.get(job_id)
        if attempt is None:
            return
        params = {"head": self.head, "job": job_id, "attempt": attempt, "message": to_dict(message)}

        def act(session: SshClient) -> None:
            session.call("node.control", **params)

        def failed(error: GpuqError) -> None:
            log.warning(
                "server %s: a message to job %d's runner failed: %s",
                self.name,
                job_id,
                error.message,
            )

        self._act(act, failed)

    def _send_signal(self, job_id: int, attempt: int, signum: int) -> None:
        params = {"head": self.head, "job": job_id, "attempt": attempt, "signal": signum}

        def act(session: SshClient) -> None:
            session.call("node.signal", **params)

        def failed(error: GpuqError) -> None:
            log.warning(
                "server %s: signal %d to job %d failed: %s",
                self.name,
                signum,
                job_id,
                error.message,
            )

        self._act(act, failed)

    def outcome(self, job_id: int) -> Outcome:
        """How the attempt ended, as the server last said."""
        report = {} if self.mirror is None else self.mirror.attempts.get(job_id, {})
        if report.get("state") == "ended":
            return Outcome.from_dict(report.get("outcome") or {})
        return Outcome(
            None, None, f"gone from {self.name}: {report.get('reason', 'no word')}", None
        )

    def live_shim(self, job_id: int, settle: float = 10.0) -> int | None:
        """The attempt's shim pid there, if the server last said it runs."""
        report = {} if self.mirror is None else self.mirror.attempts.get(job_id, {})
        return int(report["pid"]) if report.get("state") == "running" else None

    def has_exit_record(self, job_id: int) -> bool:
        """True once the server reported the attempt ended."""
        report = {} if self.mirror is None else self.mirror.attempts.get(job_id, {})
        return report.get("state") == "ended"

    def has_shim_record(self, job_id: int) -> bool:
        """True once the server reported the attempt's shim."""
        report = {} if self.mirror is None else self.mirror.attempts.get(job_id, {})
        return report.get("state") in ("running", "ended")

    def kill_leftovers(self, job_id: int, timeout: float = 10.0) -> list[int]:
        """The server's own daemon cleans up after its shims: nothing to do here."""
        return []

    def read_record(self, job_id: int, name: str) -> dict[str, Any] | None:
        """A record of an ended attempt the server sent (`gpuq.daemon.hosted.RECORDS`)."""
        report = {} if self._last is None else self._last.attempts.get(job_id, {})
        record = (report.get("records") or {}).get(name)
        return dict(record) if isinstance(record, dict) else None

    def remove_job_files(self, job_id: int) -> None:
        """The server keeps the job's directory (cleaned with the server's own `gpuq clean`)."""

    async def sample_gpus(self, holdings: Mapping[int, JobHolding]) -> list[GpuInfo]:
        """The server's GPUs as last synced (the monitor reads the mirror directly)."""
        return [] if self.mirror is None else list(self.mirror.devices)

    def close(self) -> None:
        """Stop both threads and their sessions; the attempts there run on."""
        self._closed.set()
        self._actions.put(None)

    # -- what the head's scheduler asks ----------------------------------

    def has_dir(self, path: str) -> bool | None:
        """Whether `path` exists there: None until the server has said.

        Every sync asks again about the directories asked for within the
        hour; a new one is asked at once through the action session too
        (`node.dirs`, a round trip), and its answer wakes the scheduler.
        """
        with self._lock:
            self._dirs[path] = time.monotonic()
        if self.mirror is None:
            return None
        if path in self._asked:
            return path not in self.mirror.dirs_missing
        if path not in self._dir_answers:
            self._ask_dir(path)
        return self._dir_answers.get(path)

    def _ask_dir(self, path: str) -> None:
        """Ask the server about one directory now (once at a time per directory)."""
        if path in self._dirs_asking:
            return
        self._dirs_asking.add(path)

        def act(session: SshClient) -> None:
            reply = session.call("node.dirs", paths=[path])
            exists = path not in (reply.get("missing") or [])
            self._loop.call_soon_threadsafe(self._dir_answered, path, exists)

        def failed(error: GpuqError) -> None:
            self._dirs_asking.discard(path)  # the next sync asks

        self._act(act, failed)

    def _dir_answered(self, path: str, exists: bool) -> None:
        self._dirs_asking.discard(path)
        self._dir_answers[path] = exists
        if self.on_news is not None:
            self.on_news()

    async def read_output(
        self, job_id: int, stream: str, offset: int, tail: int | None
    ) -> dict[str, Any]:
        """Part of the job's output there (`node.read`), its bytes in base64, off the event loop."""
        params: dict[str, Any] = {"job": job_id, "stream": stream, "offset": offset, "raw": True}
        if tail is not None:
            params["tail"] = tail
        return await self.request("node.read", **params)

    async def request(self, method: str, **params: Any) -> dict[str, Any]:
        """One `node.*` request for this head, through the action thread; its result.

        A GpuqError says why it failed (the server's own error, or no session).
        """
        answer: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        params = {"head": self.head, **params}

        def act(session: SshClient) -> None:
            reply = session.call(method, **params)
            self._loop.call_soon_threadsafe(_settle, answer, reply, None)

        self._act(act, lambda error: _settle(answer, None, error))
        return await answer

    async def request_apart(self, method: str, **params: Any) -> dict[str, Any]:
        """As `request`, on a session of its own: for a request that takes long.

        A checkpoint's check reads every byte; actions queued behind it on the
        action session (launches, signals) would wait as long.
        """
        params = {"head": self.head, **params}
        config = self._config_of()

        def call() -> dict[str, Any]:
            with SshClient.connect_to(self.server, config) as session:
                reply: dict[str, Any] = session.call(method, **params)
                return reply

        return await asyncio.to_thread(call)

    # -- the threads -----------------------------------------------------

    def _act(self, act: Callable[[SshClient], Any], failed: Callable[[GpuqError], None]) -> None:
        """Queue `act` for the action thread; `failed(error)` runs on the loop if it fails."""
        self._actions.put(_Action(act, failed))

    def _act_forever(self) -> None:
        session: SshClient | None = None
        while (action := self._actions.get()) is not None and not self._closed.is_set():
            try:
                if session is None:
                    session = SshClient.connect_to(self.server, self._config_of())
                action.run(session)
            except (GpuqError, OSError) as exc:
                if session is not None and not _answered(exc):
                    session.close()
                    session = None
                error = exc if isinstance(exc, GpuqError) else DaemonUnavailable(str(exc))
                with contextlib.suppress(RuntimeError):  # the loop closed: the head stops
                    self._loop.call_soon_threadsafe(action.failed, error)
        if session is not None:
            session.close()

    def _sync_forever(self) -> None:
        session: SshClient | None = None
        version = -1
        while not self._closed.is_set():
            config = self._config_of()
            with self._lock:
                expect = dict(self._expect)
                recent = time.monotonic() - DIRS_KEPT_SECONDS
                self._dirs = {path: at for path, at in self._dirs.items() if at >= recent}
                dirs = sorted(self._dirs)
                acked, outbox = self._acked, self._outbox
            try:
                if self.address is None:
                    self._resolve(config)
                if session is None:  # silent past a beat beyond its poll: not answering
                    timeout = POLL_SECONDS + config.cluster.heartbeat
                    session = SshClient.connect_to(self.server, config, timeout=timeout)
                    version = -1
                reply = session.call(
                    "node.sync",
                    head=self.head,
                    expect={str(job): attempt for job, attempt in expect.items()},
                    dirs=dirs,
                    version=version,
                    wait=POLL_SECONDS,
                    acked=acked,
                    outbox=outbox,
                )
                version = int(reply.get("version", -1))
            except (GpuqError, OSError) as exc:
                if session is not None:
                    session.close()
                    session = None
                why = exc.message if isinstance(exc, GpuqError) else str(exc)
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._unanswered, why)
                self._closed.wait(min(config.cluster.heartbeat, POLL_SECONDS * 2))
                continue
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._synced, reply, frozenset(dirs))
        if session is not None:
            session.close()

    def _resolve(self, config: Config) -> None:
        """Find the address ssh reaches the server at (once; a failure is kept as the reason)."""
        try:
            self.address = resolve_address(self.server.host, config.cluster)
            self.address_error = ""
        except (OSError, subprocess.SubprocessError) as exc:
            self.address_error = str(exc)

    # -- on the event loop -------------------------------------------------

    def _synced(self, reply: Mapping[str, Any], asked: frozenset[str]) -> None:
        """Take in one answer: the mirror, ended attempts, stale ones."""
        now = time.time()
        if self.health.state != "up":
            log.info("server %s is up (node %s)", self.name, reply.get("node"))
            self.health.state, self.health.since, self.health.reason = "up", now, None
            self._act(lambda session: None, lambda error: None)  # open the action session now
        try:
            mirror = _mirror(reply, self.name, now)
        except (KeyError, TypeError, ValueError) as exc:
            self._unanswered(f"unreadable answer from {self.name}: {exc}")
            return
        self.mirror = self._last = mirror
        attempts, version = mirror.attempts, mirror.version
        pid = reply.get("pid")
        self.health.node, self.health.gpus = str(reply.get("node") or ""), len(mirror.devices)
        self.health.pid = pid if isinstance(pid, int) else None
        self.health.last_answer = now
        outbox = str(reply.get("outbox") or "")
        if outbox != self._outbox:  # the server's daemon restarted: its count began anew
            with self._lock:
                self._outbox, self._acked = outbox, -1
        self._hear(mirror.messages)
        if asked - self._asked and self.on_news is not None:
            self.on_news()  # jobs waiting to learn where their directory is can be placed now
        self._asked = asked
        for path in asked:
            self._dir_answers.pop(path, None)  # the sync's answer, renewed each poll, rules
        for job_id, report in attempts.items():
            if job_id in self._launching or self._launched_at.get(job_id, -1) > version:
                continue  # the answer predates the launch
            if report.get("attempt") != self._expect.get(job_id):
                continue  # about an attempt asked for before: the head has moved on
            if job_id not in self._watchers:
                continue
            adopting = self._adopting.pop(job_id, None)
            if report.get("state") == "ended":
                self._end(job_id, Outcome.from_dict(report.get("outcome") or {}))
            elif report.get("state") == "missing":
                why = str(report.get("reason") or "it is not there")
                lost = Outcome(None, None, f"gone from {self.name}: {why}", None)
                if adopting is not None:
                    self._watchers.pop(job_id, None)
                    self._forget(job_id)
                    adopting[1](job_id, lost)
                else:
                    self._end(job_id, lost)
            elif adopting is not None:
                if report.get("state") == "running":
                    adopting[0](job_id)
                else:
                    self._adopting[job_id] = adopting  # still starting: ask again
        self._stop_stale(reply.get("stale") or [], now)

    def _hear(self, messages: list[dict[str, Any]]) -> None:
        """Hand what runners there said to the listener, each message once, in order."""
        for item in messages:
            seq, job_id = item.get("seq"), item.get("job")
            if not isinstance(seq, int) or seq <= self._acked or not isinstance(job_id, int):
                continue
            with self._lock:
                self._acked = seq
            try:
                message = parse_message(item.get("message"))
            except GpuqError as exc:
                log.warning("server %s: job %d's runner: %s", self.name, job_id, exc.message)
                continue
            if isinstance(message, Hello):
                self._control.hellos[job_id] = message
                if self.listener is not None:
                    self.listener.on_hello(job_id, message)
            elif isinstance(message, Metrics | Ack) and self.listener is not None:
                self.listener.on_message(job_id, message)

    def _end(self, job_id: int, outcome: Outcome) -> None:
        on_exit = self._watchers.pop(job_id, None)
        self._forget(job_id)
        if on_exit is not None:
            on_exit(job_id, outcome)

    def _forget(self, job_id: int) -> None:
        """Expect the job's attempt no more: its end is recorded (or it never began)."""
        with self._lock:
            self._expect.pop(job_id, None)
        self._launched_at.pop(job_id, None)
        self._adopting.pop(job_id, None)

    def _stop_stale(self, stale: list[dict[str, Any]], now: float) -> None:
        """TERM attempts the head superseded; KILL those still there after the grace."""
        grace = self._config_of().daemon.kill_grace
        seen = set()
        for item in stale:
            job, attempt = int(item.get("job", -1)), int(item.get("attempt", -1))
            if self._expect.get(job) == attempt:
                continue
            seen.add((job, attempt))
            first = self._stale_since.setdefault((job, attempt), now)
            signum = 15 if now == first else (9 if now - first >= grace else 0)
            if signum:
                log.warning(
                    "server %s: stopping job %d's attempt %d, which this head superseded",
                    self.name,
                    job,
                    attempt,
                )
                self._send_signal(job, attempt, signum)
        for key in [k for k in self._stale_since if k not in seen]:
            del self._stale_since[key]

    def _unanswered(self, why: str) -> None:
        """A sync failed: past `down_after` of silence, the server is down and its jobs lost."""
        now = time.time()
        health = self.health
        health.reason = why
        silent_since = health.since if health.last_answer is None else health.last_answer
        if health.state == "down" or now - silent_since < self._config_of().cluster.down_after:
            return
        log.warning("server %s is down: %s", self.name, why)
        self.health.state, self.health.since = "down", now
        self.mirror = None
        for job_id in list(self._watchers):
            lost = Outcome(None, None, f"server {self.name} is down ({why})", None)
            self._end(job_id, replace(lost, lost_with=self.name))
        with self._lock:
            self._expect.clear()


def _mirror(reply: Mapping[str, Any], name: str, now: float) -> Mirror:
    """The mirror of one `node.sync` answer (another daemon's: checked, not trusted)."""
    gpus = list(reply.get("gpus") or [])
    return Mirror(
        devices=[replace(GpuInfo.from_dict(g), node=name) for g in gpus],
        memory_head={str(g["uuid"]): int(g.get("memory_head") or 0) for g in gpus},
        jobs_on_gpu={str(g["uuid"]): [int(j) for j in g.get("jobs") or []] for g in gpus},
        busy=frozenset(str(g["uuid"]) for g in gpus if g.get("busy")),
        attempts={
            int(job): dict(report)
            for job, report in (reply.get("attempts") or {}).items()
            if str(job).isdigit() and isinstance(report, dict)
        },
        jobs_dir=Path(str(reply["jobs_dir"])),
        log_dir=Path(str(reply["log_dir"])),
        control_dir=Path(str(reply["control_dir"])),
        messages=[dict(m) for m in reply.get("messages") or [] if isinstance(m, dict)],
        backend=str(reply.get("backend") or "unknown"),
        device_env={str(k): str(v) for k, v in (reply.get("device_env") or {}).items()},
        dirs_missing=frozenset(str(d) for d in reply.get("dirs_missing") or ()),
        version=int(reply.get("version", 0)),
        time=now,
    )


@dataclass(frozen=True)
class _Action:
    """One call for the action thread, and what to do on the loop if it fails."""

    run: Callable[[SshClient], Any]
    failed: Callable[[GpuqError], None]


def _settle(
    answer: asyncio.Future[dict[str, Any]], reply: dict[str, Any] | None, exc: Exception | None
) -> None:
    if answer.done():
        return
    if exc is not None:
        answer.set_exception(exc)
    else:
        assert reply is not None
        answer.set_result(reply)


def _answered(exc: Exception) -> bool:
    """True when the server answered with an error (the session itself is fine)."""
    return isinstance(exc, GpuqError) and exc.code not in ("unavailable", "protocol", "timeout")
