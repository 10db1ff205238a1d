"""SIGKILL the daemon mid-flight: no job lost, none run twice, no id reused.

Also: a job's shim killed while the daemon is down leaves nothing running
(recovery kills what is left before a GPU or a retry is handed out), and a
full state directory holds a job's exit back, GPUs and all, until it can be
recorded, across a restart too.

Every job appends "<id> <attempt>" to a shared runs file when it starts, then
exits with a code derived from its index, so the test can check that each job
ran exactly once and ended with its true exit code, whatever the daemon was
doing when it died.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon import jobfiles, lifecycle, proctree
from gpuq.daemon.faults import POINTS
from gpuq.daemon.store import Store
from gpuq.errors import DaemonUnavailable, ExitCode, StateError
from tests.daemon_harness import DaemonHarness, mounted_tmpfs, wait_for

FOUR_GPUS = '[[gpus.fake]]\nname = "Fake"\nmemory = "16G"\ncount = 4\n'
TERMINAL = {"succeeded", "failed", "cancelled", "lost"}


def job_spec(root: Path, index: int, sleep: float) -> dict[str, Any]:
    """A job that records its run, sleeps, and exits with index % 4."""
    runs = root / "runs"
    script = f'echo "$GPUQ_JOB_ID $GPUQ_ATTEMPT" >> {runs}; sleep {sleep}; exit {index % 4}'
    return {
        "command": ["sh", "-c", script],
        "cwd": str(root),
        "env": dict(os.environ),
        "name": f"job{index}",
    }


def submit_surviving_crashes(daemon: DaemonHarness, spec: dict[str, Any], token: str) -> int:
    """Submit with a token, retrying across daemon deaths until acknowledged."""
    while True:
        try:
            return int(daemon.call("submit", spec=spec, token=token)["ids"][0])
        except (DaemonUnavailable, OSError):
            time.sleep(0.02)


def all_jobs(daemon: DaemonHarness) -> list[dict[str, Any]]:
    return list(daemon.call("list", include_done=True)["jobs"])


def wait_all_done(daemon: DaemonHarness, count: int, timeout: float = 120) -> list[dict[str, Any]]:
    def done() -> list[dict[str, Any]] | None:
        jobs = all_jobs(daemon)
        return jobs if len(jobs) == count and all(j["state"] in TERMINAL for j in jobs) else None

    return list(wait_for(done, timeout=timeout, interval=0.2, what=f"{count} jobs to finish"))


def runs_per_job(root: Path) -> Counter[int]:
    path = root / "runs"
    lines = path.read_text().split("\n") if path.exists() else []
    return Counter(int(line.split()[0]) for line in lines if line.strip())


def check_invariants(daemon: DaemonHarness, jobs: list[dict[str, Any]], count: int) -> None:
    """Every job accounted for, ran once, ended with its true exit code; ids fresh."""
    ids = [j["id"] for j in jobs]
    assert ids == list(range(1, count + 1)), "every submitted job, each id once"
    runs = runs_per_job(daemon.root)
    for job in jobs:
        index = int(job["name"].removeprefix("job"))
        assert runs[job["id"]] == 1, f"job {job['id']} ran {runs[job['id']]} times"
        assert job["exit_code"] == index % 4, job
        assert job["state"] == ("succeeded" if index % 4 == 0 else "failed"), job
    new_id = daemon.submit(["true"], gpus=0)
    assert new_id == count + 1, "ids are never reused"


def test_kill_with_100_queued_and_4_running(tmp_path: Path) -> None:
    daemon = DaemonHarness(tmp_path, gpus_toml=FOUR_GPUS)
    try:
        daemon.start()
        sleeps = [2.0, 2.0, 8.0, 8.0] + [0.05] * 100  # 1-2 outlive the start of 3-4 under load
        for index, sleep in enumerate(sleeps):
            daemon.call("submit", spec=job_spec(tmp_path, index, sleep))
        wait_for(
            lambda: (
                sum(j["state"] == "running" for j in all_jobs(daemon)) == 4
                and all(daemon.job(i)["state"] == "running" for i in (1, 2, 3, 4))
            ),
            what="jobs 1-4 running",
        )
        assert sum(j["state"] == "queued" for j in all_jobs(daemon)) == 100

        daemon.kill()
        # Jobs 1 and 2 end while the daemon is down; 3 and 4 are still running at restart.
        exits = [tmp_path / "state" / "jobs" / str(i) / "exit.json" for i in (1, 2)]
        wait_for(lambda: all(p.exists() for p in exits), what="jobs 1-2 to end unobserved")
        assert not (tmp_path / "state" / "jobs" / "3" / "exit.json").exists()

        daemon.start()
        jobs = wait_all_done(daemon, 104)
        check_invariants(daemon, jobs, 104)
        for job_id in (3, 4):
            reasons = [e["reason"] for e in daemon.call("show", id=job_id)["events"]]
            assert "re-adopted after daemon restart" in reasons
    finally:
        daemon.close()


@pytest.mark.parametrize("point", POINTS)
def test_kill_at_each_crash_point(tmp_path: Path, point: str) -> None:
    daemon = DaemonHarness(tmp_path)
    try:
        first = daemon.start(extra_env={"GPUQ_CRASH_POINT": f"{point}:3"})

        def restart_after_crash() -> None:
            first.wait()
            daemon.start()  # without the crash point

        restarter = threading.Thread(target=restart_after_crash)
        restarter.start()
        count = 12
        for index in range(count):
            submit_surviving_crashes(daemon, job_spec(tmp_path, index, 0.2), token=f"t{index}")
        restarter.join(timeout=60)
        assert first.returncode is not None and first.returncode < 0, "it died at the crash point"
        jobs = wait_all_done(daemon, count)
        check_invariants(daemon, jobs, count)
    finally:
        daemon.close()


@pytest.mark.slow
def test_kill_at_random_moments(tmp_path: Path) -> None:
    daemon = DaemonHarness(tmp_path)
    chaos = random.Random(20261121)
    count = 40
    acknowledged: list[int] = []

    def submitter() -> None:
        for index in range(count):
            spec = job_spec(tmp_path, index, chaos.choice([0.0, 0.05, 0.3]))
            acknowledged.append(submit_surviving_crashes(daemon, spec, token=f"r{index}"))

    try:
        daemon.start()
        thread = threading.Thread(target=submitter)
        thread.start()
        for _ in range(6):
            # The kill moment is what is random here; nothing waits on a condition.
            time.sleep(chaos.uniform(0.05, 0.6))
            daemon.kill()
            daemon.start()
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert sorted(acknowledged) == list(range(1, count + 1))
        jobs = wait_all_done(daemon, count)
        check_invariants(daemon, jobs, count)
    finally:
        daemon.close()


# -- a shim killed while the daemon is down ------------------------------------------


def attempt_processes(daemon: DaemonHarness, job_id: int, attempt: int) -> list[int]:
    """Live processes of one attempt of a job, found by its environment."""
    job_dir = str(daemon.state_dir / "jobs" / str(job_id))
    return proctree.attempt_members(job_dir, attempt, 0, proctree.table())


def test_a_shim_killed_while_the_daemon_is_down_leaves_nothing_running(tmp_path: Path) -> None:
    daemon = DaemonHarness(tmp_path)  # two GPUs
    runs = tmp_path / "runs"
    try:
        daemon.start()
        record = f'echo "$GPUQ_JOB_ID $GPUQ_ATTEMPT" >> {runs}'
        first = daemon.submit(
            ["sh", "-c", f"{record}; setsid sleep 600 & sleep 600"], gpus=2, retries=1
        )
        waiting = daemon.submit(["sh", "-c", record], gpus=1)
        daemon.wait_state(first, "running")
        wait_for(lambda: len(attempt_processes(daemon, first, 1)) == 3, what="sh and two sleeps")
        left = attempt_processes(daemon, first, 1)
        shim = jobfiles.read_json(daemon.state_dir / "jobs" / str(first) / jobfiles.SHIM)
        assert shim is not None

        daemon.kill()
        os.kill(int(shim["pid"]), signal.SIGKILL)
        daemon.start()

        def started(job_id: int, attempt: int) -> bool:
            return f"{job_id} {attempt}" in runs.read_text().split("\n")

        wait_for(lambda: started(waiting, 1), what="the waiting job to get a GPU")
        assert not [pid for pid in left if (p := proctree.read_proc(pid)) and p.alive], (
            "the GPU was handed out while the lost attempt still ran"
        )
        wait_for(lambda: started(first, 2), timeout=60, what="the retry to start")
        assert attempt_processes(daemon, first, 1) == []
        assert len(attempt_processes(daemon, first, 2)) in (1, 2, 3)
        reasons = [e["reason"] for e in daemon.call("show", id=first)["events"]]
        assert any("shim ended while the daemon was down" in r for r in reasons), reasons
        daemon.call("cancel", ids=[first])
        daemon.wait_state(first, "cancelled")
    finally:
        daemon.close()


def test_a_live_shim_whose_record_is_unreadable_is_killed_with_its_job_before_its_gpus_go(
    tmp_path: Path,
) -> None:
    """A torn or tampered shim record: the job cannot be re-adopted, nor left to run."""
    daemon = DaemonHarness(tmp_path)  # two GPUs
    runs = tmp_path / "runs"
    try:
        daemon.start()
        record = f'echo "$GPUQ_JOB_ID $GPUQ_ATTEMPT" >> {runs}'
        holder = daemon.submit(["sh", "-c", f"{record}; setsid sleep 600 & sleep 600"], gpus=2)
        waiting = daemon.submit(["sh", "-c", record], gpus=2)
        daemon.wait_state(holder, "running")
        wait_for(lambda: len(attempt_processes(daemon, holder, 1)) == 3, what="sh and two sleeps")
        left = attempt_processes(daemon, holder, 1)
        shim_path = daemon.state_dir / "jobs" / str(holder) / jobfiles.SHIM
        shim = jobfiles.read_json(shim_path)
        assert shim is not None

        daemon.kill()
        shim_path.write_text("garbage")
        daemon.start()

        job = daemon.wait_state(holder, "lost", timeout=60)
        assert job["reason"] == (
            f"job {holder}: its lock is held but its shim never reported; its processes were killed"
        )
        assert not [
            p for p in [int(shim["pid"]), *left] if (q := proctree.read_proc(p)) and q.alive
        ]
        wait_for(lambda: f"{waiting} 1" in runs.read_text().split("\n"), what="the next job")
    finally:
        daemon.close()


# -- a full state directory ------------------------------------------------------------


@pytest.fixture
def small_state_dir(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs to hold the daemon's state directory (root only)."""
    with mounted_tmpfs(tmp_path / "state", "size=4m,mode=0700") as mount_point:
        yield mount_point


def fill(directory: Path, name: str = "filler") -> Path:
    """Write a file until the filesystem has not one byte left; returns it."""
    filler = directory / name
    with open(filler, "wb", buffering=0) as handle:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
            try:
                while True:
                    handle.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


def until_writes_fail(daemon: DaemonHarness, spec: dict[str, Any], probe: int) -> None:
    """Write state until the daemon cannot commit even its smallest transaction.

    New rows need pages the full filesystem cannot give, so SQLite's write-ahead
    log can no longer be checkpointed and only grows. A refused commit still
    leaves room for a smaller one in the log, so after submits are refused the
    held `probe` job's priority (a one-row update, the smallest write the daemon
    makes) is rewritten until that is refused too: then recording an exit fails.
    """
    priorities = iter(range(1, 1_000_000))

    def submit_refused() -> bool:
        try:
            daemon.call("submit", spec={**spec, "hold": True})
        except StateError:
            return True
        return False

    def update_refused() -> bool:
        results = daemon.call("priority", ids=[probe], priority=next(priorities))["results"]
        return not results[0]["ok"]

    wait_for(submit_refused, interval=0.0, what="a refused submit")
    wait_for(update_refused, interval=0.0, what="a refused update")


def started(state_dir: Path, job_id: int) -> None:
    """Wait until the job's command runs: its shim has written (and trimmed) `child.json`."""
    child = state_dir / "jobs" / str(job_id) / jobfiles.CHILD
    wait_for(lambda: jobfiles.read_json(child), what=f"job {job_id}'s command to start")


def end_while_full(daemon: DaemonHarness, go: Path, job_id: int) -> Path:
    """Let the job end while the daemon is stopped, then fill what its exit record freed.

    The shim writes `exit.json` into space reserved at the start and trims the
    rest, which frees a few pages: filled again before the daemon reads the
    exit, they cannot let the daemon's own write through. Returns the filler.
    """
    assert daemon.process is not None
    exit_file = daemon.state_dir / "jobs" / str(job_id) / jobfiles.EXIT
    os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        go.touch()
        wait_for(exit_file.exists, what="the shim to record the exit in its reserved space")
        return fill(daemon.state_dir, "filler-after-exit")
    finally:
        os.kill(daemon.process.pid, signal.SIGCONT)


def test_a_full_disk_keeps_an_exit_and_its_gpus_until_it_is_recorded(
    tmp_path: Path, small_state_dir: Path
) -> None:
    daemon = DaemonHarness(tmp_path, gpus_toml='[[gpus.fake]]\nname = "Fake"\nmemory = "8G"\n')
    try:
        daemon.start()
        go = tmp_path / "go"
        ending = daemon.submit(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 3"])
        waiting = daemon.submit(["true"])
        probe = daemon.submit(["true"], hold=True)
        daemon.wait_state(ending, "running")
        started(small_state_dir, ending)
        filler = fill(small_state_dir)
        until_writes_fail(daemon, job_spec(tmp_path, 0, 0), probe)
        more = end_while_full(daemon, go, ending)

        def held_back() -> dict[str, Any] | None:
            job = daemon.job(ending)
            return job if "recording it waits for disk space" in job["reason"] else None

        job = wait_for(held_back, what="the exit to be held back")
        assert job["state"] == "running"
        assert daemon.job(waiting)["state"] == "queued", "its GPU is not free until recorded"
        listing = daemon.cli("ls")
        assert listing.returncode == 0
        assert "is full or not writable" in listing.stderr
        assert "[FAIL] daemon" in daemon.cli("doctor").stdout

        filler.unlink()
        more.unlink()
        recorded = daemon.wait_state(ending, "failed")
        assert (recorded["exit_code"], recorded["reason"]) == (3, "exited with code 3")
        assert daemon.wait_state(waiting, "succeeded")
        assert "is full" not in daemon.cli("ls").stderr
    finally:
        daemon.close()


def test_an_exit_held_back_by_a_full_disk_survives_a_daemon_restart(
    tmp_path: Path, small_state_dir: Path
) -> None:
    daemon = DaemonHarness(tmp_path)
    try:
        daemon.start()
        go = tmp_path / "go"
        ending = daemon.submit(
            ["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.05; done; exit 5"], gpus=0
        )
        probe = daemon.submit(["true"], gpus=0, hold=True)
        daemon.wait_state(ending, "running")
        started(small_state_dir, ending)
        filler = fill(small_state_dir)
        until_writes_fail(daemon, job_spec(tmp_path, 0, 0), probe)
        more = end_while_full(daemon, go, ending)
        daemon.kill()
        filler.unlink()
        more.unlink()
        daemon.start()
        job = daemon.wait_state(ending, "failed", "lost")
        assert (job["state"], job["exit_code"]) == ("failed", 5)
    finally:
        daemon.close()


def test_a_daemon_started_on_a_full_disk_says_to_free_space_and_keeps_the_queue(
    tmp_path: Path, small_state_dir: Path
) -> None:
    daemon = DaemonHarness(tmp_path)
    try:
        daemon.start()
        held = daemon.submit(["true"], gpus=0, hold=True)
        daemon.kill()
        filler = fill(small_state_dir)
        # Not a byte left: the daemon cannot write its log either, so the command says why.
        with pytest.raises(StateError) as opening:  # and the daemon's own words, had it room
            Store.open(small_state_dir / "gpuq.db", 0, time.time()).close()
        assert opening.value.hint is not None
        assert f"free some space where it lives (df -h {small_state_dir})" in opening.value.hint
        refused = daemon.cli("ls")
        assert refused.returncode == ExitCode.STATE  # as the daemon's own "disk full" would be
        assert f"could not start: the filesystem of {small_state_dir} is full" in refused.stderr
        assert f"hint: free some space there (df -h {small_state_dir})" in refused.stderr

        filler.unlink()
        daemon.start()
        assert daemon.job(held)["state"] == "held"
    finally:
        daemon.close()


# -- a cancel cut short by the daemon's death ------------------------------------------


def test_a_cancel_asked_before_a_daemon_restart_still_kills_a_job_that_ignores_term(
    tmp_path: Path,
) -> None:
    daemon = DaemonHarness(tmp_path)
    try:
        daemon.start()
        job_id = daemon.submit(["sh", "-c", 'trap "" TERM; sleep 600'], gpus=0)
        daemon.wait_state(job_id, "running")
        wait_for(lambda: attempt_processes(daemon, job_id, 1), what="the job's processes")
        daemon.call("cancel", ids=[job_id])
        daemon.kill()  # before its KILL timer fires
        daemon.start()
        job = daemon.wait_state(job_id, "cancelled", timeout=60)
        assert job["signal"] == "SIGKILL"
        assert attempt_processes(daemon, job_id, 1) == []
    finally:
        daemon.close()


@pytest.mark.parametrize(
    ("kill_at", "delay"),
    [(None, 10.0), (1005.0, 5.0), (995.0, 0.0), (2000.0, 10.0)],
    ids=["a-new-cancel", "half-the-grace-left", "the-grace-over", "never-more-than-the-grace"],
)
def test_after_a_restart_the_kill_comes_when_the_cancels_own_grace_ends(
    kill_at: float | None, delay: float
) -> None:
    """A daemon killed again and again during a cancel must not put its KILL off each time."""
    assert lifecycle.kill_delay(10.0, kill_at, now=1000.0) == delay
