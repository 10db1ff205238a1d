"""Time the goodput model's hot paths: `python bench/bench_goodput.py`.

- `fit_perf_params` on 50 noisy measurements (10 placements x 5 per-GPU batch
  sizes), which the runner repeats every report period: target 0.2 s, the
  figure the Pollux paper gives for its agent's fit.
- `GoodputFunction.optimize` over 64 (nodes, replicas) pairs at once, which
  the agent runs on every reallocation and the Pollux policy (through
  `SpeedupFunction`) for every job: target 10 ms.
- A fresh `SpeedupFunction` answering the same 64 pairs, then a memoized
  repeat, for reference (no target).
- The question a training job's tuner asks at each decision, on one GPU:
  `optimize` and `evaluate` with scalars, which take a path of their own,
  beside the same answers through the broadcasting path (one-element
  arrays), and their ratio (no target: the fast path exists to make
  decisions cheap enough to come often, bench/RESULTS.md).

Prints the median of several runs and its ratio to the target. No test
asserts wall-clock times.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from gpuq.goodput import (
    FloatArray,
    GoodputFunction,
    GradParams,
    IntArray,
    PerfParams,
    SpeedupFunction,
    fit_perf_params,
)

FIT_TARGET_S = 0.200
OPTIMIZE_TARGET_S = 0.010
PERF = PerfParams(0.03, 0.002, 0.08, 0.01, 0.02, 0.002, 2.0)
GRAD = GradParams(sqr=1.0, var=10.0)
M0 = 128
PLACEMENTS = [(1, 1), (1, 2), (1, 3), (1, 4), (2, 4), (2, 6), (2, 8), (3, 12), (4, 16), (8, 32)]


def median_seconds(run: Callable[[], object], runs: int) -> float:
    """Median wall time of `runs` calls, after one warm-up call (imports, caches)."""
    run()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measurements(seed: int) -> tuple[IntArray, IntArray, IntArray, FloatArray, FloatArray]:
    """50 synthetic (nodes, replicas, local_bsz, accum time, optim time) with 5% noise."""
    rng = np.random.default_rng(seed)
    grid = np.array([(n, k, m) for n, k in PLACEMENTS for m in (16, 32, 64, 128, 256)]).T
    nodes, replicas, local_bsz = grid
    truth = GoodputFunction(PERF, GRAD, M0)
    accum = (PERF.alpha_c + PERF.beta_c * local_bsz) * rng.lognormal(0, 0.05, local_bsz.size)
    optim = truth.step_time(nodes, replicas, local_bsz, 0) * rng.lognormal(0, 0.05, nodes.size)
    return nodes, replicas, local_bsz, accum, optim


def per_call(run: Callable[[], object], runs: int, calls: int = 100) -> float:
    """Median seconds of one call of `run`, timed over `calls` calls at a time."""

    def many() -> None:
        for _ in range(calls):
            run()

    return median_seconds(many, runs) / calls


def report(name: str, seconds: float, target: float | None) -> None:
    line = f"{name}: {seconds * 1000:.2f} ms median"
    if target is not None:
        line += f"; ratio to the {target * 1000:.0f} ms target: {seconds / target:.3f}"
    print(line)


def main() -> None:
    """Run the benchmarks and print medians and ratios to their targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    data = measurements(args.seed)
    report(
        f"fit_perf_params on {data[0].size} points",
        median_seconds(lambda: fit_perf_params(*data), args.runs),
        FIT_TARGET_S,
    )

    fn = GoodputFunction(PERF, GRAD, M0)
    replicas = np.arange(1, 65)
    nodes = (replicas + 3) // 4  # 4 GPUs per node, as few nodes as possible
    bounds = (16, 256)
    report(
        f"optimize over {replicas.size} (nodes, replicas) pairs",
        median_seconds(lambda: fn.optimize(nodes, replicas, 32 * M0, bounds, True), args.runs),
        OPTIMIZE_TARGET_S,
    )

    def fresh_speedups() -> object:
        return SpeedupFunction(fn, 32 * M0, bounds, True)(nodes, replicas)

    report(
        f"new SpeedupFunction + {replicas.size} pairs",
        median_seconds(fresh_speedups, args.runs),
        None,
    )
    memoized = SpeedupFunction(fn, 32 * M0, bounds, True)
    report(
        f"memoized SpeedupFunction, {replicas.size} pairs",
        median_seconds(lambda: memoized(nodes, replicas), args.runs),
        None,
    )
    one = np.array([1])
    paths = [
        ("optimize on one GPU", lambda: fn.optimize(1, 1, 32 * M0, bounds, False),
         lambda: fn.optimize(one, one, 32 * M0, bounds, False)),
        ("evaluate one configuration", lambda: fn.evaluate(1, 1, 64, 0),
         lambda: fn.evaluate(one, one, [64], [0])),
    ]  # fmt: skip
    for name, scalar, broadcast in paths:
        fast, slow = per_call(scalar, args.runs), per_call(broadcast, args.runs)
        print(
            f"{name}: scalars {fast * 1e6:.1f} us, one-element arrays {slow * 1e6:.1f} us;"
            f" ratio {fast / slow:.3f}"
        )


if __name__ == "__main__":
    main()
