"""Every process a job starts ends with the job, and a job ends in the state it earned.

A descendant that leaves the job's session and process group (`setsid`)
is still the job's: cancel, the time limit and the end of the job kill it,
and a stop-mode suspend stops it. A job killed at its time limit failed,
whatever its exit status; a command that cannot be executed failed, with
the OS's reason. A shim's own bookkeeping weighs less on the CPU than the
daemon; the job it runs weighs as usual.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.daemon import jobfiles, proctree
from gpuq.daemon import shim as shim_module
from tests.daemon_harness import DaemonHarness, wait_for
from tests.daemon_harness import submit_cli as submit

ENDED = ("succeeded", "failed", "cancelled", "lost")


def escaped(daemon: DaemonHarness, job_id: int) -> dict[int, proctree.Proc]:
    """Live processes of the job (found by its environment) that left its process group."""
    procs = proctree.table()
    members = proctree.attempt_members(
        str(daemon.state_dir / "jobs" / str(job_id)), daemon.job(job_id)["attempts"], 0, procs
    )
    return {pid: procs[pid] for pid in members if procs[pid].sid == pid}


def wait_escaped(daemon: DaemonHarness, job_id: int) -> dict[int, proctree.Proc]:
    return dict(wait_for(lambda: escaped(daemon, job_id), what="the job's setsid child to start"))


def gone(pids: dict[int, proctree.Proc]) -> bool:
    return all(
        (now := proctree.read_proc(pid)) is None
        or not now.alive
        or now.starttime != before.starttime
        for pid, before in pids.items()
    )


SETSID_SLEEPER = "setsid sleep 601 & sleep 600"


def test_cancel_kills_a_descendant_that_left_the_session(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", SETSID_SLEEPER)
    left = wait_escaped(daemon, job_id)
    cancelled = daemon.cli("cancel", str(job_id))
    assert cancelled.stdout == f"job {job_id}: cancel requested\n"
    daemon.wait_state(job_id, "cancelled")
    wait_for(lambda: gone(left), what="the setsid sleep to be killed")


def test_the_time_limit_kills_a_descendant_that_left_the_session(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--time", "3s", "--", "sh", "-c", SETSID_SLEEPER)
    left = wait_escaped(daemon, job_id)
    job = daemon.wait_state(job_id, *ENDED, timeout=60)
    assert (job["state"], job["reason"]) == ("failed", "time limit of 3s reached")
    wait_for(lambda: gone(left), what="the setsid sleep to be killed")


def test_a_job_that_ends_takes_its_descendants_with_it(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", "setsid sleep 601 & sleep 2")
    left = wait_escaped(daemon, job_id)
    assert daemon.wait_state(job_id, *ENDED)["state"] == "succeeded"
    wait_for(lambda: gone(left), what="the setsid sleep to be killed")


def test_a_stop_mode_suspend_stops_a_descendant_that_left_the_group(
    daemon: DaemonHarness,
) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", SETSID_SLEEPER)
    left = wait_escaped(daemon, job_id)
    daemon.call("suspend", ids=[job_id], mode="stop")
    daemon.wait_state(job_id, "suspended")

    def states() -> set[str]:
        return {p.state for pid in left if (p := proctree.read_proc(pid)) is not None}

    wait_for(lambda: states() == {"T"}, what="the setsid sleep to be stopped")
    daemon.call("resume", ids=[job_id])
    daemon.wait_state(job_id, "running")
    wait_for(lambda: "T" not in states(), what="the setsid sleep to continue")
    daemon.call("cancel", ids=[job_id])
    daemon.wait_state(job_id, "cancelled")
    wait_for(lambda: gone(left), what="the setsid sleep to be killed")


def test_a_job_killed_at_its_time_limit_failed_even_if_it_exits_0(daemon: DaemonHarness) -> None:
    trapping = "trap 'exit 0' TERM; while true; do sleep 0.1; done"
    job_id = submit(daemon, "--gpus", "0", "--time", "2s", "--", "sh", "-c", trapping)
    after = submit(daemon, "--gpus", "0", "--after", f"{job_id}:ok", "--", "true")
    job = daemon.wait_state(job_id, *ENDED, timeout=60)
    assert (job["state"], job["reason"], job["exit_code"]) == (
        "failed",
        "time limit of 2s reached",
        0,
    )
    dependent = daemon.wait_state(after, *ENDED)
    assert dependent["state"] == "cancelled"
    assert f"job {job_id} failed" in dependent["reason"]


def test_a_time_limit_failure_is_retried_like_any_failure(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--time", "1s", "--retries", "1", "--", "sleep", "30")
    job = daemon.wait_state(job_id, *ENDED, timeout=60)
    assert (job["state"], job["attempts"]) == ("failed", 2)


def failed_to_start(daemon: DaemonHarness, *command: str) -> dict[str, object]:
    job_id = daemon.submit(list(command), gpus=0)
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed", job
    assert job["exit_code"] is None
    return job


def test_a_file_that_is_not_a_program_fails_with_the_os_error(daemon: DaemonHarness) -> None:
    script = daemon.root / "not-a-program"
    script.write_bytes(b"\x7fELF this is not really a program\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    job = failed_to_start(daemon, str(script))
    assert "Exec format error" in str(job["reason"])
    assert "errno 8" in str(job["reason"])


def test_a_missing_interpreter_fails_and_says_so(daemon: DaemonHarness) -> None:
    script = daemon.root / "run.sh"
    script.write_text("#!/no/such/interpreter\necho hi\n")
    script.chmod(0o755)
    job = failed_to_start(daemon, str(script))
    assert "No such file or directory" in str(job["reason"])
    assert "its interpreter '/no/such/interpreter' (the #! line) was not found" in str(
        job["reason"]
    )


def test_a_script_with_windows_line_endings_fails_and_says_so(daemon: DaemonHarness) -> None:
    script = daemon.root / "run.sh"
    script.write_bytes(b"#!/bin/sh\r\necho hi\r\n")
    script.chmod(0o755)
    job = failed_to_start(daemon, str(script))
    assert "its #! line ends with a carriage return (Windows line endings)" in str(job["reason"])
    assert "dos2unix" in str(job["reason"])


def test_arguments_too_large_for_the_os_fail_the_job(daemon: DaemonHarness) -> None:
    # One argument over the kernel's per-string limit (MAX_ARG_STRLEN, 128 KiB).
    job = failed_to_start(daemon, "echo", "x" * 200_000)
    assert "Argument list too long" in str(job["reason"])


def test_a_working_directory_removed_before_the_start_fails_the_job(
    daemon: DaemonHarness,
) -> None:
    workdir = daemon.root / "gone"
    workdir.mkdir()
    blocker = daemon.submit(["sleep", "30"], gpus=2)
    job_id = daemon.submit(["true"], gpus=1, cwd=str(workdir))
    workdir.rmdir()
    daemon.call("cancel", ids=[blocker])
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed"
    assert "no longer exists" in job["reason"]


def shim_of(daemon: DaemonHarness, job_id: int) -> proctree.Proc:
    """The live shim process of a running job."""
    path = daemon.state_dir / "jobs" / str(job_id) / jobfiles.SHIM

    def live() -> proctree.Proc | None:
        record = jobfiles.read_json(path)
        return None if record is None else proctree.read_proc(int(record["pid"]))

    found: proctree.Proc = wait_for(live, what=f"the shim of job {job_id}")
    return found


def test_the_shims_are_forked_by_one_spawner_not_started_as_interpreters(
    daemon: DaemonHarness,
) -> None:
    ids = [daemon.submit(["sleep", "30"], gpus=0) for _ in range(3)]
    for job_id in ids:
        daemon.wait_state(job_id, "running")
    parents = {shim_of(daemon, job_id).ppid for job_id in ids}
    daemon.call("cancel", ids=ids)
    assert len(parents) == 1
    (spawner,) = parents
    assert daemon.process is not None and spawner != daemon.process.pid
    assert b"gpuq.daemon.spawner" in Path(f"/proc/{spawner}/cmdline").read_bytes()


def autogroup_nice(pid: int) -> int | None:
    """The nice value of `pid`'s autogroup (None where the kernel has no autogroups)."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def test_a_shim_yields_the_cpu_to_the_daemon_but_its_job_does_not(
    daemon: DaemonHarness,
) -> None:
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not enabled.exists() or enabled.read_text().strip() != "1":
        pytest.skip("this kernel does not group sessions for the CPU (autogroups)")
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "600")
    job_dir = daemon.state_dir / "jobs" / str(job_id)
    child = wait_for(lambda: jobfiles.read_json(job_dir / jobfiles.CHILD), what="the job")
    shim = jobfiles.read_json(job_dir / jobfiles.SHIM)
    assert shim is not None
    assert autogroup_nice(int(shim["pid"])) == shim_module.SHIM_AUTOGROUP_NICE
    assert autogroup_nice(int(child["pid"])) == 0
    daemon.cli("cancel", str(job_id))


def autogroup_of(pid: int) -> str:
    """The name of `pid`'s CPU group (`/autogroup-N`), shared by every process of a session."""
    return Path(f"/proc/{pid}/autogroup").read_text().split()[0]


def test_all_shims_weigh_as_one_group_so_a_burst_of_jobs_cannot_outweigh_the_daemon(
    daemon: DaemonHarness,
) -> None:
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not enabled.exists() or enabled.read_text().strip() != "1":
        pytest.skip("this kernel does not group sessions for the CPU (autogroups)")
    ids = [daemon.submit(["sleep", "600"], gpus=0) for _ in range(3)]
    shims = [shim_of(daemon, job_id) for job_id in ids]
    assert daemon.process is not None
    try:
        assert len({shim.sid for shim in shims}) == 1  # one session: the spawner's
        assert all(shim.pgid == shim.pid for shim in shims)  # each signalled on its own
        assert len({autogroup_of(shim.pid) for shim in shims}) == 1
        assert autogroup_of(shims[0].pid) != autogroup_of(daemon.process.pid)
    finally:
        daemon.call("cancel", ids=ids)


def test_the_holder_of_a_lock_is_found_by_its_descriptors_among_group_leaders(
    tmp_path: Path,
) -> None:
    """A job's lock names no holder (the daemon that took it gave it away): its fds do."""
    lock = tmp_path / "lock"
    lock.touch()
    hold = f"import time; f = open({str(lock)!r}); print(flush=True); time.sleep(60)"
    leader = subprocess.Popen(
        [sys.executable, "-c", hold], start_new_session=True, stdout=subprocess.PIPE
    )
    follower = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE)
    try:
        for proc in (leader, follower):
            assert proc.stdout is not None and proc.stdout.readline() == b"\n"
        assert proctree.holding(lock, proctree.table()) == [leader.pid]  # a spawner leads none
        assert proctree.holding(tmp_path / "other", proctree.table()) == []
    finally:
        for proc in (leader, follower):
            proc.kill()
            proc.communicate()
