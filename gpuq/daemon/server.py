"""gpuqd's lifecycle: startup, main loop, shutdown.

Startup takes the single-instance lock, refuses a live socket and removes a
stale one, opens the store, samples the GPUs, recovers jobs (before serving
anyone; re-adopted jobs get their control sockets back), and binds the
socket with restrictive permissions. The main loop
runs the scheduler and the GPU monitor. Shutdown stops serving, closes the
per-job control sockets and leaves every job running under its shim, to be
re-adopted by the next daemon.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import logging
import math
import os
import signal
import socket
import stat
import time
from pathlib import Path
from typing import Any

from gpuq import env as job_env
from gpuq import statelock
from gpuq.config import Config
from gpuq.daemon import lifecycle, monitor, recovery, remotes, statedir, suspend, timings
from gpuq.daemon.connection import serve_connection
from gpuq.daemon.control import CONTROL_DIR, ControlHub, report_interval
from gpuq.daemon.executor import Executor, lab_owner
from gpuq.daemon.hosted import Hosted
from gpuq.daemon.node.local import LocalNode
from gpuq.daemon.outputs import LogLimit, Outputs
from gpuq.daemon.scheduler import memory, tick
from gpuq.daemon.spawner import SpawnerClient
from gpuq.daemon.state import DaemonState
from gpuq.daemon.store import Store
from gpuq.errors import DaemonUnavailable, GpuqError, StateError
from gpuq.gpus import make_backend
from gpuq.gpus.fake import FakeBackend
from gpuq.paths import (
    check_log_dir,
    ensure_dir,
    ensure_private_dir,
    filesystem_type,
    is_network_filesystem,
    require_socket_or_nothing,
)
from gpuq.policies.registry import get_policy
from gpuq.protocol import MAX_REQUEST_BYTES

log = logging.getLogger("gpuq.daemon")

SOCKET_NAME = "gpuq.sock"
LOCK_NAME = statelock.LOCK_NAME
MAX_PASS_BACKOFF = 0.25
HOUSEKEEPING_SECONDS = 1.0
DAEMON_LOG_MAX_BYTES = 64 * 1024**2
"""The most the daemon's log grows to, months of jobs or a flood of errors alike."""
SHUTDOWN_GRACE_SECONDS = 1.0
AUDIT_PRUNE_SECONDS = 3600.0
FAKE_GPU_DIR = "fake-gpus"
"""Where, below the runtime directory, fake GPUs publish their load (`gpuq.gpus.fakeload`)."""
"""How long a shutdown waits for requests in progress to be answered before it cancels them."""


def socket_path(config: Config) -> Path:
    """Where the daemon of this configuration listens (a lab daemon: `[lab] socket`)."""
    return config.lab.socket if config.lab.enabled else config.daemon.runtime_dir / SOCKET_NAME


def open_lab_dirs(config: Config) -> None:
    """Let users reach, by name only (0711), what is theirs below the daemon's directories.

    Their jobs create output files in `<log_dir>/users/<uid>`, write
    checkpoints in `<state_dir>/jobs/<id>/checkpoints` and reach their
    control sockets in `<runtime_dir>/ctl`; every file the daemon itself
    makes there stays 0600 (the umask). The socket's directory is 0755.
    """
    cfg = config.daemon
    for directory in (cfg.state_dir, cfg.runtime_dir, cfg.log_dir):
        os.chmod(directory, 0o711)
    prepare_lab_socket_dir(socket_path(config).parent)


def prepare_lab_socket_dir(directory: Path) -> None:
    """Make the lab socket's directory: ours, mode 0755, writable by no one else.

    Everyone must reach the socket, and nobody but the daemon's user may
    replace it; an existing directory of someone else's, or a link, is refused.
    """
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    info = directory.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise StateError(
            f"{directory} is not a directory of the daemon's user: refusing to put the lab "
            "socket in it",
            "remove it, or set [lab] socket to a path in a directory of root's",
        )
    os.chmod(directory, 0o755)


def check_state_dir(config: Config) -> None:
    """Refuse a state directory on a network filesystem (SQLite WAL is unsafe there)."""
    fstype = filesystem_type(config.daemon.state_dir)
    if fstype and is_network_filesystem(fstype) and not config.daemon.allow_network_fs:
        raise StateError(
            f"the state directory {config.daemon.state_dir} is on {fstype}, "
            "a network filesystem where SQLite's WAL is unsafe",
            "set [daemon] state_dir to a local disk (or allow_network_fs = true at your own risk)",
        )


def remove_stale_socket(path: Path) -> None:
    """Remove a socket no daemon answers on; refuse a live one, or anything else at `path`."""
    if not require_socket_or_nothing(path, "start the daemon again"):
        return
    if socket_is_live(path):
        raise DaemonUnavailable(
            f"another daemon is already serving {path}", "gpuq daemon status shows it"
        )
    log.info("removing stale socket %s", path)
    path.unlink()


def socket_is_live(path: Path) -> bool:
    """True if something accepts connections on the socket at `path`."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise
    finally:
        probe.close()
    return True


class Server:
    """One gpuqd: `await startup()`, `await main_loop()`, `await shutdown()`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state: DaemonState | None = None
        self._server: asyncio.AbstractServer | None = None
        self._lock_fd: int | None = None
        self._state_lock_fd: int | None = None
        self._bound = False  # only a daemon that bound the socket may remove it
        self._tasks: list[asyncio.Task[None]] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._store: Store | None = None
        self._spawner: SpawnerClient | None = None
        self._reported: set[str] = set()

    async def startup(self) -> None:
        """Prepare everything and start serving; raises GpuqError on failure."""
        cfg = self.config.daemon
        lab = self.config.lab.enabled
        if lab:  # what the daemon makes is root's alone unless opened up on purpose below
            os.umask(0o077)
        for directory in (cfg.state_dir, cfg.runtime_dir):
            ensure_private_dir(directory)
        ensure_dir(cfg.log_dir)
        check_log_dir(cfg.log_dir)
        if lab:
            open_lab_dirs(self.config)
        check_state_dir(self.config)
        self._take_lock()
        path = socket_path(self.config)
        remove_stale_socket(path)
        jobs_dir = cfg.state_dir / "jobs"
        database = cfg.state_dir / "gpuq.db"
        store = Store.open(database, statedir.id_floor(cfg.runtime_dir, jobs_dir), time.time())
        if lab:  # the database holds every job's environment: root's eyes only
            for name in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
                with contextlib.suppress(FileNotFoundError):
                    os.chmod(name, 0o600)
        self._store = store
        backend = make_backend(self.config.gpus)
        self._spawner = SpawnerClient()
        try:
            self._spawner.start()
        except OSError as exc:
            log.warning("%s; starting each shim as a new process instead (slower)", exc)
            self._spawner = None
        device_env = {}
        if isinstance(backend, FakeBackend):  # jobs emulating a GPU's work read its load
            backend.publish_to(cfg.runtime_dir / FAKE_GPU_DIR)
            device_env[job_env.FAKE_GPU_DIR] = str(cfg.runtime_dir / FAKE_GPU_DIR)
        node = LocalNode(
            cfg.node_name,
            Executor(jobs_dir, self._spawner),
            backend,
            ControlHub(cfg.runtime_dir / CONTROL_DIR, self._report_interval),
            device_env,
        )
        state = DaemonState(self.config, store, node, get_policy(self.config.scheduler.policy))
        if lab:
            node.control.owner_of = lambda job_id: job_owner(state, job_id)
        state.state_dir_watch = statedir.StateDirWatch(cfg.state_dir, database)
        state.hosted = Hosted(
            cfg.state_dir / "hosted",
            cfg.log_dir / "hosted",
            self._spawner,
            cfg.runtime_dir / "ctl-hosted",
            self._report_interval,
            lambda: state.config.lab.service_account,
        )
        self.state = state
        if self._spawner is not None:
            self._spawner.attach(asyncio.get_running_loop())
        node.control.listener = suspend.ChannelListener(state)
        state.load()
        memory.restore(state)
        memory.restore_turns(state)
        memory.restore_packs(state)
        remotes.follow(state)  # before recovery, which hands them their jobs
        await monitor.sample_once(state)
        counts = recovery.recover(state)
        log.info("recovered jobs: %s", counts)
        if hosted := state.hosted.recover(asyncio.get_running_loop()):
            log.info("recovered %d attempt(s) run for other servers", hosted)

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            self._connections.add(task)
            try:
                await serve_connection(state, reader, writer)
            finally:
                self._connections.discard(task)

        old_umask = os.umask(0o177)
        try:
            self._server = await asyncio.start_unix_server(
                on_connect, path=str(path), limit=MAX_REQUEST_BYTES
            )
            self._bound = True
        finally:
            os.umask(old_umask)
        if lab:  # every local user may connect; who they are comes from the kernel
            os.chmod(path, 0o666)
        elif cfg.socket_mode != 0o600:
            os.chmod(path, cfg.socket_mode)
        if self._lock_fd is not None:  # a command finding no socket now knows it was removed
            with contextlib.suppress(OSError):
                os.pwrite(self._lock_fd, f"{os.getpid()} {statelock.LISTENING}\n".encode(), 0)
        log.info("gpuqd %d listening on %s (%s GPUs)", os.getpid(), path, backend.kind)

    def _report_interval(self) -> float:
        """How often runners report, for the configuration running now (reloads included)."""
        config = self.config if self.state is None else self.state.config
        return report_interval(config.scheduler.interval)

    def _take_lock(self) -> None:
        """Lock the runtime directory, then the state directory (`gpuq.statelock`)."""
        lock_path = self.config.daemon.runtime_dir / LOCK_NAME
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DaemonUnavailable(
                f"another gpuq daemon is running (pid {holder}) for {lock_path.parent}",
                "gpuq daemon status shows it; gpuq daemon stop stops it",
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        self._state_lock_fd = statelock.take(
            self.config.daemon.state_dir, self.config.daemon.runtime_dir, socket_path(self.config)
        )

    async def main_loop(self) -> None:
        """Schedule, sample and watch the loop's lag until asked to exit."""
        state = self.state
        assert state is not None
        self._tasks = [
            asyncio.create_task(monitor.run_monitor(state)),
            asyncio.create_task(self._schedule_forever(state)),
            asyncio.create_task(self._housekeeping(state)),
            asyncio.create_task(timings.watch_loop(state.loop_lag, state.should_exit)),
            asyncio.create_task(remotes.run(state)),
        ]
        await state.should_exit.wait()

    async def _schedule_forever(self, state: DaemonState) -> None:
        frozen = False
        while not state.should_exit.is_set():
            state.wake.clear()
            started = time.perf_counter()
            try:
                starts = await tick.schedule_pass(state)
            except Exception:  # a bad pass must not end scheduling for good
                log.exception("scheduler pass failed; retrying after a pause")
                await asyncio.sleep(MAX_PASS_BACKOFF)
                continue
            if not frozen:  # what the policy imported lives as long as the daemon
                timings.freeze_heap()
                frozen = True
            if starts:
                log.info(
                    "started %d job(s) in %.1f ms",
                    len(starts),
                    (time.perf_counter() - started) * 1000,
                )
            # Keep the scheduler's share of the loop bounded: after a pass of d
            # seconds, serve requests for at least 2d before the next one, so a
            # burst of submissions against a long queue is coalesced.
            elapsed = time.perf_counter() - started
            await asyncio.sleep(min(2 * elapsed, MAX_PASS_BACKOFF))
            timeout = state.config.scheduler.interval
            if state.next_begin is not None:
                timeout = max(0.05, min(timeout, state.next_begin - time.time()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.wake.wait(), timeout=timeout)

    async def _housekeeping(self, state: DaemonState) -> None:
        """Every second: look at the state directory, record outcomes a full disk held back.

        A lab daemon also drops audit entries older than `[lab] audit_keep`,
        hourly. The daemon's own log (its stderr, where that is a file) is
        kept under `DAEMON_LOG_MAX_BYTES` as job logs are under theirs: its
        start and its latest part, with a marker between.
        """
        pruned = 0.0
        own_log = LogLimit(Outputs(2, 2), DAEMON_LOG_MAX_BYTES, "the daemon's own limit")
        while not state.should_exit.is_set():
            own_log.check()
            if state.config.lab.enabled and time.monotonic() - pruned > AUDIT_PRUNE_SECONDS:
                pruned = time.monotonic()
                with contextlib.suppress(Exception):
                    state.store.prune_audit(time.time() - state.config.lab.audit_keep)
            if not state.check_state_dir() and "state_dir" not in self._reported:
                self._reported.add("state_dir")
                log.error("%s", state.problems["state_dir"])
            if state.unrecorded:
                lifecycle.record_pending(state)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.should_exit.wait(), timeout=HOUSEKEEPING_SECONDS)

    async def shutdown(self) -> None:
        """Stop serving; jobs keep running and will be re-adopted."""
        if self.state is not None:
            left = sum(1 for job in self.state.active.values() if job.state.is_active)
            log.info(
                "gpuqd %d stopping on %s: %d job(s) keep running under their shims",
                os.getpid(),
                self.state.stop_reason or "its loop ended",
                left,
            )
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        if self._connections:  # a request being answered (a shutdown's own) gets its reply out
            await asyncio.wait(self._connections, timeout=SHUTDOWN_GRACE_SECONDS)
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._connections, return_exceptions=True)
        if self.state is not None:
            self.state.node.unwatch_all()
            self.state.hosted.unwatch_all(asyncio.get_running_loop())
            for remote in self.state.remotes.values():
                remote.unwatch_all()
                remote.close()
            self.state.node.close()
        if self._spawner is not None:
            self._spawner.close()
        if self._store is not None:
            self._store.close()
        if self._bound:
            with contextlib.suppress(FileNotFoundError):
                socket_path(self.config).unlink()
        for fd in (self._state_lock_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)


def job_owner(state: DaemonState, job_id: int) -> int | None:
    """The uid a lab job runs as, for its control socket (None: the daemon's own)."""
    job = state.active.get(job_id)
    return None if job is None else lab_owner(job.spec.uid)


def _reload_on_hangup(state: DaemonState) -> None:
    """SIGHUP: reload the config file, as `gpuq daemon reload` does."""
    try:
        result = state.reload_config()
    except GpuqError as exc:
        log.error("config not reloaded: %s (%s)", exc.message, exc.hint)  # noqa: TRY400
        return
    log.info(
        "config reloaded: applied %s; restart needed for %s",
        result["applied"],
        result["restart_needed"],
    )


class QuietAccept:
    """The loop's exception handler: asyncio's "out of system resource" on accept, rate-limited.

    With its descriptors used up, asyncio logs a traceback for each refused
    accept, many times a second (hundreds of megabytes of log a minute);
    this logs one line a minute saying how many there were, and leaves
    every other error to asyncio's default handler.
    """

    def __init__(self, every: float = 60.0) -> None:
        self.every = every
        self.suppressed = 0
        self.last = -math.inf

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """Handle one exception the loop reports."""
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        self.suppressed += 1
        now = time.monotonic()
        if now - self.last < self.every:
            return
        error = context.get("exception")
        why = getattr(error, "strerror", None) or str(error)
        log.error(
            "cannot accept connections: %s (%d time(s) since the last report); "
            "raise the open-file limit, or see who holds connections (ss -xp)",
            why,
            self.suppressed,
        )
        self.last, self.suppressed = now, 0


def _stop_on_signal(state: DaemonState, signum: int) -> None:
    state.stop_reason = state.stop_reason or signal.Signals(signum).name
    state.should_exit.set()


async def serve(config: Config) -> None:
    """Run a daemon until SIGTERM/SIGINT or a shutdown request."""
    server = Server(config)
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(QuietAccept())
    try:
        await server.startup()
        assert server.state is not None
        state = server.state
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, _stop_on_signal, state, signum)
        loop.add_signal_handler(signal.SIGHUP, _reload_on_hangup, state)
        try:
            await server.main_loop()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(signum)
    finally:
        await server.shutdown()
