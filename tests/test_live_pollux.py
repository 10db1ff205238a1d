"""`pollux` and `gpuq` run live: an adaptive runner job is resized, and loses nothing.

Two fake GPUs, `pollux` (and `gpuq`, built on it) with a 1 s restart
penalty (so a young job is worth resizing) and a decision every second. An
adaptive gpuq.runner job (tests/control_job.py, real PyTorch on the CPU,
`--gpus 1-2`) starts on one GPU, the most Pollux explores before the job
has run; once its runner has reported from one GPU, two are worth more,
and the daemon resizes it through a checkpoint: it is queued again and restarts on both GPUs, and it
ends with the same parameters, bit for bit, as a run never resized. A
daemon killed between the resize's intent and its request finishes the
resize after its restart.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon
from tests.test_control_runner import JOB, job_env, same_state

POLLUX = (
    '[scheduler]\npolicy = "pollux:population=16:generations=10:restart_penalty=1"\ninterval = 1\n'
)
GPUQ = POLLUX.replace('"pollux:', '"gpuq:')

pytestmark = [pytest.mark.torch]


@pytest.mark.parametrize("config", [POLLUX, GPUQ], ids=["pollux", "gpuq"])
def test_an_adaptive_job_is_resized_from_one_gpu_to_two_and_ends_bit_for_bit(
    tmp_path: Path, config: str
) -> None:
    args = ["--epochs", "6", "--step-delay", "0.05"]
    reference = tmp_path / "reference.pt"
    command = [sys.executable, str(JOB), *args, "--out", str(reference)]
    with (
        running_daemon(tmp_path / "d", extra_toml=config) as daemon,
        subprocess.Popen(command, env=job_env(), stdout=subprocess.DEVNULL) as plain,
    ):
        out = tmp_path / "resized.pt"
        job_id = daemon.submit(
            [sys.executable, str(JOB), *args, "--out", str(out)],
            gpus=1,
            gpus_max=2,
            env=job_env(),
        )
        finished = daemon.wait_state(job_id, "succeeded", "failed", timeout=240)
        assert finished["state"] == "succeeded"
        events = daemon.call("show", id=job_id)["events"]
        reasons = [event["reason"] for event in events]
        starts = [r for r in reasons if r.startswith("starting on ")]
        gpus = [start.removeprefix("starting on ").partition(": ")[0] for start in starts]
        assert len(gpus[0].split(", ")) == 1
        assert len(gpus[-1].split(", ")) == 2, "\n".join(reasons)
        resized = [r for r in reasons if r.startswith("resized 1 -> 2 GPUs")]
        assert resized, reasons
        assert any("checkpoint saved" in r and "queued to restart" in r for r in reasons)
        assert finished["attempts"] == len(starts) >= 2
        assert plain.wait(timeout=240) == 0
    same_state(reference, out)


def test_a_daemon_killed_between_a_resizes_intent_and_its_request_finishes_it(
    tmp_path: Path,
) -> None:
    harness = DaemonHarness(tmp_path / "d", extra_toml=POLLUX)
    try:
        first = harness.start(extra_env={"GPUQ_CRASH_POINT": "preempt-committed"})
        job_id = harness.submit(
            [sys.executable, str(JOB), "--epochs", "6", "--step-delay", "0.05"],
            gpus=1,
            gpus_max=2,
            env=job_env(),
        )
        assert first.wait(timeout=120) == -9  # killed with the resize's intent committed
        harness.start()
        assert harness.job(job_id)["state"] == "suspending"
        finished = harness.wait_state(job_id, "succeeded", "failed", timeout=240)
        assert finished["state"] == "succeeded"
        reasons = [event["reason"] for event in harness.call("show", id=job_id)["events"]]
        assert "re-adopted after daemon restart; waiting for the checkpoint suspend" in reasons
        saved = [r for r in reasons if "checkpoint saved" in r]
        assert saved and saved[0].startswith("resized 1 -> 2 GPUs")
        starts = [r for r in reasons if r.startswith("starting on ")]
        assert len(starts) == finished["attempts"] >= 2  # one attempt at a time, never two
    finally:
        harness.close()
