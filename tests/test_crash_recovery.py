"""SIGKILL the daemon mid-flight: no job lost, none run twice, no id reused.

Every job appends "<id> <attempt>" to a shared runs file when it starts, then
exits with a code derived from its index, so the test can check that each job
ran exactly once and ended with its true exit code, whatever the daemon was
doing when it died.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon.faults import POINTS
from gpuq.errors import DaemonUnavailable
from tests.daemon_harness import DaemonHarness, wait_for

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
