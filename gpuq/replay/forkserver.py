"""A fork server for trace jobs: their start-up costs a fork, not an import of torch.

    python -m gpuq.replay.forkserver SOCKET

A replay compresses time: at 60x, the seconds a Python process spends
importing numpy, scipy, torch and the runner (2-3 s of CPU, ten times that
of wall time on a busy machine) are minutes of simulated time, during which
a trace job can neither progress nor be suspended, where the simulator's
job pays its 30 s restart penalty and goes on. So a replay starts this
server first: it imports all that once, listens on SOCKET, and for each
trace job's launcher (`gpuq.replay.launcher`, the command the daemon runs)
forks a child that takes the launcher's standard streams, working
directory and environment (the daemon's GPUQ_* contract with them) and
runs `gpuq.replay.tracejob` in its own session, with the launcher's start
(read from /proc by the launcher's pid, which the socket gives) as the start
of its schedule.

Per connection the server answers `{"pid": N}` once the child runs, then
`{"exit": STATUS}` when it ends (its exit code, or 128 + N for signal N),
and the launcher exits with that. A child whose launcher dies (killed by
the daemon with the job's process group) kills itself: it watches the
launcher through a pidfd. On SIGTERM or SIGINT the server removes its
socket (launchers then run their job themselves) and exits once its last
child has ended, so jobs still running when a replay stops run to their
end. `ForkServer` starts one for the length of a `with` block.

The server has no threads when it forks; the child starts its own (the
watcher, the runner's control channel).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuq.errors import GpuqError

MAX_REQUEST_BYTES = 1 << 20
"""Largest launcher request (arguments and environment) the server reads."""
START_TIMEOUT = 120.0
"""Seconds `ForkServer` waits for the server to listen (its imports, on a busy machine)."""
POLL_SECONDS = 0.05
STOP_WAIT = 10.0
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""The signals that stop the server (module docstring)."""
"""Seconds a stopping `ForkServer` waits for a server without jobs to exit."""


def preload() -> None:
    """Import and load everything a trace job needs before its first step."""
    import scipy.optimize  # noqa: F401  (the model's fit)

    import gpuq.replay.tracejob  # noqa: F401
    import gpuq.runner.loop  # noqa: F401  (torch)
    import gpuq.runner.state  # noqa: F401
    from gpuq.sim.apps import APPLICATION_NAMES, get_application

    for name in APPLICATION_NAMES:
        get_application(name)


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One launcher's request line and the three file descriptors sent with it."""
    data = b""
    fds: list[int] = []
    size = struct.calcsize("i")
    while not data.endswith(b"\n"):
        chunk, ancillary, _flags, _address = conn.recvmsg(65536, socket.CMSG_SPACE(3 * size))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", payload[: len(payload) - len(payload) % size]))
        if not chunk:
            raise ConnectionError("launcher closed before its request ended")
        data += chunk
        if len(data) > MAX_REQUEST_BYTES:
            raise ConnectionError("request too large")
    if len(fds) != 3:
        raise ConnectionError(f"expected 3 file descriptors, got {len(fds)}")
    request: dict[str, Any] = json.loads(data)
    return request, fds


def _peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", creds)
    return int(pid)


def _watch_launcher(pid: int) -> None:
    """End this process when the launcher `pid` ends (a daemon thread)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(128 + signal.SIGKILL)

    def watch() -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(pidfd, selectors.EVENT_READ)
            selector.select()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="gpuq-trace-launcher-watch", daemon=True).start()


def _run_child(request: dict[str, Any], fds: list[int], launcher: int) -> int:
    """In the forked child: become the launcher's trace job; its exit code."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(str(request["cwd"]))
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    for signum in (*STOP_SIGNALS, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    _watch_launcher(launcher)
    from gpuq.replay import tracejob

    started = time.monotonic() - tracejob.process_age(launcher)  # the launcher's start
    argv = [*map(str, request["argv"]), "--started", repr(started)]
    try:
        tracejob.main(argv)
    except SystemExit as end:
        code = end.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


class _Server:
    """The accept loop, the children and their launchers' connections."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listening.bind(str(path))
        self.listening.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listening, selectors.EVENT_READ, "accept")
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, conn)
        self.stopping = False

    def stop(self, signum: int = 0, frame: object = None) -> None:
        """Stop accepting; exit once the last child has ended (module docstring)."""
        if not self.stopping:
            self.stopping = True
            self.selector.unregister(self.listening)
            self.listening.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def serve(self) -> None:
        """Run until stopped and every child has ended."""
        while not (self.stopping and not self.children):
            for key, _events in self.selector.select(timeout=POLL_SECONDS):
                if key.data == "accept":
                    self._accept()
                else:
                    self._reap(key.fd)

    def _accept(self) -> None:
        conn, _ = self.listening.accept()
        try:
            launcher = _peer_pid(conn)
            request, fds = _read_request(conn)
        except (OSError, ValueError) as exc:
            print(f"gpuq fork server: bad request: {exc}", file=sys.stderr, flush=True)
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        # The child must not run the server's handlers: signals wait until it has its own.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                self.selector.close()
                self.listening.close()
                for _, other in self.children.values():
                    other.close()
                conn.close()
                code = _run_child(request, fds, launcher)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        self.selector.register(pidfd, selectors.EVENT_READ, "child")
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"exit": code if code >= 0 else 128 - code}).encode() + b"\n")
        conn.close()


def serve(path: Path) -> None:
    """Preload, listen on `path`, and serve launchers until stopped (module docstring)."""
    preload()
    server = _Server(path)
    for signum in STOP_SIGNALS:
        signal.signal(signum, server.stop)
    print("ready", flush=True)
    server.serve()
    sys.stderr.flush()
    os._exit(0)  # at once: tearing down torch takes seconds on a busy machine, for nothing


class ForkServer(contextlib.AbstractContextManager["ForkServer"]):
    """A fork server process for the length of a `with` block (module docstring)."""

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._folder = Path(tempfile.mkdtemp(prefix="gq-fork-"))
        self.path = self._folder / "trace.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ForkServer:
        environ = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        process = subprocess.Popen(
            [self.python, "-m", "gpuq.replay.forkserver", str(self.path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=environ,
            start_new_session=True,
        )
        self.process = process
        assert process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout=max(0.0, deadline - time.monotonic()))
        line = process.stdout.readline() if ready else b""
        process.stdout.close()
        if line.strip() != b"ready":
            process.kill()
            process.wait()
            raise GpuqError(
                "the trace jobs' fork server did not start",
                hint=f"run {self.python} -m gpuq.replay.forkserver PATH to see why",
            )
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop it: jobs still running finish under it, new ones start on their own.

        Waits a moment for the server to exit when it has no job left; with
        jobs, `wait` waits for it.
        """
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.wait(STOP_WAIT)
        with contextlib.suppress(FileNotFoundError, OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self._folder.rmdir()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the server process to end; its status (None if it still runs)."""
        if self.process is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        return None


def launcher_command(python: str, socket_path: str, arguments: Sequence[str]) -> list[str]:
    """The command the daemon runs for a trace job with `arguments` through `socket_path`."""
    from gpuq.replay import launcher

    return [python, "-S", launcher.__file__, socket_path, *arguments]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m gpuq.replay.forkserver SOCKET`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.exit("usage: python -m gpuq.replay.forkserver SOCKET")
    serve(Path(args[0]))


if __name__ == "__main__":
    main()
