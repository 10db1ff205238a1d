"""Run time counts only time a job's command runs; `show` lists every attempt.

A suspended job's time stops counting; the wall time runs from the first
start; after a retry or resume, Started keeps the first start, and each
attempt gets its own line with its own run time.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import pytest

from gpuq.daemon.history import attempts
from gpuq.daemon.state import account_run_time
from gpuq.models import Job, JobEvent, JobSpec, JobState
from tests.daemon_harness import DaemonHarness
from tests.daemon_harness import submit_cli as submit

S = JobState


def events(*timeline: tuple[float, JobState, str]) -> list[JobEvent]:
    return [JobEvent(1, time, state, reason) for time, state, reason in timeline]


def test_suspended_time_is_not_run_time_and_a_retry_is_a_new_attempt() -> None:
    history = events(
        (0, S.QUEUED, "submitted"),
        (1, S.STARTING, ""),
        (2, S.RUNNING, "started"),
        (5, S.SUSPENDING, "suspend requested"),
        (6, S.SUSPENDED, "stopped"),
        (16, S.RUNNING, "resumed"),
        (20, S.QUEUED, "exited with code 1; retrying in 1s (attempt 2 of 2)"),
        (21, S.STARTING, ""),
        (22, S.RUNNING, "started"),
        (25, S.SUCCEEDED, "exited with code 0"),
    )
    found = [a.to_dict() for a in attempts(history, now=100)]
    assert [(a["attempt"], a["start_time"], a["end_time"], a["run_time"]) for a in found] == [
        (1, 2, 20, 3 + 1 + 4),
        (2, 22, 25, 3),
    ]
    assert [(a["state"], a["reason"]) for a in found] == [
        ("queued", "exited with code 1; retrying in 1s (attempt 2 of 2)"),
        ("succeeded", "exited with code 0"),
    ]


def test_a_running_attempt_counts_up_to_now() -> None:
    history = events((0, S.QUEUED, ""), (1, S.STARTING, ""), (2, S.RUNNING, "started"))
    [ongoing] = attempts(history, now=7)
    assert (ongoing.state, ongoing.end_time, ongoing.run_time) == ("running", None, 5)


def test_run_time_accrues_only_while_running() -> None:
    job = Job(1, JobSpec(command=("true",), cwd="/"), S.STARTING, "", submit_time=0.0)
    timeline = [(2.0, S.RUNNING), (5.0, S.SUSPENDED), (15.0, S.RUNNING), (19.0, S.SUCCEEDED)]
    for now, state in timeline:
        changes: dict[str, Any] = {}
        account_run_time(job, state, now, changes)
        job = dataclasses.replace(job, state=state, **changes)
    assert (job.first_start_time, job.run_seconds, job.running_since) == (2.0, 7.0, None)
    assert job.run_time(now=1000.0) == 7.0


def running_intervals(shown: dict[str, Any]) -> float:
    """Seconds from each running event to the next event that is not running.

    The last run ends when the job's command exited (its end time), which is
    a moment before the daemon recorded the exit.
    """
    total, since = 0.0, None
    for event in shown["events"]:
        if event["state"] in ("running", "suspending"):
            since = event["time"] if since is None else since
        elif since is not None:
            ended = shown["job"]["end_time"] if event["state"] == "succeeded" else event["time"]
            total += ended - since
            since = None
    return total


def test_a_stop_suspend_pauses_the_run_time_and_show_says_so(daemon: DaemonHarness) -> None:
    gate = daemon.root / "gate"
    job_id = submit(
        daemon, "--gpus", "0", "--", "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"
    )
    daemon.wait_state(job_id, "running")
    assert daemon.cli("suspend", "--mode", "stop", str(job_id)).returncode == 0
    daemon.wait_state(job_id, "suspended")
    frozen = daemon.job(job_id)["run_time"]
    time.sleep(0.3)
    assert daemon.job(job_id)["run_time"] == frozen, "a suspended job's run time stands still"
    assert daemon.cli("resume", str(job_id)).returncode == 0
    daemon.wait_state(job_id, "running")
    gate.touch()
    daemon.wait_state(job_id, "succeeded")
    shown = json.loads(daemon.cli("show", "--json", str(job_id)).stdout)
    job = shown["job"]
    assert job["run_time"] == pytest.approx(running_intervals(shown), abs=1e-3)
    wall = job["end_time"] - job["first_start_time"]
    suspended = [e["time"] for e in shown["events"] if e["state"] in ("suspended", "running")]
    assert job["run_time"] < wall, "the suspended stretch is not run time"
    assert len(shown["attempts"]) == 1 and len(suspended) == 3
    text = daemon.cli("show", str(job_id)).stdout
    assert "(suspended time excluded)" in text and "since the first start" in text


def test_after_a_retry_started_is_the_first_start_and_each_attempt_is_listed(
    daemon: DaemonHarness,
) -> None:
    once = daemon.root / "once"
    command = f"[ -e {once} ] || {{ touch {once}; exit 1; }}"
    job_id = submit(daemon, "--gpus", "0", "-r", "1", "--", "sh", "-c", command)
    daemon.wait_state(job_id, "succeeded", timeout=30)
    shown = json.loads(daemon.cli("show", "--json", str(job_id)).stdout)
    first, second = shown["attempts"]
    assert (first["state"], second["state"]) == ("queued", "succeeded")
    assert shown["job"]["first_start_time"] == first["start_time"] < second["start_time"]
    assert shown["job"]["start_time"] == pytest.approx(second["start_time"], abs=0.5)
    text = daemon.cli("show", str(job_id)).stdout
    assert "(attempt 2 at " in text
    assert "Attempts:   2 (retries allowed: 1)\n      1  " in text
    assert "\n      2  " in text
