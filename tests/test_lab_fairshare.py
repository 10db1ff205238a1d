"""Fair share live: two real users on one lab daemon with fake GPUs (acceptance 3, live half).

The simulator's half is tests/test_sim_fairshare.py; the criteria are the same:

1. A light user who submits a tenth of a heavy user's work gets an average
   JCT within 1.5x of what it gets alone on half the cluster (measured on a
   daemon with half the GPUs), although the heavy user's jobs came first.
2. While both users have jobs waiting, each one's share of the GPU time is
   within 10% of its configured share (shares 3:1), from the jobs' own start
   and end times as the daemon recorded them.

Jobs are `sleep`s of one GPU each, run as their owners. Skips unless root.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import wait_for
from tests.lab_users import LabUser
from tests.test_control_runner import JOB
from tests.test_lab_daemon import Lab, running_lab

SECONDS = 2
"""Each job's length."""


def fake_gpus(count: int) -> str:
    return f'[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = {count}\n'


@pytest.fixture
def lab_of(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Start lab daemons on demand: `lab_of(gpus, lab_toml)`; all stopped at the end."""
    stack: list[Any] = []

    def start(gpus: int, lab_toml: str = "") -> Lab:
        context = running_lab(lab_toml, gpus_toml=fake_gpus(gpus))
        lab = context.__enter__()
        stack.append(context)
        return lab

    yield start
    for context in reversed(stack):
        context.__exit__(None, None, None)


def submit_array(
    lab: Lab, user: LabUser, count: int, seconds: float = SECONDS, *, hold: bool = False
) -> list[int]:
    result = lab.gpuq(
        user, "submit", "--json", "--gpus", "1", "--array", f"0-{count - 1}",
        *(["--hold"] if hold else []), "--", "sleep", str(seconds),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    tasks: list[int] = json.loads(result.stdout)["ids"]
    return tasks


def finished(lab: Lab, ids: Sequence[int]) -> list[dict[str, Any]]:
    """Wait for the jobs (as the admin) and return them, each checked to have succeeded."""
    done = lab.gpuq(lab.carol, "wait", "--json", "--timeout", "900s", *map(str, ids))
    jobs: list[dict[str, Any]] = json.loads(done.stdout)["jobs"]
    assert done.returncode == 0, [(j["id"], j["state"], j["reason"]) for j in jobs][:5]
    return jobs


def average_jct(jobs: Sequence[dict[str, Any]]) -> float:
    return sum(float(job["end_time"]) - float(job["submit_time"]) for job in jobs) / len(jobs)


def test_a_light_user_waits_about_as_long_as_alone_on_half_the_cluster(lab_of: Any) -> None:
    shared = lab_of(4)
    heavy = submit_array(shared, shared.alice, 40)
    time.sleep(1.0)  # the heavy user's jobs hold every GPU before the light user submits
    light = submit_array(shared, shared.bob, 4)
    jobs = {job["id"]: job for job in finished(shared, heavy + light)}
    together = average_jct([jobs[i] for i in light])

    alone_lab = lab_of(2)
    alone = average_jct(finished(alone_lab, submit_array(alone_lab, alone_lab.bob, 4)))

    heavy_end = max(jobs[i]["end_time"] for i in heavy)
    assert together <= 1.5 * alone, (together, alone)
    assert together < (heavy_end - min(jobs[i]["submit_time"] for i in heavy)) / 4, (
        "the light user's jobs did not wait behind the heavy user's queue"
    )


def gpu_time_shares(jobs: Sequence[dict[str, Any]]) -> tuple[dict[str, float], float]:
    """Each user's share of the GPU time while every user has a job waiting; the window's length.

    A user has a job waiting from its first submission to its last job's
    start; the window is where those spans overlap.
    """
    users = {job["user"] for job in jobs}
    begin = max(min(j["submit_time"] for j in jobs if j["user"] == u) for u in users)
    end = min(max(j["start_time"] for j in jobs if j["user"] == u) for u in users)
    used = {user: 0.0 for user in users}
    for job in jobs:
        overlap = min(job["end_time"], end) - max(job["start_time"], begin)
        used[job["user"]] += max(0.0, overlap) * job["gpus"]
    total = sum(used.values())
    return {user: value / total for user, value in used.items()}, end - begin


def test_while_both_wait_each_user_gets_its_configured_share_of_gpu_time(lab_of: Any) -> None:
    """Both arrays queue held and are released together, as they arrive at once in the simulator.

    Were one user's jobs to run first, the fair-share factor would rightly
    pay that usage back inside the window (a second and a half ahead moves
    bob's share to 0.21), and the test would measure the submissions' race.
    """
    lab = lab_of(4, "shares = { gpuq-alice = 3, gpuq-bob = 1 }\n")
    alice = submit_array(lab, lab.alice, 48, hold=True)
    bob = submit_array(lab, lab.bob, 48, hold=True)
    ids = [job_id for pair in zip(alice, bob, strict=True) for job_id in pair]
    released = lab.gpuq(lab.carol, "release", *map(str, ids))
    assert released.returncode == 0, released.stderr
    jobs = finished(lab, ids)
    shares, window = gpu_time_shares(jobs)
    assert window > 10 * SECONDS, f"a window of {window:.0f} s is too short to judge"
    assert shares["gpuq-alice"] == pytest.approx(0.75, rel=0.10), shares
    assert shares["gpuq-bob"] == pytest.approx(0.25, rel=0.10), shares


@pytest.mark.torch
def test_a_user_under_its_share_preempts_a_runner_job_which_resumes(lab_of: Any) -> None:
    """One GPU: alice's long runner job yields through its checkpoint to bob's job."""
    lab = lab_of(1, '[scheduler]\npolicy = "gpuq:timeslice=off:fair_grace=2"\n')
    out = Path(lab.alice.home) / "long.pt"
    long = lab.gpuq(
        lab.alice, "submit", "-q", "--", sys.executable, str(JOB),
        "--epochs", "6", "--step-delay", "0.05", "--out", str(out),
    )  # fmt: skip
    assert long.returncode == 0, long.stderr
    long_id = int(long.stdout)
    wait_for(
        lambda: (job := lab.daemon.job(long_id))["state"] == "running" and job["run_time"] > 3,
        timeout=120,
        what="alice's job past the grace period",
    )
    short = lab.gpuq(lab.bob, "submit", "-q", "--", "sleep", "1")
    assert short.returncode == 0, short.stderr
    short_id = int(short.stdout)
    done = finished(lab, [short_id, long_id])
    assert [job["state"] for job in done] == ["succeeded", "succeeded"]
    events = [e["reason"] for e in lab.daemon.call("show", id=long_id)["events"]]
    assert any(
        f"preempted for job {short_id} (fair share: gpuq-bob holds 0 of 1 GPUs, "
        "gpuq-alice 1 of 0)" in reason
        for reason in events
    ), events
    assert done[1]["attempts"] >= 2
    short_events = lab.daemon.call("show", id=short_id)["events"]
    long_events = lab.daemon.call("show", id=long_id)["events"]
    assert done[0]["end_time"] < done[1]["end_time"], "\n".join(
        f"{e['time'] - short_events[0]['time']:.1f} {e['state']} {e['reason']}"
        for e in sorted([*short_events, *long_events], key=lambda e: e["time"])
    )
