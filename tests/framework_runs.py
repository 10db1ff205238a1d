"""Running a framework example (Lightning, Hugging Face) as a subprocess, in or outside gpuq.

Shared by tests/test_runner_lightning.py and tests/test_runner_hf.py: the
environment a run sees, a plain run, a two-rank torchrun launch and its
clean stop, and the bitwise comparison of two runs' final training state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
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
