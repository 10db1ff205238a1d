"""The runner's end of the control channel: one background thread per job.

`gpuq.runner.init()` starts a `ControlClient` inside gpuq when
``GPUQ_CONTROL_SOCKET`` is set (on rank 0 only under torchrun). Its daemon
thread connects to the job's socket, says `Hello`, reads `Welcome`, then:

- sends ``job.metrics.sample()`` every ``metrics_interval`` seconds (the first
  one as soon as there is a step to report, so a fresh connection is useful
  at once, and one within `MODEL_POLL` of a newly fitted model);
- applies what the daemon asks: `SuspendRequest` -> ``job.request_suspend``,
  `ResumeRequest` -> withdraw the daemon's pending request and ``job.resume()``,
  `CheckpointRequest` -> save at the next boundary and go on, `ResizeRequest`
  -> suspend to a checkpoint (the daemon restarts the job on its new GPUs).
  A park asked of a parked job is acknowledged at once, unless a resume
  already woke it: the job then computes again, and the park waits for its
  next boundary (acknowledged as parked, the daemon would count it waiting
  while it computes).

Acknowledgements of suspends are sent by the training thread itself
(`Job.report_suspend`), before the job exits, through `send`, which holds
a lock and a bounded timeout: an exit never waits long on a daemon that is
gone. When the socket goes away (a daemon restart) the thread reconnects
with backoff. Nothing here raises into the training loop: a broken channel
leaves the job with signal-driven suspends only, and says so once on stderr.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Final, cast

from gpuq.control import (
    CONTROL_VERSION,
    MAX_CONTROL_BYTES,
    Ack,
    CheckpointRequest,
    Hello,
    Message,
    Metrics,
    ResizeRequest,
    ResumeRequest,
    SuspendRequest,
    Welcome,
    parse_message,
    to_dict,
)
from gpuq.errors import GpuqError, ProtocolError
from gpuq.wire import decode, encode

if TYPE_CHECKING:
    from gpuq.runner.job import Job, SuspendMode

IO_TIMEOUT: Final = 2.0
"""Seconds one connect, hello or send may take before the channel counts as broken."""
RECONNECT_FIRST: Final = 0.05
RECONNECT_MAX: Final = 1.0
"""Backoff between reconnection attempts: doubling from the first to the max."""
FIRST_SAMPLE_POLL: Final = 0.2
"""How often a new connection looks for its first sample, until there is one."""
MODEL_POLL: Final = 0.05
"""How often the thread looks for a newly fitted model to send at once."""


class ControlClient:
    """A daemon thread talking to gpuq over the job's control socket."""

    def __init__(self, job: Job, path: str, features: tuple[str, ...]) -> None:
        self.job = job
        self.path = path
        self.features = features
        self.connections = 0
        """How many times the daemon welcomed this runner (1 + reconnections)."""
        self._sock: socket.socket | None = None
        self._opening: socket.socket | None = None  # connected, not yet welcomed
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False

    @property
    def connected(self) -> bool:
        """True while a welcomed connection to the daemon is open."""
        return self._sock is not None

    def start(self) -> None:
        """Start the background thread (a daemon thread: it never holds up an exit)."""
        self._thread = threading.Thread(target=self._run, name="gpuq-control", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Close the channel and wait up to `timeout` seconds for the thread to end."""
        self._stopping.set()
        with self._send_lock:
            for sock in (self._sock, self._opening):
                if sock is not None:
                    _shutdown(sock)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def send(self, message: Message) -> bool:
        """Send one message now; False (never an exception) if the channel is down."""
        with self._send_lock:
            sock = self._sock
            if sock is None:
                return False
            try:
                sock.sendall(encode(to_dict(message)))
            except OSError as exc:
                _shutdown(sock)  # the reader sees the end and reconnects
                self._warn(exc)
                return False
        return True

    # -- the thread ---------------------------------------------------------

    def _run(self) -> None:
        delay = RECONNECT_FIRST
        while not self._stopping.is_set():
            welcomed = self.connections
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with self._send_lock:
                self._opening = sock
            try:
                self._session(sock)
            except (OSError, GpuqError, ValueError) as exc:
                if not self._stopping.is_set():
                    self._warn(exc)
            finally:
                with self._send_lock:
                    self._sock = self._opening = None
                sock.close()
            if self.connections > welcomed:
                delay = RECONNECT_FIRST  # it worked for a while: try again quickly
            self._stopping.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX)

    def _session(self, sock: socket.socket) -> None:
        """One connection: hello, welcome, then samples out and requests in."""
        sock.settimeout(IO_TIMEOUT)
        sock.connect(self.path)
        job = self.job
        hello = Hello(CONTROL_VERSION, job.job_id or 0, job.attempt, os.getpid(), self.features)
        sock.sendall(encode(to_dict(hello)))
        reader = _LineReader(sock)
        welcome = parse_message(decode(reader.line(IO_TIMEOUT, self._stopping)))
        if not isinstance(welcome, Welcome):
            raise ProtocolError(f"expected welcome, got {type(welcome).__name__}")
        with self._send_lock:
            if self._stopping.is_set():
                return
            self._sock = sock
        self.connections += 1
        next_sample = time.monotonic()
        while not self._stopping.is_set():
            now = time.monotonic()
            metrics = job.metrics
            if now >= next_sample or (metrics is not None and metrics.model_changed.is_set()):
                if metrics is not None:
                    metrics.model_changed.clear()
                next_sample = now + self._send_sample(welcome.metrics_interval)
            wait = min(next_sample - time.monotonic(), MODEL_POLL)
            line = reader.line(max(0.01, wait), self._stopping)
            if line:
                self._apply(line)

    def _send_sample(self, interval: float) -> float:
        """Send a sample if there is one; returns the seconds until the next try."""
        metrics = self.job.metrics
        sample = None if metrics is None else metrics.sample()
        if sample is None:
            return FIRST_SAMPLE_POLL if metrics is not None else interval
        self.send(Metrics(sample))
        return interval

    def _apply(self, line: bytes) -> None:
        """Act on one message from the daemon; one it cannot parse is reported and skipped."""
        try:
            message = parse_message(decode(line))
        except ProtocolError as exc:
            _say(f"skipped a control message: {exc.message}")
            return
        job = self.job
        match message:
            case SuspendRequest(mode=mode):
                self._suspend(mode)
            case ResumeRequest():
                job.withdraw_daemon_request()
                job.resume()
            case CheckpointRequest():
                job.request_checkpoint()
            case ResizeRequest(gpus=gpus):
                self._suspend("checkpoint", request="resize", gpus=gpus)
            case _:
                _say(f"skipped an unexpected {type(message).__name__} from the daemon")

    def _suspend(self, mode: str, request: str = "suspend", **detail: object) -> None:
        """Pass a suspend on to the boundary, or refuse it at once with the reason."""
        job = self.job
        if mode == "park" and job.is_parked and not job.resume_pending:
            self.send(Ack(request, True, {"mode": "park", "step": job.step, "parked": True}))
            return
        if job.state is None:
            error = "the script has no gpuq.runner.State to save"
            self.send(Ack(request, False, {"mode": mode, "error": error, **detail}))
            return
        try:
            job.request_suspend_for_daemon(cast("SuspendMode", mode))
        except GpuqError as exc:
            self.send(Ack(request, False, {"mode": mode, "error": exc.message, **detail}))
            return
        if request != "suspend":
            self.send(Ack(request, True, {"mode": mode, **detail}))

    def _warn(self, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            _say(
                f"control channel to gpuq unavailable ({exc}); suspends by signal still work, "
                "reconnecting in the background"
            )


class _LineReader:
    """Newline-delimited messages from a socket, bounded by `MAX_CONTROL_BYTES`."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def line(self, timeout: float, stopping: threading.Event) -> bytes:
        """The next line, or b"" if none came within `timeout`; raises when the peer closed."""
        if b"\n" not in self.buffer:
            self.sock.settimeout(timeout)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                return b""
            if not chunk:
                if stopping.is_set():
                    return b""
                raise ConnectionError("the daemon closed the control channel")
            self.buffer += chunk
        line, newline, rest = self.buffer.partition(b"\n")
        if not newline:
            if len(self.buffer) > MAX_CONTROL_BYTES:
                raise ProtocolError("control message too long")
            return b""
        self.buffer = rest
        return line


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return


def _say(message: str) -> None:
    print(f"gpuq.runner: {message}", file=sys.stderr, flush=True)
