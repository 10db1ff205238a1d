"""Running a framework example (Lightning, Hugging Face) as a subprocess, in or outside gpuq.

Shared by tests/test_runner_lightning.py and tests/test_runner_hf.py: the
environment a run sees, a plain run, a two-rank torchrun launch and its
clean stop, the bitwise comparison of two runs' final training state, and
the whole suspend-and-resume check under torchrun.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


def environ(**gpuq: str) -> dict[str, str]:
    """This environment without GPUQ_* variables, plus `gpuq` (GPUQ_<KEY>=...), one thread."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return base | {"OMP_NUM_THREADS": "1"} | {f"GPUQ_{k.upper()}": v for k, v in gpuq.items()}


def run_example(example: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `example` to its end (at most 240 s), capturing its output."""
    return subprocess.run(
        [sys.executable, str(example), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def torchrun(
    started: list[subprocess.Popen[str]],
    launcher: str,
    env: dict[str, str],
    command: Sequence[str],
) -> subprocess.Popen[str]:
    """Start `command` (a script and its arguments) under `launcher` with two CPU ranks."""
    process = subprocess.Popen(
        [sys.executable, "-m", launcher, "--standalone", "--nproc-per-node", "2", *command],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started.append(process)
    return process


def stop(launcher: subprocess.Popen[str]) -> None:
    """End a launcher that is still running; SIGTERM first, so it ends its ranks too."""
    if launcher.poll() is None:
        launcher.terminate()
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait()
    if launcher.stdout is not None:
        launcher.stdout.close()


def assert_same_training_state(expected: Path, actual: Path, buffers: Sequence[str]) -> None:
    """Two saved `{"model", "optimizer"}` states are bitwise equal, down to `buffers`."""
    want, got = torch.load(expected), torch.load(actual)
    assert want["model"].keys() == got["model"].keys()
    assert all(torch.equal(want["model"][k], got["model"][k]) for k in want["model"])
    moments = list(
        zip(want["optimizer"]["state"].values(), got["optimizer"]["state"].values(), strict=True)
    )
    assert len(moments) == 4
    for name in buffers:
        assert all(torch.equal(a[name], b[name]) for a, b in moments), name


def suspend_and_resume_under_torchrun(
    tmp_path: Path,
    ranks: Callable[..., list[str]],
    job_id: str,
    checkpoint: str,
    reference_args: Sequence[str] = (),
) -> None:
    """Two ranks suspend at step 5 when rank 0 is asked, resume there, and match a reference.

    `ranks(*args)` is the example's command line for torchrun; `checkpoint`
    the name the suspend acknowledgement must carry.
    """
    checkpoints = tmp_path / "ckpt"
    inside = environ(job_id=job_id, checkpoint_dir=str(checkpoints))
    gpuq_torchrun = "gpuq.runner.integrations.torchrun"
    started: list[subprocess.Popen[str]] = []
    reference = torchrun(
        started,
        "torch.distributed.run",
        environ(),
        ranks(*reference_args, "--out", str(tmp_path / "a.pt")),
    )
    try:
        # Only rank 0 is asked (as gpuq's control channel reaches only rank 0).
        suspended = torchrun(started, gpuq_torchrun, inside, ranks("--suspend-at", "5"))
        output, _ = suspended.communicate(timeout=240)
        assert suspended.returncode == 75, output
        assert "gpuq.runner: suspended at step 5:" in output
        assert "gpuq.runner: rank 1 suspended at step 5 (rank 0 saved)" in output
        ack = json.loads((checkpoints / "suspended.json").read_text())
        assert (ack["step"], ack["checkpoint"]) == (5, checkpoint)

        resumed = torchrun(
            started,
            gpuq_torchrun,
            inside | {"GPUQ_ATTEMPT": "2"},
            ranks("--out", str(tmp_path / "b.pt")),
        )
        output, _ = resumed.communicate(timeout=240)
        assert resumed.returncode == 0, output
        # The ranks share one pipe: count the lines without relying on where they break.
        assert len(re.findall(r"training from step 5(?!\d)", output)) == 2
        assert len(re.findall(r"finished at step 16(?!\d)", output)) == 2  # 8 steps an epoch
        output, _ = reference.communicate(timeout=240)
        assert reference.returncode == 0, output
    finally:
        for process in started:
            stop(process)
    expected, actual = torch.load(tmp_path / "a.pt"), torch.load(tmp_path / "b.pt")
    assert all(torch.equal(expected["model"][k], actual["model"][k]) for k in expected["model"])
