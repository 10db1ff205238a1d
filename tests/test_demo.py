"""The README's demo runs to the end and shows packing, queueing and results."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_the_demo_packs_queues_trains_and_reports() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "demo.sh")],
        env={**env, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    out = result.stdout
    assert "shared" in out, "two jobs packed on one GPU show as shared"
    assert "waiting for 1 free GPU" in out, "the whole-GPU job is shown queued"
    assert "accuracy" in out, "the PyTorch training run printed its result"
    assert "succeeded" in out and "retrying in 1s (attempt 2 of 2)" in out
    shown = "gpuq submit --name whole --gpus 1 -- sh -c 'echo whole GPU: $CUDA_VISIBLE_DEVICES'"
    assert shown in out, "a command is shown as it can be copied and run"
