"""bench/bench_decide_lag.py runs, on a state every policy accepts (its figures are in RESULTS)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from bench.bench_decide_lag import busy_state, measure
from gpuq.policies.interface import capacity_violations
from gpuq.policies.registry import get_policy


def test_the_busy_state_is_a_full_server_with_a_queue() -> None:
    state = busy_state(100, seed=1)
    assert state.total_gpus == 64
    assert sum(job.running for job in state.jobs) == 64
    assert len(state.jobs) == 100


def test_each_mode_decides_and_reports_decision_time_and_lateness() -> None:
    state = busy_state(80, seed=2)
    for off_loop in (True, False):
        figures = asyncio.run(measure(get_policy("tiresias"), state, 2, off_loop))
        assert set(figures) == {"decide_median", "decide_max", "lag_max", "lag_p99"}
        assert 0 <= figures["decide_median"] <= figures["decide_max"]
    decision = get_policy("tiresias").decide(state, 0.0)
    assert capacity_violations(state, decision) == []


def test_the_script_prints_a_row_per_policy() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.bench_decide_lag", "--jobs", "70", "--runs", "1",
         "--policies", "fifo,tiresias"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line.split()[0] for line in result.stdout.splitlines()[2:]]
    assert rows == ["fifo", "tiresias"]
