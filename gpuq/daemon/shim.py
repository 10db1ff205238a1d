"""The per-job supervisor: one shim per job attempt, holding the job's lock.

The daemon starts each shim through the spawner (`gpuq.daemon.spawner`, a
fork per job), or as `python -m gpuq.daemon.shim JOB_DIR LOCK_FD` when the
spawner is unavailable, in a new session, handing it the job's lock file
descriptor already locked (flock). The shim holds that lock for its whole
life, so "the lock is held" means "a shim is running this job", even across
daemon crashes: the daemon never has to guess.

The shim becomes a child subreaper, so every descendant of the job stays in
its process tree even after leaving the job's session and process group. It
reads `launch.json`, opens the output files without following symbolic links
(`outputs.open_output`), starts the command in its own process group,
enforces the time limit (with the optional early signal) and the log size
limit, and when the command ends kills whatever is left of the job's tree
and writes `exit.json` into the space the daemon reserved for it, retrying
while the disk is full. It imports only the standard library and
`gpuq.daemon` modules that do too, so it starts fast.

In lab mode the shim runs as root and the launch record names the job's
user (`run_as`). The shim then opens the output files and starts the
command at that user's effective ids (`user_ids`), so the kernel checks the
user's permissions on the output paths and the working directory, never
root's; the command itself gets the user's real, effective and saved ids
and groups, and therefore no capabilities. The shim returns to root's ids
for the rest of its work (its records, the limits, killing the job's tree).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, Final

from gpuq.daemon import jobfiles, proctree
from gpuq.daemon.identity import Account
from gpuq.daemon.outputs import LogLimit, OutputError, Outputs, open_outputs

PR_SET_CHILD_SUBREAPER: Final = 36
JOB_UMASK: Final = 0o022
"""A lab job's umask, a login's usual one (the lab daemon's own, 077, is not the user's)."""
MAX_REASON: Final = 2000
"""Longest reason text in exit.json (it must fit the reserved record)."""
EXIT_RETRY_MAX: Final = 5.0
"""Longest pause between two attempts to record the exit on a full disk."""


def become_subreaper() -> bool:
    """Make orphaned descendants of this process its children (Linux prctl)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def signal_tree(pgid: int, signum: int) -> None:
    """Send `signum` once to each process of the job: its group, then descendants outside it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)
    procs = proctree.table()
    proctree.send(
        proctree.outside_group(proctree.descendants(os.getpid(), procs), pgid, procs), signum
    )


SHIM_AUTOGROUP_NICE = 10
"""Nice value of a shim's session (autogroup); see `defer_to_the_daemon`."""


def describe_start_error(
    command: list[str], cwd: str, exc: OSError, run_as: Account | None = None
) -> str:
    """Why the command could not be executed, in the OS's words plus what it means."""
    program = command[0]
    what = exc.strerror or str(exc)
    if exc.errno == errno.ENOENT and exc.filename == cwd:
        return f"cannot start {program!r}: working directory {cwd!r} no longer exists"
    if exc.filename == cwd:
        text = f"cannot start {program!r}: cannot enter the working directory {cwd!r}: {what}"
        return text + ("" if run_as is None else f" ({_as_whom(run_as)})")
    text = f"cannot execute {program!r}: {what} (errno {exc.errno})"
    if exc.errno == errno.ENOENT and (
        os.path.exists(program) or os.path.exists(Path(cwd, program))
    ):
        text += "; the file exists, so " + _missing_interpreter(Path(cwd, program))
    elif exc.errno == errno.ENOEXEC:
        text += "; not a binary or a script with a #! line"
    elif exc.errno == errno.E2BIG:
        text += "; the arguments and environment are too large for the OS"
    return text


def _missing_interpreter(path: Path) -> str:
    """Why a script that exists could not be run: its `#!` line, read back."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(4096)
    except OSError:
        first = b""
    if not first.startswith(b"#!"):
        return "its interpreter (the #! line) was not found"
    line = first.rstrip(b"\n")
    if line.endswith(b"\r"):
        return (
            "its #! line ends with a carriage return (Windows line endings): "
            "convert the file with dos2unix"
        )
    interpreter = line[2:].split(maxsplit=1)[:1] or [b""]
    return (
        f"its interpreter {interpreter[0].decode(errors='replace')!r} (the #! line) was not found"
    )


def supervise(job_dir: Path) -> dict[str, Any]:
    """Run the job described in `job_dir` to completion; returns the exit record."""
    launch = jobfiles.read_json(job_dir / jobfiles.LAUNCH)
    if launch is None:
        return {"returncode": None, "error": "launch.json is missing or unreadable"}
    started = _start(launch)
    if isinstance(started, str):
        return {"returncode": None, "error": started, "start_failed": True}
    child, outputs = started
    jobfiles.write_json(
        job_dir / jobfiles.CHILD,
        {"pid": child.pid, "pgid": child.pid, "starttime": jobfiles.process_start_time(child.pid)},
    )

    def forward(signum: int, frame: FrameType | None) -> None:
        signal_tree(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    limit = LogLimit(outputs, launch.get("max_log_bytes"))
    try:
        reason, timed_out = _wait(child, launch, limit)
    finally:
        sweep(child.pid)
        limit.check()
        outputs.close()
    returncode = child.returncode
    result: dict[str, Any] = {"returncode": returncode, "end_time": time.time(), "reason": reason}
    if timed_out:
        result["time_limit"] = True
    if returncode is not None and returncode < 0:
        result["signal"] = signal.Signals(-returncode).name
    return result


def _start(launch: dict[str, Any]) -> tuple[subprocess.Popen[bytes], Outputs] | str:
    """Open the outputs and start the command, as the job's user; the child, or why not."""
    try:
        run_as = None if launch.get("run_as") is None else Account.from_dict(launch["run_as"])
    except ValueError as exc:
        return f"the launch record's account is invalid: {exc}"
    command = [str(arg) for arg in launch["command"]]
    env = dict(launch["env"])
    if run_as is not None:
        env.update({"HOME": run_as.home, "USER": run_as.name, "LOGNAME": run_as.name})
    try:
        with user_ids(run_as):
            try:
                outputs = open_outputs(launch)
            except OutputError as exc:
                return str(exc) + ("" if run_as is None else f" ({_as_whom(run_as)})")
            try:
                child = subprocess.Popen(  # noqa: S603 - running the user's command is the point
                    command,
                    cwd=launch["cwd"],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=outputs.stdout,
                    stderr=outputs.stderr,
                    start_new_session=True,
                    user=None if run_as is None else run_as.uid,
                    group=None if run_as is None else run_as.gid,
                    umask=-1 if run_as is None else JOB_UMASK,
                )
            except OSError as exc:
                outputs.close()
                return describe_start_error(command, launch["cwd"], exc, run_as)
    except PermissionError as exc:  # only taking on the user's ids raises it
        assert run_as is not None
        return f"cannot run the job {_as_whom(run_as)}: {exc.strerror} (the shim is not root)"
    return child, outputs


def _as_whom(account: Account) -> str:
    """`as user alice (uid 1001)`, for messages."""
    return f"as user {account.name} (uid {account.uid})"


@contextlib.contextmanager
def user_ids(account: Account | None) -> Iterator[None]:
    """Take on `account`'s groups and effective ids for the block, then return to ours.

    The groups go first and the user id last: changing groups and the group
    id needs root's powers, which an effective uid other than 0 no longer
    has. Real and saved ids stay root's, so the shim can take its own ids
    back (and no process of the user's may signal or trace it meanwhile); a
    child started in the block inherits the groups, and `Popen(user=,
    group=)` makes its every uid and gid the user's before it runs the
    command, which drops all capabilities. Nothing to do for None or for the
    user this process already is.
    """
    if account is None or (os.geteuid() == account.uid != 0 and os.getegid() == account.gid):
        yield
        return
    groups, gid, uid = os.getgroups(), os.getegid(), os.geteuid()
    os.setgroups(list(account.groups))
    try:
        os.setegid(account.gid)
        try:
            os.seteuid(account.uid)
            try:
                yield
            finally:
                os.seteuid(uid)
        finally:
            os.setegid(gid)
    finally:
        os.setgroups(groups)


def _wait(
    child: subprocess.Popen[bytes], launch: dict[str, Any], limit: LogLimit
) -> tuple[str, bool]:
    """Wait for the child, enforcing the time and log limits; returns (reason, timed out)."""
    seconds = launch.get("time_limit")
    start = time.monotonic()
    early = launch.get("signal")
    if seconds is not None and early is not None:
        sig, lead = int(early[0]), float(early[1])
        if _wait_until(child, start + max(0.0, seconds - lead), limit):
            return "", False
        signal_tree(child.pid, sig)
    if _wait_until(child, None if seconds is None else start + seconds, limit):
        return "", False
    assert seconds is not None
    signal_tree(child.pid, signal.SIGTERM)
    if not _wait_until(child, time.monotonic() + float(launch.get("kill_grace", 10.0)), limit):
        signal_tree(child.pid, signal.SIGKILL)
        child.wait()
    return f"time limit of {seconds:g}s reached", True


def _wait_until(child: subprocess.Popen[bytes], deadline: float | None, limit: LogLimit) -> bool:
    """True if the child ended before the monotonic `deadline` (None: no deadline)."""
    while True:
        timeout = limit.interval
        if deadline is not None:
            left = deadline - time.monotonic()
            timeout = left if timeout is None else min(timeout, left)
        try:
            child.wait(timeout=None if timeout is None else max(0.0, timeout))
        except subprocess.TimeoutExpired:
            limit.check()
            if deadline is not None and time.monotonic() >= deadline:
                return False
        else:
            return True


def _has_children() -> bool:
    """Whether the shim has any child, zombies included.

    The shim is a subreaper and has reaped the job's main process: whatever
    that left behind was reparented to the shim when it exited, so no child
    means no descendant at all.
    """
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def sweep(pgid: int) -> None:
    """Kill whatever is left of the job (its group, every descendant) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    if not _has_children():
        return  # the usual case: nothing left, so no scan of every process on the machine
    shim = os.getpid()
    proctree.kill_until_gone(lambda: proctree.descendants(shim, proctree.table()))
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)


def record_exit(job_dir: Path, result: dict[str, Any]) -> bool:
    """Write exit.json, retrying while the disk is full; False if the job directory is gone.

    The shim keeps the job's lock meanwhile, so the daemon sees a job whose
    end is not recorded yet, never a lost one.
    """
    for key in ("error", "reason"):
        if isinstance(result.get(key), str):
            result[key] = result[key][:MAX_REASON]
    pause = 0.1
    while True:
        try:
            jobfiles.write_json(job_dir / jobfiles.EXIT, result, durable=True)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            print(f"gpuq shim {job_dir}: cannot record the exit yet: {exc}", file=sys.stderr)
        time.sleep(pause)
        pause = min(EXIT_RETRY_MAX, pause * 2)


def defer_to_the_daemon() -> None:
    """Lower the CPU weight of the shim's own session, never the job's.

    With autogroups (Linux's default), each session shares the CPU as one
    group: hundreds of shims starting and ending at once would each weigh
    as much as the daemon, and `gpuq ls` would wait behind them. The job
    runs in a session of its own, at the usual weight.
    """
    with contextlib.suppress(OSError):
        Path("/proc/self/autogroup").write_text(f"{SHIM_AUTOGROUP_NICE}\n")


def run(job_dir: Path, lock_fd: int) -> int:
    """Supervise one attempt while holding `lock_fd`; returns the shim's exit status."""
    os.set_inheritable(lock_fd, False)  # the job itself must not hold the lock
    become_subreaper()
    try:
        jobfiles.write_json(
            job_dir / jobfiles.SHIM,
            {
                "pid": os.getpid(),
                "starttime": jobfiles.process_start_time(os.getpid()),
                "boot_id": jobfiles.boot_id(),
            },
        )
    except OSError as exc:
        record_exit(job_dir, {"returncode": None, "error": f"cannot record the shim: {exc}"})
        return 1
    result = supervise(job_dir)
    return 0 if record_exit(job_dir, result) else 1


def main(argv: list[str]) -> int:
    """Entry point of `python -m gpuq.daemon.shim JOB_DIR LOCK_FD` (the slow path)."""
    os.setsid() if os.getsid(0) != os.getpid() else None
    defer_to_the_daemon()
    return run(Path(argv[0]), int(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
