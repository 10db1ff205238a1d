"""Acceptance 6 for the runner examples: they run as plain scripts, and under gpuq submit.

Every single-process ``examples/runner_*/train.py`` imports gpuq.runner and
calls it; outside gpuq (no GPUQ_* variables) each must run to completion as an
ordinary script, writing no file. The transformer example can also skip every runner call
(``--no-runner``): both ways must end with the same parameters, bit for bit,
so the runner changes nothing about the training itself. Finally one example
goes through the real `gpuq submit` to a real daemon and succeeds.

Every runner example accepts ``--epochs``, ``--samples`` and ``--out``, so the
tests can keep the runs short.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.daemon_harness import DaemonHarness, submit_cli

ROOT = Path(__file__).resolve().parents[1]
SINGLE_PROCESS = ("runner_mlp", "runner_cnn", "runner_transformer", "runner_adaptive")
"""The runner examples started as ``python train.py`` (runner_ddp is started by torchrun)."""
RUNNER_EXAMPLES = [ROOT / "examples" / name / "train.py" for name in SINGLE_PROCESS]
SHORT = ["--epochs", "2", "--samples", "256"]

pytestmark = [pytest.mark.torch]


def plain_environ() -> dict[str, str]:
    """This process's environment without GPUQ_* variables, with one CPU thread."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return environ | {"OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run_example(script: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one example in a fresh interpreter outside gpuq."""
    return subprocess.run(
        [sys.executable, "-W", "error", str(script), *argv],
        cwd=cwd,
        env=plain_environ(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_each_single_process_runner_example_is_a_script_with_a_readme() -> None:
    for script in RUNNER_EXAMPLES:
        assert script.is_file() and (script.parent / "README.md").is_file(), script.parent


@pytest.mark.parametrize("script", RUNNER_EXAMPLES, ids=lambda p: p.parent.name)
def test_each_runner_example_runs_to_completion_outside_gpuq(script: Path, tmp_path: Path) -> None:
    done = run_example(script, *SHORT, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "job -: training on cpu"
    assert [line.split(":")[0] for line in lines if line.startswith("epoch")] == [
        "epoch 0",
        "epoch 1",
    ]
    assert "gpuq.runner" not in done.stderr  # no suspend, no message from the runner
    assert list(tmp_path.iterdir()) == []  # no checkpoint, no acknowledgement file


def test_the_transformer_trains_to_the_same_parameters_with_and_without_the_runner(
    tmp_path: Path,
) -> None:
    script = ROOT / "examples" / "runner_transformer" / "train.py"
    with_runner = run_example(script, *SHORT, "--out", "runner.pt", cwd=tmp_path)
    without = run_example(script, *SHORT, "--no-runner", "--out", "plain.pt", cwd=tmp_path)
    assert with_runner.returncode == 0, with_runner.stderr
    assert without.returncode == 0, without.stderr
    assert with_runner.stdout == without.stdout
    runner_state = torch.load(tmp_path / "runner.pt")
    plain_state = torch.load(tmp_path / "plain.pt")
    assert runner_state["step"] == plain_state["step"] == 8  # 2 epochs of 4 batches
    assert runner_state["model"].keys() == plain_state["model"].keys()
    for name, tensor in runner_state["model"].items():
        assert torch.equal(tensor, plain_state["model"][name]), name
    for slot, values in runner_state["optimizer"]["state"].items():
        for key, value in values.items():
            assert torch.equal(value, plain_state["optimizer"]["state"][slot][key]), key


@pytest.mark.slow
def test_an_example_succeeds_under_gpuq_submit(daemon: DaemonHarness) -> None:
    script = ROOT / "examples" / "runner_cnn" / "train.py"
    job_id = submit_cli(
        daemon, "--name", "cnn", "--", sys.executable, str(script), *SHORT, "--log-every", "4"
    )
    job = daemon.wait_state(job_id, "succeeded", "failed", "cancelled", "lost", timeout=240)
    logs = daemon.cli("logs", str(job_id)).stdout
    assert job["state"] == "succeeded", logs
    assert f"job {job_id}: training on cpu" in logs
    assert "step 8 loss" in logs and "epoch 1: step 8" in logs
