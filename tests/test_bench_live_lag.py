"""bench/bench_live_lag.py runs on a tiny live queue (its figures are in RESULTS)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from bench.bench_live_lag import HEADER, TARGET_S, measure_policy, row
from bench.lag_job import model_sample
from gpuq.control import Metrics, parse_message, to_dict
from gpuq.wire import decode, encode


def test_a_lag_job_reports_a_model_a_policy_can_read() -> None:
    sample = model_sample(7)
    assert sample == dataclasses.replace(model_sample(7), time=sample.time)  # from its id
    assert parse_message(decode(encode(to_dict(Metrics(sample))))) == Metrics(sample)
    assert sample.perf_params is not None and len(sample.perf_params) == 7
    assert sample.batch_limits is not None and len(sample.batch_limits) == 4


def test_a_policy_on_a_live_daemon_reports_decisions_lag_and_latency(tmp_path: Path) -> None:
    figures = measure_policy(tmp_path / "d", "pollux", jobs=5, gpus=3, seconds=1.0,
                             interval=0.2, pace=0.01)  # fmt: skip
    assert (figures.policy, figures.running) == ("pollux", 3)
    assert figures.decisions >= 1 and figures.requests >= 1
    assert 0 < figures.decide_median <= figures.decide_max
    assert 0 <= figures.lag_p99 <= figures.lag_max
    assert figures.idle_lag_max >= 0
    assert 0 < figures.request_p50 <= figures.request_p99 <= figures.request_max
    ratios = [figures.decide_max, figures.lag_max, figures.request_max]
    assert row(figures).split()[-3:] == [f"{seconds / TARGET_S:.2f}" for seconds in ratios]


def test_the_script_prints_a_row_per_policy_side_by_side() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "bench.bench_live_lag", "--jobs", "4", "--gpus", "2",
         "--seconds", "0.5", "--interval", "0.2", "--policies", "fifo,tiresias"],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == HEADER
    assert [line.split()[0] for line in lines[2:]] == ["fifo", "tiresias"]
