"""Live and simulated agree: the short version of bench/bench_live_vs_sim.py.

The first 8 jobs of the lab workload `lab:3` (one 8-GPU server: cifar10,
bert and NCF jobs arriving over an hour) run in the simulator and live, on
a daemon with 8 fake GPUs, under gpuq, pollux, gandiva and fifo, at 60x
(about two minutes of replay per policy, ten minutes in all on a busy
2-core machine). Not 120x: each event's delay (an exit noticed, a decision
made) counts twice the simulated time there, and with the machine loaded
pollux's live average JCT came out 6% and 10% over the simulator's in two
runs, too near the target for a test that must not flake. The issue's
targets, unchanged: the live average JCT of gpuq and of pollux within 10%
of the simulator's, and the policies in the same order live as simulated
(gpuq and pollux, which the simulator ties, are not ordered; see the
bench's docstring). The workload was chosen because the simulator separates its
other policies by more than the 10% agreement (gpuq and pollux 1344 s,
fifo 1763 s, gandiva 2045 s), so its order is the policies' and not noise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_live_vs_sim import AGREEMENT, CHECKED, POLICIES, compare
from gpuq.sim.run import resolve_workload

pytestmark = [pytest.mark.torch, pytest.mark.slow]

WORKLOAD = "lab:3"
JOBS = 8
SPEEDUP = 60.0


@pytest.mark.timeout(3600)
def test_live_and_simulated_agree_on_a_short_lab_workload(tmp_path: Path) -> None:
    workload = resolve_workload(WORKLOAD, 8, 8)[:JOBS]
    comparison = compare(workload, POLICIES, 8, SPEEDUP, tmp_path)
    report = comparison.table()
    print(report)
    for policy in CHECKED:
        assert abs(comparison.ratio(policy) - 1.0) <= AGREEMENT, report
    assert comparison.same_ordering(), report
    assert comparison.ties() == [("gpuq", "pollux")], report
