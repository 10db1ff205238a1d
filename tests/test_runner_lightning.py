"""PyTorch Lightning: GpuqCallback suspends at a batch boundary and resumes exactly.

Runs examples/runner_lightning/train.py in subprocesses (Lightning's own
warnings are not this suite's business): a reference fit, a fit inside gpuq
that is asked to suspend after step 7 and exits with 75, and a fit that
resumes from the suspend checkpoint at step 7 and ends with the reference's
parameters and optimizer state, bit for bit. Skipped without Lightning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch

from gpuq.runner.job import Job, StepInfo

pytest.importorskip("lightning")

from gpuq.runner.integrations import lightning as gq_lightning  # noqa: E402
from tests.framework_runs import (  # noqa: E402
    assert_same_training_state,
    environ,
    run_example,
    suspend_and_resume_under_torchrun,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "runner_lightning" / "train.py"
SUSPEND_AT = 7  # 16 steps an epoch, 32 in all

pytestmark = [pytest.mark.torch]


def ranks(*args: str) -> list[str]:
    """The example's command line for torchrun's two ranks."""
    return [str(EXAMPLE), "--devices", "2", *args]


def test_outside_gpuq_the_callback_does_nothing() -> None:
    callback = gq_lightning.GpuqCallback(Job(environ={}))
    assert callback.state_dict() == {}
    nothing = cast(Any, None)  # never touched: the callback returns first
    callback.on_train_batch_end(nothing, nothing, {"loss": torch.tensor(1.0)}, nothing, 0)
    assert callback.job.step == 0 and callback.job.last_step is None
    assert gq_lightning.last_checkpoint() is None


def test_only_batches_that_end_an_optimizer_step_are_boundaries() -> None:
    callback = gq_lightning.GpuqCallback(Job(environ={"GPUQ_JOB_ID": "1"}))
    trainer = SimpleNamespace(
        global_step=0, current_epoch=0, accumulate_grad_batches=2, world_size=1
    )
    seen: list[StepInfo] = []
    callback.job.add_step_hook(seen.append)
    callback.on_train_start(cast(Any, trainer), cast(Any, None))
    batch = (torch.zeros(4, 3), torch.zeros(4))
    callback.on_train_batch_end(cast(Any, trainer), cast(Any, None), torch.tensor(1.0), batch, 0)
    assert seen == []  # the first half of an accumulated step
    trainer.global_step = 1
    callback.on_train_batch_end(cast(Any, trainer), cast(Any, None), torch.tensor(2.0), batch, 1)
    assert [(info.step, info.loss.item()) for info in seen] == [(1, 2.0)]
    assert callback.job.step == 1


def test_last_checkpoint_is_the_newest_suspend_file(tmp_path: Path) -> None:
    for name in ["gpuq-step9.ckpt", "gpuq-step12.ckpt", "other-step99.ckpt", ".gpuq-step20.ckpt"]:
        (tmp_path / name).touch()
    assert gq_lightning.last_checkpoint(tmp_path) == str(tmp_path / "gpuq-step12.ckpt")


@pytest.mark.slow
def test_suspend_at_a_given_step_then_resume_continues_there_bitwise_equal(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "ckpt"
    inside = environ(job_id="5", checkpoint_dir=str(checkpoints))
    reference = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--out", str(tmp_path / "reference.pt")],
        env=environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        suspended = run_example(EXAMPLE, inside, "--suspend-at", str(SUSPEND_AT))
        assert suspended.returncode == 75, suspended.stderr
        ack = json.loads((checkpoints / "suspended.json").read_text())
        assert (ack["mode"], ack["step"], ack["attempt"]) == ("checkpoint", SUSPEND_AT, 1)
        assert ack["checkpoint"] == f"gpuq-step{SUSPEND_AT}.ckpt"
        assert (checkpoints / ack["checkpoint"]).stat().st_size == ack["bytes"]
        assert not list(checkpoints.glob(".*tmp*"))

        resumed = run_example(
            EXAMPLE, inside | {"GPUQ_ATTEMPT": "2"}, "--out", str(tmp_path / "resumed.pt")
        )
        assert resumed.returncode == 0, resumed.stderr
        assert f"resuming from {checkpoints / ack['checkpoint']}" in resumed.stdout
        assert f"training from step {SUSPEND_AT}\n" in resumed.stdout
        assert "finished at step 32" in resumed.stdout
        assert not (checkpoints / "suspended.json").exists()  # the new attempt cleared it
        output, _ = reference.communicate(timeout=240)
        assert reference.returncode == 0, output
        assert "training from step 0" in output and "finished at step 32" in output
    finally:
        reference.kill()
        reference.wait()
    assert_same_training_state(
        tmp_path / "reference.pt", tmp_path / "resumed.pt", ("momentum_buffer",)
    )


@pytest.mark.slow
def test_under_torchrun_both_ranks_stop_where_rank_0_was_asked_and_resume_exactly(
    tmp_path: Path,
) -> None:
    suspend_and_resume_under_torchrun(tmp_path, ranks, "5", "gpuq-step5.ckpt")
