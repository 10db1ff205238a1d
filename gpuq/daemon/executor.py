"""Starting, signalling, watching and re-adopting job shims, and finding what they leave.

A job runs as: spawner (own session) -> shim (own process group in the
spawner's session, child subreaper, holds the job lock) -> command (its own
session and process group) -> its descendants. The daemon asks
its spawner for each shim without blocking (`launch`), and watches each shim
through a pidfd, so shims it did not start itself (re-adopted after a
restart) are watched the same way. Signals go to the whole job: its process
group and every descendant of its shim (`signal`). When a shim is gone
without a word, `kill_leftovers` finds what is left of its attempt by
process group and environment, verified by start time and boot id.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq.daemon import jobfiles, proctree
from gpuq.daemon.identity import Account
from gpuq.daemon.spawner import Spawned, SpawnerClient

log = logging.getLogger("gpuq.daemon")

EXIT_BUDGET_SECONDS = 0.005
"""Longest stretch spent recording ended jobs before the event loop serves others."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job's shim ended: the command's status or why there is none.

    `start_failed`: the command could not be executed (or its output not
    opened): a failure of the job, not a loss. `time_limit`: the shim
    ended the job at its time limit, whatever the command's exit status.
    """

    returncode: int | None
    signal: str | None
    reason: str
    end_time: float | None
    start_failed: bool = False
    time_limit: bool = False
    lost_with: str | None = None
    """The server whose loss ended the attempt (it went down): a job may run again elsewhere."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for a head that learns how its attempt ended on another server."""
        return {
            "returncode": self.returncode,
            "signal": self.signal,
            "reason": self.reason,
            "end_time": self.end_time,
            "start_failed": self.start_failed,
            "time_limit": self.time_limit,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        """Decode `to_dict` (from another daemon: types are checked, not trusted)."""
        rc, sig, end = data.get("returncode"), data.get("signal"), data.get("end_time")
        return cls(
            rc if isinstance(rc, int) and not isinstance(rc, bool) else None,
            sig if isinstance(sig, str) else None,
            str(data.get("reason") or ""),
            float(end) if isinstance(end, int | float) and not isinstance(end, bool) else None,
            start_failed=data.get("start_failed") is True,
            time_limit=data.get("time_limit") is True,
        )

    @property
    def exit_code(self) -> int | None:
        """Shell-style exit code: 128 + signal number for a killed job."""
        if self.returncode is None:
            return None
        return self.returncode if self.returncode >= 0 else 128 - self.returncode


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything the shim needs to run one attempt of a job.

    `create_below` maps an output path to the directory below which its
    missing directories may be created; `max_log_bytes` caps each output
    file (None: no cap). `run_as`: the account the job runs as, for a
    daemon running as root (lab mode; None: the daemon's own user), see
    `run_as_for`.
    """

    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    stdout: str
    stderr: str
    time_limit: float | None
    signal: tuple[int, float] | None
    kill_grace: float
    create_below: Mapping[str, str] = field(default_factory=dict)
    max_log_bytes: int | None = None
    run_as: Account | None = None

    def to_dict(self) -> dict[str, Any]:
        """The launch record the shim reads, also how a head sends it to another server."""
        return {
            "command": list(self.command),
            "cwd": self.cwd,
            "env": dict(self.env),
            "stdout": self.stdout,
            "stderr": self.stderr,
            "create_below": dict(self.create_below),
            "max_log_bytes": self.max_log_bytes,
            "time_limit": self.time_limit,
            "signal": None if self.signal is None else list(self.signal),
            "kill_grace": self.kill_grace,
            "run_as": None if self.run_as is None else self.run_as.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LaunchSpec:
        """Decode `to_dict` from another daemon; ValueError names the first bad field."""

        def strings(name: str) -> dict[str, str]:
            value = data.get(name) or {}
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise ValueError(f"{name} must map strings to strings")
            return dict(value)

        def number(name: str, *, optional: bool) -> float | None:
            value = data.get(name)
            if value is None and optional:
                return None
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative number")
            return float(value)

        command = data.get("command")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) for a in command)
        ):
            raise ValueError("command must be a non-empty list of strings")
        for name in ("cwd", "stdout", "stderr"):
            if not isinstance(data.get(name), str) or not data[name].startswith("/"):
                raise ValueError(f"{name} must be an absolute path")
        sig = data.get("signal")
        if sig is not None and (
            not isinstance(sig, list)
            or len(sig) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in sig)
        ):
            raise ValueError("signal must be [signal number, seconds] or null")
        max_bytes = data.get("max_log_bytes")
        if max_bytes is not None and (
            not isinstance(max_bytes, int) or isinstance(max_bytes, bool)
        ):
            raise ValueError("max_log_bytes must be an integer or null")
        kill_grace = number("kill_grace", optional=False)
        assert kill_grace is not None
        run_as = data.get("run_as")
        if run_as is not None and (
            not isinstance(run_as, dict) or not isinstance(run_as.get("groups", []), list)
        ):
            raise ValueError("run_as must be an account object (uid, gid, groups, name, home)")
        return cls(
            command=tuple(command),
            cwd=data["cwd"],
            env=strings("env"),
            stdout=data["stdout"],
            stderr=data["stderr"],
            time_limit=number("time_limit", optional=True),
            signal=None if sig is None else (int(sig[0]), float(sig[1])),
            kill_grace=kill_grace,
            create_below=strings("create_below"),
            max_log_bytes=max_bytes,
            run_as=None if run_as is None else Account.from_dict(run_as),
        )


def run_as_for(uid: int | None) -> Account | None:
    """The account a job owned by `uid` runs as: its owner's, when the daemon is root.

    Only a daemon running as root can (and in lab mode must) run a job as
    another user; a job of root's, one without an owner (from before lab
    mode) and every job of a personal daemon run as the daemon's own user
    (None). Raises `identity.UnknownAccount` for a uid the system does not
    know.
    """
    owner = lab_owner(uid)
    return None if owner is None else Account.of_uid(owner)


def lab_owner(uid: int | None) -> int | None:
    """`uid` when a job it owns runs as that user rather than the daemon's (`run_as_for`)."""
    return uid if uid is not None and uid != 0 and os.geteuid() == 0 else None


OnSpawned = Callable[[Spawned], None]


class Executor:
    """Process mechanics for jobs whose directories live under `jobs_dir`."""

    def __init__(self, jobs_dir: Path, spawner: SpawnerClient | None = None) -> None:
        self.jobs_dir = jobs_dir
        self.spawner = spawner
        self.checkpoint_reader: int | None = None
        """A group that may also read run-as-owner jobs' checkpoints (`share_checkpoints`)."""
        self._watched: dict[int, int] = {}  # job id -> pidfd
        self._ended: collections.deque[tuple[int, Callable[[int, Outcome], None]]] = (
            collections.deque()
        )
        self._draining = False

    def job_dir(self, job_id: int) -> Path:
        """The job's directory (created on first use)."""
        path = self.jobs_dir / str(job_id)
        path.mkdir(parents=True, exist_ok=True)
        (path / jobfiles.CHECKPOINTS).mkdir(exist_ok=True)
        return path

    def launch(self, job_id: int, spec: LaunchSpec, on_spawned: OnSpawned) -> None:
        """Start the shim for one attempt of a job; `on_spawned` gets its pid and pidfd.

        The lock is taken here and handed over with the request, so there
        is no moment in which the job runs, or may be about to, without its
        lock held. Raises OSError if the job's files cannot be written (a
        full disk) and RuntimeError if a shim still holds the lock.
        """
        job_dir = self.job_dir(job_id)
        if spec.run_as is not None:
            jobfiles.share_checkpoints(
                self.jobs_dir, job_dir, spec.run_as.uid, spec.run_as.gid, self.checkpoint_reader
            )
        for stale in (jobfiles.EXIT, jobfiles.CHILD, jobfiles.SHIM):
            (job_dir / stale).unlink(missing_ok=True)
        jobfiles.write_json(job_dir / jobfiles.LAUNCH, spec.to_dict())
        jobfiles.reserve(job_dir)
        lock_fd = jobfiles.try_lock(job_dir / jobfiles.LOCK)
        if lock_fd is None:
            raise RuntimeError(f"job {job_id} is already running (its lock is held)")
        if self.spawner is not None:
            self.spawner.spawn(job_dir, lock_fd, on_spawned)
            return
        try:
            spawned = self._spawn_directly(job_dir, lock_fd)
        finally:
            os.close(lock_fd)
        asyncio.get_running_loop().call_soon(on_spawned, spawned)

    def _spawn_directly(self, job_dir: Path, lock_fd: int) -> Spawned:
        """The slow path without a spawner: a new interpreter per shim."""
        shim = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "gpuq.daemon.shim", str(job_dir), str(lock_fd)],
            pass_fds=(lock_fd,),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
        )
        return Spawned(shim.pid, os.pidfd_open(shim.pid))

    def watch(
        self,
        loop: asyncio.AbstractEventLoop,
        job_id: int,
        pid: int,
        on_exit: Callable[[int, Outcome], None],
        pidfd: int | None = None,
    ) -> None:
        """Call `on_exit(job_id, outcome)` when the shim `pid` (or `pidfd`) ends."""
        if pidfd is None:
            try:
                pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                loop.call_soon(on_exit, job_id, self.outcome(job_id))
                return
        fd = pidfd
        self._watched[job_id] = fd

        def ready() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            self._watched.pop(job_id, None)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reap a shim of our own; the spawner reaps its own
            self._ended.append((job_id, on_exit))
            if not self._draining:
                self._draining = True
                loop.call_soon(self._drain_ended, loop)

        loop.add_reader(fd, ready)

    def _drain_ended(self, loop: asyncio.AbstractEventLoop) -> None:
        """Handle ended shims for at most `EXIT_BUDGET_SECONDS`, then let others have the loop.

        Hundreds of jobs may end at once; each is read and recorded here, and
        the rest wait for the loop's next turn, behind the clients' requests.
        """
        deadline = time.perf_counter() + EXIT_BUDGET_SECONDS
        while self._ended and time.perf_counter() < deadline:
            job_id, on_exit = self._ended.popleft()
            try:
                on_exit(job_id, self.outcome(job_id))
            except Exception:
                log.exception("job %s: recording how it ended failed", job_id)
        if self._ended:
            loop.call_soon(self._drain_ended, loop)
        else:
            self._draining = False

    def unwatch_all(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop watching every shim (daemon shutdown; the jobs run on)."""
        for fd in self._watched.values():
            loop.remove_reader(fd)
            os.close(fd)
        self._watched.clear()

    def outcome(self, job_id: int) -> Outcome:
        """Read how the job ended; a shim that died without a word is reported."""
        data = jobfiles.read_json(self.jobs_dir / str(job_id) / jobfiles.EXIT)
        if data is None:
            survivors = self.kill_leftovers(job_id)
            reason = "the job's supervisor (shim) died unexpectedly"
            if survivors:
                reason += f"; processes {survivors} of the job could not be killed"
            return Outcome(None, None, reason, None)
        reason = str(data.get("error") or data.get("reason") or "")
        rc = data.get("returncode")
        return Outcome(
            rc if isinstance(rc, int) else None,
            data.get("signal"),
            reason,
            data.get("end_time"),
            start_failed=bool(data.get("start_failed")),
            time_limit=bool(data.get("time_limit")),
        )

    def live_shim(self, job_id: int, settle: float = 10.0) -> int | None:
        """The pid of the job's running shim, if one holds the job's lock.

        A shim (or the spawner, with the request in flight) holds the lock
        from before it starts, so a held lock with no record yet is a shim
        still starting up: wait up to `settle` seconds for its record rather
        than mistake it for a dead one.
        """
        job_dir = self.jobs_dir / str(job_id)
        deadline = time.monotonic() + settle
        while jobfiles.is_locked(job_dir / jobfiles.LOCK):
            record = jobfiles.read_json(job_dir / jobfiles.SHIM)
            if record is not None and jobfiles.is_same_process(record):
                return int(record["pid"])
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id}: its lock is held but its shim never reported")
            time.sleep(0.01)
        return None

    def has_exit_record(self, job_id: int) -> bool:
        """True if the shim recorded how the job ended."""
        return (self.jobs_dir / str(job_id) / jobfiles.EXIT).exists()

    def has_shim_record(self, job_id: int) -> bool:
        """True if a shim ever started for the job's current attempt."""
        return (self.jobs_dir / str(job_id) / jobfiles.SHIM).exists()

    def signal(self, job_id: int, signum: int) -> bool:
        """Send `signum` to the whole job: its process group and every descendant of its shim.

        False if the job's command has not started yet or is gone. Without
        a readable record of the command (torn, or tampered with), its
        shim's descendants are the job.
        """
        child = self._record(job_id, jobfiles.CHILD)
        if child is None:
            shim = self._record(job_id, jobfiles.SHIM)
            if shim is None:
                return False
            job = proctree.descendants(int(shim["pid"]), proctree.table())
            return proctree.send(job, signum) > 0
        pgid = int(child["pgid"])
        try:
            os.killpg(pgid, signum)
            reached = True
        except ProcessLookupError:
            reached = False
        shim = self._record(job_id, jobfiles.SHIM)
        if shim is not None:
            procs = proctree.table()
            others = proctree.outside_group(
                proctree.descendants(int(shim["pid"]), procs), pgid, procs
            )
            reached = proctree.send(others, signum) > 0 or reached
        return reached

    def kill_leftovers(self, job_id: int, timeout: float = 10.0) -> list[int]:
        """Kill every process left of the job's attempt whose shim is gone; returns survivors.

        A shim that still holds the job's lock but whose record cannot be
        read (`live_shim` gave up on it) is killed too, with the job.

        Found by the attempt's process group and by its environment
        (`proctree.attempt_members`), only among processes of this boot that
        started no earlier than the attempt's shim, so a reused pid is
        never hit.
        """
        job_dir = self.jobs_dir / str(job_id)
        shim = jobfiles.read_json(job_dir / jobfiles.SHIM)
        if shim is None and jobfiles.is_locked(job_dir / jobfiles.LOCK):
            return self._kill_unreported(job_id, timeout)  # a shim lives, its record unreadable
        launch = jobfiles.read_json(job_dir / jobfiles.LAUNCH)
        if shim is None or launch is None or shim.get("boot_id") != jobfiles.boot_id():
            return []  # no attempt ever ran, or it ran before a reboot
        not_before = int(shim.get("starttime") or 0)
        attempt = int(str(launch.get("env", {}).get("GPUQ_ATTEMPT", "0")))
        child = jobfiles.read_json(job_dir / jobfiles.CHILD)

        def find() -> list[int]:
            procs = proctree.table()
            members = set(proctree.attempt_members(str(job_dir), attempt, not_before, procs))
            if child is not None and isinstance(child.get("pgid"), int):
                since = int(child.get("starttime") or not_before)
                members.update(
                    p.pid
                    for p in procs.values()
                    if p.pgid == child["pgid"] and p.alive and p.starttime >= since
                )
            return sorted(members)

        return proctree.kill_until_gone(find, timeout)

    def _kill_unreported(self, job_id: int, timeout: float) -> list[int]:
        """Kill the shim that holds the job's lock without a readable record, and its job.

        Its record torn or tampered with, such a shim cannot be re-adopted;
        left alive, its job would go on on GPUs handed to the next one.
        Found by the lock it holds, its process tree, and the attempt's
        environment. Returns the pids still found at the timeout.
        """
        job_dir = self.jobs_dir / str(job_id)
        attempt = jobfiles.launch_attempt(jobfiles.read_json(job_dir / jobfiles.LAUNCH))

        def find() -> list[int]:
            procs = proctree.table()
            members = set(proctree.holding(job_dir / jobfiles.LOCK, procs))
            for shim in list(members):
                members.update(proctree.descendants(shim, procs))
            if attempt is not None:  # a job dir is never reused, so no other process has it
                members.update(proctree.attempt_members(str(job_dir), attempt, 0, procs))
            return sorted(members)

        return proctree.kill_until_gone(find, timeout)

    def _record(self, job_id: int, name: str) -> dict[str, Any] | None:
        """The shim's or the child's record, if that process still lives."""
        record = jobfiles.read_json(self.jobs_dir / str(job_id) / name)
        return record if jobfiles.is_same_process(record) else None
