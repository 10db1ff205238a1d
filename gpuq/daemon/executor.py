"""Starting, signalling, watching and re-adopting job shims.

A job runs as: daemon -> shim (new session, holds the job lock) -> command
(its own process group). The daemon watches each shim through a pidfd, so
shims it did not start itself (re-adopted after a restart) are watched the
same way as its own children.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq.daemon import jobfiles


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job's shim ended: the command's status or why there is none."""

    returncode: int | None
    signal: str | None
    reason: str
    end_time: float | None

    @property
    def exit_code(self) -> int | None:
        """Shell-style exit code: 128 + signal number for a killed job."""
        if self.returncode is None:
            return None
        return self.returncode if self.returncode >= 0 else 128 - self.returncode


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything the shim needs to run one attempt of a job."""

    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str]
    stdout: str
    stderr: str
    time_limit: float | None
    signal: tuple[int, float] | None
    kill_grace: float


class Executor:
    """Process mechanics for jobs whose directories live under `jobs_dir`."""

    def __init__(self, jobs_dir: Path) -> None:
        self.jobs_dir = jobs_dir
        self._watched: dict[int, int] = {}  # job id -> pidfd

    def job_dir(self, job_id: int) -> Path:
        """The job's directory (created on first use)."""
        path = self.jobs_dir / str(job_id)
        path.mkdir(parents=True, exist_ok=True)
        (path / jobfiles.CHECKPOINTS).mkdir(exist_ok=True)
        return path

    def launch(self, job_id: int, spec: LaunchSpec) -> int:
        """Start the shim for one attempt of a job; returns the shim's pid.

        The lock is taken here and handed to the shim, so there is no moment
        in which the job runs without its lock being held.
        """
        job_dir = self.job_dir(job_id)
        for stale in (jobfiles.EXIT, jobfiles.CHILD, jobfiles.SHIM):
            (job_dir / stale).unlink(missing_ok=True)
        jobfiles.write_json(
            job_dir / jobfiles.LAUNCH,
            {
                "command": list(spec.command),
                "cwd": spec.cwd,
                "env": dict(spec.env),
                "stdout": spec.stdout,
                "stderr": spec.stderr,
                "time_limit": spec.time_limit,
                "signal": None if spec.signal is None else list(spec.signal),
                "kill_grace": spec.kill_grace,
            },
        )
        lock_fd = jobfiles.try_lock(job_dir / jobfiles.LOCK)
        if lock_fd is None:
            raise RuntimeError(f"job {job_id} is already running (its lock is held)")
        try:
            shim = subprocess.Popen(  # noqa: S603
                [sys.executable, "-m", "gpuq.daemon.shim", str(job_dir), str(lock_fd)],
                pass_fds=(lock_fd,),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
            )
        finally:
            os.close(lock_fd)
        return shim.pid

    def watch(
        self,
        loop: asyncio.AbstractEventLoop,
        job_id: int,
        pid: int,
        on_exit: Callable[[int, Outcome], None],
    ) -> None:
        """Call `on_exit(job_id, outcome)` when the shim `pid` ends."""
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            loop.call_soon(on_exit, job_id, self.outcome(job_id))
            return
        self._watched[job_id] = fd

        def ready() -> None:
            loop.remove_reader(fd)
            os.close(fd)
            self._watched.pop(job_id, None)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)  # reap our own child; adopted shims are not ours
            on_exit(job_id, self.outcome(job_id))

        loop.add_reader(fd, ready)

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
            self._kill_orphan(job_id)
            return Outcome(None, None, "the job's supervisor (shim) died unexpectedly", None)
        reason = str(data.get("error") or data.get("reason") or "")
        rc = data.get("returncode")
        return Outcome(
            rc if isinstance(rc, int) else None, data.get("signal"), reason, data.get("end_time")
        )

    def live_shim(self, job_id: int, settle: float = 10.0) -> int | None:
        """The pid of the job's running shim, if one holds the job's lock.

        A shim holds the lock from before it starts, so a held lock with no
        record yet is a shim still starting up: wait up to `settle` seconds
        for its record rather than mistake it for a dead one.
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
        """Send `signum` to the job's process group; False if it is gone."""
        child = self._child(job_id)
        if child is None:
            return False
        try:
            os.killpg(int(child["pgid"]), signum)
        except ProcessLookupError:
            return False
        return True

    def _child(self, job_id: int) -> dict[str, Any] | None:
        record = jobfiles.read_json(self.jobs_dir / str(job_id) / jobfiles.CHILD)
        return record if jobfiles.is_same_process(record) else None

    def _kill_orphan(self, job_id: int) -> None:
        """With its shim gone, nobody supervises the command: stop it."""
        self.signal(job_id, signal.SIGKILL)
