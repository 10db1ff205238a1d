"""The per-job supervisor: `python -m gpuq.daemon.shim JOB_DIR LOCK_FD`.

The daemon starts one shim per job in a new session, handing it the job's
lock file descriptor already locked (flock). The shim holds that lock for its
whole life, so "the lock is held" means "a shim is running this job", even
across daemon crashes: the daemon never has to guess.

The shim reads `launch.json`, starts the command in its own process group
with its output redirected, enforces the time limit (with the optional
early signal), and when the command ends kills whatever is left of its
process group and writes `exit.json` atomically. It imports only the
standard library and `gpuq.daemon.jobfiles` so it starts fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from gpuq.daemon import jobfiles


def _open_output(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def supervise(job_dir: Path) -> dict[str, Any]:
    """Run the job described in `job_dir` to completion; returns exit.json."""
    launch = jobfiles.read_json(job_dir / jobfiles.LAUNCH)
    if launch is None:
        return {"returncode": None, "error": "launch.json is missing or unreadable"}
    try:
        out_fd = _open_output(launch["stdout"])
        err_fd = out_fd if launch["stderr"] == launch["stdout"] else _open_output(launch["stderr"])
    except OSError as exc:
        return {"returncode": None, "error": f"cannot open the job's output file: {exc}"}
    try:
        child = subprocess.Popen(  # noqa: S603 - running the user's command is the point
            launch["command"],
            cwd=launch["cwd"],
            env=launch["env"],
            stdin=subprocess.DEVNULL,
            stdout=out_fd,
            stderr=err_fd,
            start_new_session=True,
        )
    except OSError as exc:
        return {"returncode": None, "error": f"cannot start {launch['command'][0]!r}: {exc}"}
    finally:
        os.close(out_fd)
        if err_fd != out_fd:
            os.close(err_fd)
    jobfiles.write_json(
        job_dir / jobfiles.CHILD,
        {"pid": child.pid, "pgid": child.pid, "starttime": jobfiles.process_start_time(child.pid)},
    )

    def forward(signum: int, frame: FrameType | None) -> None:
        _signal_group(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    reason = _wait(child, launch)
    _signal_group(child.pid, signal.SIGKILL)  # leftovers of the job's process group
    returncode = child.returncode
    result: dict[str, Any] = {"returncode": returncode, "end_time": time.time(), "reason": reason}
    if returncode is not None and returncode < 0:
        result["signal"] = signal.Signals(-returncode).name
    return result


def _wait(child: subprocess.Popen[bytes], launch: dict[str, Any]) -> str:
    """Wait for the child, enforcing the time limit; returns the end reason."""
    limit = launch.get("time_limit")
    if limit is None:
        child.wait()
        return ""
    start = time.monotonic()
    early = launch.get("signal")
    grace = float(launch.get("kill_grace", 10.0))
    if early is not None:
        sig, seconds = int(early[0]), float(early[1])
        if _wait_until(child, start + max(0.0, limit - seconds)):
            return ""
        _signal_group(child.pid, sig)
    if _wait_until(child, start + limit):
        return ""
    _signal_group(child.pid, signal.SIGTERM)
    if not _wait_until(child, time.monotonic() + grace):
        _signal_group(child.pid, signal.SIGKILL)
        child.wait()
    return f"time limit of {limit:g}s reached"


def _wait_until(child: subprocess.Popen[bytes], deadline: float) -> bool:
    """True if the child ended before the monotonic `deadline`."""
    try:
        child.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def main(argv: list[str]) -> int:
    """Entry point; the exit status of the job itself is in exit.json."""
    job_dir, lock_fd = Path(argv[0]), int(argv[1])
    os.set_inheritable(lock_fd, False)  # the job itself must not hold the lock
    jobfiles.write_json(
        job_dir / jobfiles.SHIM,
        {
            "pid": os.getpid(),
            "starttime": jobfiles.process_start_time(os.getpid()),
            "boot_id": jobfiles.boot_id(),
        },
    )
    result = supervise(job_dir)
    jobfiles.write_json(job_dir / jobfiles.EXIT, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
