"""bench/bench_gradient_lags.py runs on a short stretch of training (its figures are in RESULTS)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.adaptive_tasks import TASKS
from bench.bench_gradient_lags import LAGS, lags

pytestmark = [pytest.mark.torch]


def test_each_quarter_reports_the_noise_and_the_products_of_gradients_steps_apart() -> None:
    rows = lags(TASKS["mlp"], 80)
    assert len(rows) == 4 and [row["from"] for row in rows] == [0, 20, 40, 60]
    for row in rows:
        assert row["tr_sigma"] > 0
        assert {f"lag{k}" for k in LAGS if k < 20} <= row.keys()
        assert "lag32" not in row  # a quarter of 20 steps has no pair 32 apart


def test_the_bench_prints_a_table_per_task() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_gradient_lags", "--tasks", "mlp", "--steps", "40"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    assert done.stdout.startswith("mlp at M0 = 16")
    assert done.stdout.count("  steps ") == 4 and "k=1:" in done.stdout
    unknown = subprocess.run(
        [sys.executable, "-m", "bench.bench_gradient_lags", "--tasks", "nope"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert unknown.returncode == 2 and "unknown tasks" in unknown.stderr
