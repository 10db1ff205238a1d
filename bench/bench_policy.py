"""Time `FifoBackfill.decide()` on a busy server: `python bench/bench_policy.py`.

The view has two nodes of 8 x 80G GPUs, 16 running jobs (whole GPUs on the
first node, one 60G share per GPU on the second) and 10,000 pending jobs of
mixed shapes: whole GPUs (1, 2, 4 or 8), shares of arbitrary sizes, some
exclusive, some CPU-only, most with time limits. The target is 100 ms per
decision on a slow 2-core machine; this prints the median of several runs and
its ratio to that target. No test asserts wall-clock times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpuq.policies.base import ClusterView, GpuState, JobRequest, RunningJob
from gpuq.policies.fifo import FifoBackfill

GIB = 1024**3
TARGET_S = 0.100


def busy_view(pending_count: int, seed: int) -> ClusterView:
    """A deterministic, full two-node server with `pending_count` queued jobs."""
    rng = random.Random(seed)
    gpus = tuple(
        GpuState(f"GPU-{node}{i}", f"node{node}", 80 * GIB, rng.choice([0, 0, 0, GIB]))
        for node in "ab"
        for i in range(8)
    )
    running: list[RunningJob] = []
    for i, gpu in enumerate(gpus[:8]):
        running.append(RunningJob(i, (gpu.uuid,), None, False, 0.0, rng.choice([None, 3600.0])))
    for i, gpu in enumerate(gpus[8:]):
        running.append(RunningJob(100 + i, (gpu.uuid,), 60 * GIB, False, 0.0, 7200.0))
    pending: list[JobRequest] = []
    for job_id in range(1000, 1000 + pending_count):
        kind = rng.random()
        gpu_count, gpu_mem, exclusive = 1, None, False
        if kind < 0.3:
            gpu_count = rng.choice([1, 1, 2, 4, 8])
        elif kind < 0.9:
            gpu_count = rng.choice([1, 1, 1, 2])
            gpu_mem = rng.randrange(GIB, 40 * GIB)
            exclusive = rng.random() < 0.05
        elif kind < 0.95:
            gpu_count = 0
        time_limit = rng.choice([None, 600.0, 3600.0, 86400.0])
        pending.append(
            JobRequest(
                job_id,
                rng.choice([0, 0, 0, 10]),
                float(rng.randrange(100_000)),
                gpu_count,
                gpu_mem,
                exclusive,
                time_limit,
            )
        )
    return ClusterView(gpus, tuple(pending), tuple(running))


def main() -> None:
    """Run the benchmark and print the median time and its ratio to the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    view = busy_view(args.pending, args.seed)
    policy = FifoBackfill()
    times: list[float] = []
    plan = policy.decide(view, 1000.0)
    for _ in range(args.runs):
        started = time.perf_counter()
        plan = policy.decide(view, 1000.0)
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    print(
        f"fifo decide(): {median * 1000:.1f} ms median of {args.runs} "
        f"({args.pending} pending, {len(view.gpus)} GPUs, {len(view.running)} running; "
        f"{len(plan.start)} started, {len(plan.waiting)} waiting)"
    )
    print(f"ratio to the {TARGET_S * 1000:.0f} ms target: {median / TARGET_S:.2f}")


if __name__ == "__main__":
    main()
