"""Hugging Face Trainer: GpuqTrainerCallback suspends at a step and resumes exactly.

Runs examples/runner_hf/train.py in subprocesses (the Trainer's own warnings
are not this suite's business): a reference run, a run inside gpuq that is
asked to suspend after step 7 and exits with 75 once the Trainer saved
``checkpoint-7``, and a run that resumes from it at step 7 and ends with the
reference's parameters and optimizer state, bit for bit. Skipped without
transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from gpuq.runner.job import Job

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import TrainerControl  # noqa: E402

from gpuq.runner.integrations import huggingface as gq_hf  # noqa: E402
from tests.framework_runs import (  # noqa: E402
    assert_same_training_state,
    environ,
    run_example,
    suspend_and_resume_under_torchrun,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "runner_hf" / "train.py"
SUSPEND_AT = 7  # 16 steps an epoch, 32 in all

pytestmark = [pytest.mark.torch]


def ranks(*args: str) -> list[str]:
    """The example's command line for torchrun's two ranks."""
    return [str(EXAMPLE), *args]


def test_outside_gpuq_the_callback_does_nothing() -> None:
    callback = gq_hf.GpuqTrainerCallback(Job(environ={}))
    control = TrainerControl()
    nothing = cast(Any, None)  # never touched: the callback returns first
    callback.on_step_end(nothing, nothing, control)
    callback.on_save(nothing, nothing, control)
    assert not control.should_save and not control.should_training_stop
    assert callback.job.step == 0 and callback.job.last_step is None


def test_checkpoints_go_to_gpuq_s_directory_inside_gpuq(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUQ_CHECKPOINT_DIR", raising=False)
    assert gq_hf.checkpoint_dir("out") == "out"
    monkeypatch.setenv("GPUQ_CHECKPOINT_DIR", "/somewhere/ckpt")
    assert gq_hf.checkpoint_dir("out") == "/somewhere/ckpt"


def test_last_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    assert gq_hf.last_checkpoint(tmp_path / "missing") is None
    for step in (9, 12, 20):
        (tmp_path / f"checkpoint-{step}").mkdir()
    for step in (9, 12):  # checkpoint-20 was cut short: no trainer_state.json
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert gq_hf.last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-12")


@pytest.mark.slow
def test_suspend_at_a_given_step_then_resume_continues_there_bitwise_equal(
    tmp_path: Path,
) -> None:
    checkpoints = tmp_path / "ckpt"
    inside = environ(job_id="6", checkpoint_dir=str(checkpoints))
    reference = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLE),
            "--output-dir",
            str(tmp_path / "reference"),
            "--out",
            str(tmp_path / "reference.pt"),
        ],
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
        assert ack["checkpoint"] == f"checkpoint-{SUSPEND_AT}"
        assert (checkpoints / ack["checkpoint"] / "trainer_state.json").is_file()

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
        tmp_path / "reference.pt", tmp_path / "resumed.pt", ("exp_avg", "exp_avg_sq")
    )


@pytest.mark.slow
def test_under_torchrun_both_ranks_stop_where_rank_0_was_asked_and_resume_exactly(
    tmp_path: Path,
) -> None:
    suspend_and_resume_under_torchrun(
        tmp_path,
        ranks,
        "6",
        "checkpoint-5",
        reference_args=("--output-dir", str(tmp_path / "reference")),
    )
