"""A real gpuq.runner job and a real daemon, talking over the control channel.

The job is tests/control_job.py, a small deterministic PyTorch loop on the
CPU, under a daemon with two fake GPUs. Its runner reports metrics that
`show` and `metrics` return; `gpuq suspend` (auto: checkpoint, since the
runner is connected) makes it save, acknowledge and exit 75, which frees its
GPU; `gpuq resume` queues it again and it finishes with the same parameters,
bit for bit, as a run that was never interrupted. Park mode suspends and
resumes it in place. A daemon killed with SIGKILL and started again finds
the runner back on the channel, sending metrics.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.daemon_harness import DaemonHarness, wait_for

JOB = Path(__file__).resolve().parent / "control_job.py"
SLOW_STEPS = ["--step-delay", "0.05"]
"""About 5 s of training: time to act while the job runs."""

pytestmark = [pytest.mark.torch]


def job_env() -> dict[str, str]:
    """The test's environment, one thread for torch (the machine is shared)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return {**environ, "OMP_NUM_THREADS": "1"}


def submit_job(daemon: DaemonHarness, *args: str) -> int:
    """Submit tests/control_job.py with `args` on one fake GPU."""
    return daemon.submit([sys.executable, str(JOB), *args], gpus=1, env=job_env())


def latest_metrics(daemon: DaemonHarness, job_id: int) -> dict[str, Any] | None:
    """The newest sample `show` returns for the job."""
    metrics: dict[str, Any] | None = daemon.call("show", id=job_id)["metrics"]
    return metrics


def reasons(daemon: DaemonHarness, job_id: int) -> list[str]:
    """The job's event log, oldest first."""
    return [event["reason"] for event in daemon.call("show", id=job_id)["events"]]


def output(daemon: DaemonHarness, job_id: int) -> str:
    """What the job wrote to stdout and stderr so far."""
    job = daemon.job(job_id)
    paths = {job["stdout"], job["stderr"]}
    return "".join(Path(p).read_text() for p in paths if Path(p).exists())


def same_state(first: Path, second: Path) -> None:
    """Assert that two saved states hold bitwise-equal tensors."""
    a, b = torch.load(first), torch.load(second)
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key
    for slot, values in a["optimizer"]["state"].items():
        for name, value in values.items():
            other = b["optimizer"]["state"][slot][name]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other


def test_suspend_checkpoints_frees_the_gpu_and_resume_finishes_bit_for_bit(
    daemon: DaemonHarness, tmp_path: Path
) -> None:
    reference = tmp_path / "reference.pt"
    command = [sys.executable, str(JOB), "--out", str(reference)]
    with subprocess.Popen(command, env=job_env(), stdout=subprocess.DEVNULL) as plain:
        try:
            suspend_and_resume(daemon, tmp_path / "resumed.pt")
        finally:
            assert plain.wait(timeout=120) == 0  # the same job, outside gpuq
    same_state(reference, tmp_path / "resumed.pt")


def suspend_and_resume(daemon: DaemonHarness, resumed: Path) -> None:
    """Run the job under gpuq, suspend it once mid-way, resume it to the end."""
    job_id = submit_job(daemon, *SLOW_STEPS, "--out", str(resumed))

    sample = wait_for(lambda: latest_metrics(daemon, job_id), timeout=60, what="metrics")
    assert sample["step"] >= 1
    assert sample.get("step_seconds", 1.0) > 0
    suspend = daemon.cli("suspend", str(job_id))
    assert suspend.stdout == f"job {job_id}: suspending\n", suspend.stderr

    job = daemon.wait_state(job_id, "suspended", timeout=60)
    assert job["exit_code"] == 75
    assert job["gpu_uuids"] == []
    assert all(not gpu["jobs"] for gpu in daemon.call("gpus")["gpus"])
    assert job["reason"].startswith("suspended (checkpoint mode) at step ")
    assert job["reason"].endswith("; GPUs freed")
    assert "suspend requested (checkpoint mode)" in reasons(daemon, job_id)
    steps = [s["step"] for s in daemon.call("metrics", id=job_id)["samples"]]
    assert steps == sorted(steps)

    assert daemon.cli("resume", str(job_id)).stdout == f"job {job_id}: queued\n"
    assert "resumed by user: queued to restart from its checkpoint" in reasons(daemon, job_id)
    finished = daemon.wait_state(job_id, "succeeded", "failed", timeout=120)
    assert finished["state"] == "succeeded", output(daemon, job_id)
    assert finished["attempts"] == 2
    assert "resumed from step" in output(daemon, job_id)


def test_park_suspends_in_place_and_resume_continues(daemon: DaemonHarness) -> None:
    job_id = submit_job(daemon, "--epochs", "2", *SLOW_STEPS)
    wait_for(lambda: latest_metrics(daemon, job_id), timeout=60, what="metrics")

    assert daemon.cli("suspend", "--mode", "park", str(job_id)).returncode == 0
    job = daemon.wait_state(job_id, "suspended", timeout=60)
    assert "(park mode)" in job["reason"]
    assert len(job["gpu_uuids"]) == 1  # parked: the job keeps its GPU
    # The runner says so just after it acknowledged the park, which the state shows.
    wait_for(lambda: "parked at step" in output(daemon, job_id), timeout=30, what="its message")

    assert daemon.cli("resume", str(job_id)).stdout == f"job {job_id}: running\n"
    wait_for(lambda: "resumed at step" in output(daemon, job_id), timeout=30, what="the resume")
    finished = daemon.wait_state(job_id, "succeeded", "failed", timeout=120)
    assert finished["state"] == "succeeded", output(daemon, job_id)
    assert finished["attempts"] == 1
    assert any(r.startswith("back on the device: ") for r in reasons(daemon, job_id))


def test_the_runner_reconnects_to_a_restarted_daemon_and_metrics_go_on(
    daemon: DaemonHarness,
) -> None:
    job_id = submit_job(daemon, "--epochs", "30", *SLOW_STEPS)
    wait_for(lambda: latest_metrics(daemon, job_id), timeout=60, what="metrics")

    daemon.kill()
    killed_at = time.time()
    daemon.start()
    assert daemon.job(job_id)["state"] == "running"
    wait_for(
        lambda: (s := latest_metrics(daemon, job_id)) and s["time"] > killed_at,
        timeout=30,
        what="a sample sent after the restart",
    )
    assert "reconnecting in the background" in output(daemon, job_id)

    daemon.call("cancel", ids=[job_id])  # the runner saves and exits 75: still a cancel
    assert daemon.wait_state(job_id, "cancelled", "failed", timeout=60)["state"] == "cancelled"
