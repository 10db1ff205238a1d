"""A preemptive policy run live: the daemon carries out `tiresias`'s preemptions.

One fake GPU, `tiresias` with its queue threshold at 0.001 GPU-hours (3.6
GPU-seconds). A long gpuq.runner job (tests/control_job.py, real PyTorch on
the CPU) runs past the threshold; a newcomer, still in queue 0, preempts it:
the long job checkpoints with the policy's reason, is queued again, and
finishes after the newcomer, bit for bit as a run never interrupted. A job
without the runner is never preempted: the newcomer waits and says why.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.test_control_runner import JOB, job_env, same_state

ONE_GPU = '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 1\n'
TIRESIAS = '[scheduler]\npolicy = "tiresias:thresholds_gpu_hours=0.001"\n'
THRESHOLD_SECONDS = 3.6

pytestmark = [pytest.mark.torch]


def reasons(daemon: DaemonHarness, job_id: int) -> list[str]:
    """The job's event log, oldest first."""
    return [event["reason"] for event in daemon.call("show", id=job_id)["events"]]


def run_time(daemon: DaemonHarness, job_id: int) -> float:
    """Seconds the job has run, over all attempts."""
    job: dict[str, Any] = daemon.job(job_id)
    return float(job.get("run_time") or 0.0)


@pytest.fixture
def daemon(tmp_path: Path) -> Any:
    with running_daemon(tmp_path, gpus_toml=ONE_GPU, extra_toml=TIRESIAS) as harness:
        yield harness


LONG_ARGS = ["--epochs", "6", "--step-delay", "0.05"]


def start_long_job(daemon: DaemonHarness, out: Path) -> int:
    """Submit the long runner job and wait until it has run past the queue threshold."""
    job_id = daemon.submit(
        [sys.executable, str(JOB), *LONG_ARGS, "--out", str(out)], gpus=1, env=job_env()
    )
    wait_for(
        lambda: (
            daemon.job(job_id)["state"] == "running"
            and run_time(daemon, job_id) > THRESHOLD_SECONDS + 1
        ),
        timeout=120,
        what="the long job past the threshold",
    )
    return job_id


def test_a_newcomer_preempts_a_long_runner_job_which_resumes_bit_for_bit(
    daemon: DaemonHarness, tmp_path: Path
) -> None:
    reference = tmp_path / "reference.pt"
    command = [sys.executable, str(JOB), *LONG_ARGS, "--out", str(reference)]
    with subprocess.Popen(command, env=job_env(), stdout=subprocess.DEVNULL) as plain:
        long_job = start_long_job(daemon, tmp_path / "long.pt")
        newcomer = daemon.submit(
            [sys.executable, str(JOB), "--epochs", "1", "--out", str(tmp_path / "new.pt")],
            gpus=1,
            env=job_env(),
        )
        preempted = wait_for(
            lambda: [r for r in reasons(daemon, long_job) if "checkpoint saved" in r],
            timeout=180,
            what="the long job's checkpoint",
        )
        assert preempted[0].startswith("suspended by the policy: queue 1, ")
        assert f"preempted for job {newcomer}, ahead of it in rank order" in preempted[0]
        assert preempted[0].endswith("queued to restart from it")
        assert daemon.wait_state(newcomer, "succeeded", "failed", timeout=180)["state"] == (
            "succeeded"
        )
        finished = daemon.wait_state(long_job, "succeeded", "failed", timeout=240)
        assert finished["state"] == "succeeded"
        assert finished["attempts"] >= 2
        assert plain.wait(timeout=240) == 0
    same_state(reference, tmp_path / "long.pt")
    # Every attempt ran on the one GPU, never two at once: the newcomer started
    # only after the long job had checkpointed and freed it.
    events = daemon.call("show", id=newcomer)["events"]
    started = next(e["time"] for e in events if e["reason"].startswith("starting on"))
    saved = next(
        e["time"]
        for e in daemon.call("show", id=long_job)["events"]
        if "checkpoint saved" in e["reason"]
    )
    assert saved <= started


def test_a_job_without_the_runner_is_not_preempted_and_the_newcomer_says_why(
    daemon: DaemonHarness,
) -> None:
    plain = daemon.submit(["sleep", "120"], gpus=1)
    wait_for(
        lambda: run_time(daemon, plain) > THRESHOLD_SECONDS + 1,
        timeout=60,
        what="the plain job past the threshold",
    )
    newcomer = daemon.submit(["true"], gpus=1)
    expected = (
        f"waiting for job {plain}, which the policy would preempt but cannot: "
        "only a job whose gpuq.runner checkpoints can be"
    )
    wait_for(lambda: daemon.job(newcomer)["reason"] == expected, timeout=30, what="the reason")
    assert daemon.job(newcomer)["state"] == "queued"
    assert daemon.job(plain)["state"] == "running"
    assert not any("preempt" in r for r in reasons(daemon, plain))


def test_a_daemon_killed_between_a_preemptions_intent_and_its_request_finishes_it(
    tmp_path: Path,
) -> None:
    harness = DaemonHarness(tmp_path, gpus_toml=ONE_GPU, extra_toml=TIRESIAS)
    try:
        first = harness.start(extra_env={"GPUQ_CRASH_POINT": "preempt-committed"})
        long_job = start_long_job(harness, tmp_path / "long.pt")
        newcomer = harness.submit(
            [sys.executable, str(JOB), "--epochs", "1"], gpus=1, env=job_env()
        )
        assert first.wait(timeout=60) == -9  # killed at the preemption, intent committed
        harness.start()
        assert harness.job(long_job)["state"] == "suspending"
        assert harness.wait_state(newcomer, "succeeded", "failed", timeout=180)["state"] == (
            "succeeded"
        )
        finished = harness.wait_state(long_job, "succeeded", "failed", timeout=240)
        assert finished["state"] == "succeeded"
        history = reasons(harness, long_job)
        assert "re-adopted after daemon restart; waiting for the checkpoint suspend" in history
        assert any("checkpoint saved" in r and "queued to restart" in r for r in history)
        # Never two attempts at once: each attempt started after the last one ended.
        starts = [r for r in history if r.startswith("starting on")]
        assert len(starts) == finished["attempts"] >= 2
    finally:
        harness.close()
