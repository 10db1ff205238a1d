"""The spawner: a small process that forks one shim per job attempt.

Starting a Python interpreter for each shim costs tens of milliseconds of
CPU, which caps how many short jobs a server turns over per second and, done
on the daemon's event loop, stalls every client meanwhile. The daemon
therefore starts this process once (`SpawnerClient.start`); it imports the
shim's modules, freezes its heap, and forks a ready shim for each request.

The two talk over a SOCK_SEQPACKET socket pair, one message per request:

- request: the job directory (UTF-8), with the job's locked lock file
  descriptor attached (SCM_RIGHTS);
- reply, in request order: `{"pid": N}` with a pidfd of the new shim
  attached, or `{"error": "..."}`.

The lock travels with the request, so while a request is in flight the lock
stays held: recovery never mistakes a shim about to start for a missing one.
The spawner reaps the shims it forked. It runs in a session of its own, and
each shim in a process group of its own within that session, so the shims
share one scheduling group (autogroup) at a low weight instead of weighing
one session each (`shim.defer_to_the_daemon`); a shim lives on if the
spawner or the daemon goes away. The spawner exits
when the daemon closes its end, after serving the requests already sent.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Final

from gpuq.daemon import shim

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("gpuq.daemon")

MAX_MESSAGE: Final = 64 * 1024
REPLIES_PER_CALLBACK = 4
"""Spawner replies handled per event-loop callback (each commits a transition)."""
MAX_IN_FLIGHT: Final = 16
"""Requests sent and not yet answered; more wait in the daemon (fds in flight are limited)."""


@dataclass(frozen=True, slots=True)
class Spawned:
    """The answer to one spawn request: the shim's pid and pidfd, or why there is none."""

    pid: int | None
    pidfd: int | None
    error: str = ""


# -- the spawner process ------------------------------------------------------


def _reap(signum: int, frame: FrameType | None) -> None:
    """Collect every shim that has ended, so none stays a zombie."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _fork_shim(sock: socket.socket, job_dir: str, lock_fd: int) -> tuple[int, int]:
    """Fork a shim for `job_dir` holding `lock_fd`; returns its pid and pidfd (in the parent).

    SIGCHLD is blocked from the fork until the pidfd is open: a shim whose
    job ends at once must not be reaped before then, or the pidfd could not
    be opened and the daemon would run a job that already ran a second time.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        raise
    if pid:
        try:
            return pid, os.pidfd_open(pid)  # at worst a zombie: not reaped while blocked
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    code = 70
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sock.close()
        os.setpgid(0, 0)
        gc.enable()
        code = shim.run(Path(job_dir), lock_fd)
    except BaseException as exc:  # noqa: BLE001 - a forked child must never return
        with contextlib.suppress(OSError):
            print(f"gpuq shim {job_dir}: {exc!r}", file=sys.stderr)
    finally:
        os._exit(code)


def serve(sock: socket.socket) -> None:
    """Answer spawn requests until the daemon closes its end."""
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    shim.defer_to_the_daemon()
    gc.freeze()  # keep the shared heap untouched by forked shims' collections
    gc.disable()
    sock.send(b'{"ready": true}')
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 1)
        except OSError:
            return
        if not message:
            for fd in fds:
                os.close(fd)
            return
        reply: dict[str, object]
        pidfd = None
        try:
            if len(fds) == 1:
                pid, pidfd = _fork_shim(sock, message.decode(), fds[0])
                reply = {"pid": pid}
            else:
                reply = {"error": f"expected one lock descriptor, got {len(fds)}"}
        except OSError as exc:
            reply = {"error": f"cannot start the job's shim: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            socket.send_fds(sock, [json.dumps(reply).encode()], [] if pidfd is None else [pidfd])
        except OSError:
            return
        finally:
            if pidfd is not None:
                os.close(pidfd)


def main(argv: list[str]) -> int:
    """Entry point: `python -m gpuq.daemon.spawner FD`."""
    sock = socket.socket(fileno=int(argv[0]))
    serve(sock)
    return 0


# -- the daemon's side --------------------------------------------------------

OnSpawned = Callable[[Spawned], None]


class SpawnerClient:
    """The daemon's handle on its spawner: send requests, get replies on the event loop.

    `spawn` never blocks: requests beyond `MAX_IN_FLIGHT` wait in a queue,
    and each reply reaches its callback from the event loop's reader. If
    the spawner dies, every unanswered request gets an error `Spawned` and
    the next request starts a new spawner.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: collections.deque[tuple[str, int, OnSpawned]] = collections.deque()
        self._in_flight: collections.deque[OnSpawned] = collections.deque()

    def start(self) -> None:
        """Start the spawner process and wait until it is ready (blocking, at startup)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(  # noqa: S603
                [sys.executable, "-m", "gpuq.daemon.spawner", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        finally:
            theirs.close()
        ours.settimeout(30)
        try:
            ready = ours.recv(MAX_MESSAGE)
        except OSError as exc:
            ours.close()
            raise OSError(f"the shim spawner did not start: {exc}") from exc
        if not ready:
            ours.close()
            raise OSError("the shim spawner exited as it started (see the daemon log)")
        ours.setblocking(False)
        self._sock = ours

    @property
    def running(self) -> bool:
        """True while a spawner process is connected."""
        return self._sock is not None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver replies on `loop` (call once the event loop runs)."""
        assert self._sock is not None
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._on_readable)

    def spawn(self, job_dir: Path, lock_fd: int, on_spawned: OnSpawned) -> None:
        """Ask for a shim for `job_dir`; `lock_fd` is taken over (closed once sent)."""
        self._waiting.append((str(job_dir), lock_fd, on_spawned))
        self._pump()

    def _pump(self) -> None:
        """Send waiting requests while fewer than MAX_IN_FLIGHT are unanswered."""
        while self._waiting and len(self._in_flight) < MAX_IN_FLIGHT:
            if self._sock is None:
                self._restart()
                if self._sock is None:
                    return
            job_dir, lock_fd, on_spawned = self._waiting[0]
            try:
                socket.send_fds(self._sock, [job_dir.encode()], [lock_fd])
            except BlockingIOError:
                return  # the reader pumps again after the next reply
            except OSError as exc:
                log.warning("the shim spawner is gone (%s); starting another", exc)
                self._lost()
                continue
            self._waiting.popleft()
            os.close(lock_fd)
            self._in_flight.append(on_spawned)

    def _on_readable(self) -> None:
        """Handle a few replies, so one callback never holds the loop for long.

        The loop calls again at once while replies are waiting.
        """
        assert self._sock is not None
        for _ in range(REPLIES_PER_CALLBACK):
            if not self._in_flight:
                break
            try:
                message, fds, _flags, _addr = socket.recv_fds(self._sock, MAX_MESSAGE, 1)
            except BlockingIOError:
                break
            except OSError:
                message, fds = b"", []
            if not message:
                log.warning("the shim spawner exited; starting another for the next job")
                self._lost()
                break
            reply = json.loads(message)
            on_spawned = self._in_flight.popleft()
            if "pid" in reply and fds:
                on_spawned(Spawned(int(reply["pid"]), fds[0]))
            else:
                for fd in fds:
                    os.close(fd)
                on_spawned(Spawned(None, None, str(reply.get("error", "no reply"))))
        self._pump()

    def _lost(self) -> None:
        """The spawner is gone: fail what it had not answered, and drop the connection."""
        self._disconnect()
        pending, self._in_flight = self._in_flight, collections.deque()
        for on_spawned in pending:
            on_spawned(Spawned(None, None, "the shim spawner exited before it answered"))

    def _restart(self) -> None:
        try:
            self.start()
        except OSError as exc:
            log.warning("cannot start a shim spawner: %s", exc)
            waiting, self._waiting = self._waiting, collections.deque()
            for _job_dir, lock_fd, on_spawned in waiting:
                os.close(lock_fd)
                on_spawned(Spawned(None, None, f"cannot start the shim spawner: {exc}"))
            return
        if self._loop is not None:
            self.attach(self._loop)

    def _disconnect(self) -> None:
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=5)
            self._proc = None

    def close(self) -> None:
        """Let the spawner exit (it finishes the requests already sent); shims live on."""
        waiting, self._waiting = self._waiting, collections.deque()
        for _job_dir, lock_fd, _on_spawned in waiting:
            os.close(lock_fd)
        self._disconnect()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
