"""The suspend benchmark runs end to end with tiny models and reports every figure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.torch]


def bench(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m bench.bench_suspend ARGV` outside gpuq, one CPU thread."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return subprocess.run(
        [sys.executable, "-m", "bench.bench_suspend", *argv],
        cwd=ROOT,
        env=environ | {"OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.slow
def test_quick_run_measures_both_modes_for_both_models_on_the_cpu() -> None:
    done = bench("--quick", "--json", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    by_key = {(row["model"], row["mode"]): row for row in rows}
    assert sorted(by_key) == [
        ("resnet50", "checkpoint"),
        ("resnet50", "park"),
        ("transformer", "checkpoint"),
        ("transformer", "park"),
    ]
    for row in rows:
        assert row["device"] == "cpu" and row["size"] == "tiny"
        assert row["request_to_suspended_ms"] > 0 and row["resume_to_first_step_ms"] > 0
        assert row["save_ms"] > 0 and row["step_ms"] > 0 and row["bytes_moved"] > 0
        assert row["memory_min_bytes"] is None and row["peak_to_min"] is None  # no CUDA
    for model in ("resnet50", "transformer"):
        park, checkpoint = by_key[(model, "park")], by_key[(model, "checkpoint")]
        assert park["parameters"] == checkpoint["parameters"] > 0
        # A checkpoint holds everything a park moves (parameters, buffers, optimizer
        # state) plus the generators and progress; a fresh process must start first.
        assert checkpoint["bytes_moved"] > park["bytes_moved"]
        assert checkpoint["start_ms"] > 0 and park["start_ms"] is None
        assert checkpoint["exit_ms"] >= checkpoint["request_to_suspended_ms"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is there: the CUDA part would run")
def test_without_a_gpu_the_cuda_part_is_skipped_with_a_message() -> None:
    done = bench("--quick", "--json", "--device", "cuda")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    assert "no CUDA device: skipping" in done.stderr
