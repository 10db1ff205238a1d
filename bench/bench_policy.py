"""Time `FifoBackfill.decide()` on a busy server: `python bench/bench_policy.py`.

The state has two nodes of 8 x 80G GPUs, 16 running jobs (whole GPUs on the
first node, one 60G share per GPU on the second) and 10,000 pending jobs of
mixed shapes: whole GPUs (1, 2, 4 or 8), shares of arbitrary sizes, some
exclusive, most with time limits (CPU-only jobs never reach a policy). The target is 100 ms per
decision on a slow 2-core machine; this prints the median of several runs and
its ratio to that target. No test asserts wall-clock times. With
`--compare-moves` it also times `fifo:moves=false` on the same state, runs
interleaved, and prints the ratio: the cost of looking for moves (the 60G
shares are settled and preemptible, so the head of the queue tries them).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import ClusterState, GpuView, JobView, NodeView

GIB = 1024**3
TARGET_S = 0.100


def busy_state(pending_count: int, seed: int) -> ClusterState:
    """A deterministic, full two-node server with `pending_count` queued jobs."""
    rng = random.Random(seed)
    gpus = tuple(
        GpuView(f"GPU-{node}{i}", f"node{node}", 80 * GIB, rng.choice([0, 0, 0, GIB]))
        for node in "ab"
        for i in range(8)
    )
    running: list[JobView] = []
    for i, gpu in enumerate(gpus[:8]):
        limit = rng.choice([None, 3600.0])
        running.append(JobView(i, 0.0, allocation=(1, 0), time_limit=limit, gpu_uuids=(gpu.uuid,)))
    for i, gpu in enumerate(gpus[8:]):
        running.append(
            JobView(
                100 + i,
                0.0,
                allocation=(0, 1),
                gpu_mem=60 * GIB,
                time_limit=7200.0,
                gpu_uuids=(gpu.uuid,),
            )
        )
    pending: list[JobView] = []
    for job_id in range(1000, 1000 + pending_count):
        kind = rng.random()
        gpu_count, gpu_mem, exclusive = 1, None, False
        if kind < 0.3:
            gpu_count = rng.choice([1, 1, 2, 4, 8])
        elif kind < 0.9:
            gpu_count = rng.choice([1, 1, 1, 2])
            gpu_mem = rng.randrange(GIB, 40 * GIB)
            exclusive = rng.random() < 0.05
        time_limit = rng.choice([None, 600.0, 3600.0, 86400.0])
        pending.append(
            JobView(
                job_id,
                float(rng.randrange(100_000)),
                gpus_requested=gpu_count,
                priority=rng.choice([0, 0, 0, 10]),
                gpu_mem=gpu_mem,
                exclusive=exclusive,
                time_limit=time_limit,
            )
        )
    return ClusterState(
        nodes=(NodeView("nodea", 8), NodeView("nodeb", 8)),
        jobs=(*running, *pending),
        gpus=gpus,
    )


def main() -> None:
    """Run the benchmark and print the median time and its ratio to the target."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--compare-moves", action="store_true")
    args = parser.parse_args()

    state = busy_state(args.pending, args.seed)
    policy = FifoBackfill()
    without_moves = FifoBackfill(moves=False)
    times: list[float] = []
    times_without: list[float] = []
    decision = policy.decide(state, 1000.0)
    for _ in range(args.runs):
        started = time.perf_counter()
        decision = policy.decide(state, 1000.0)
        times.append(time.perf_counter() - started)
        if args.compare_moves:
            started = time.perf_counter()
            without_moves.decide(state, 1000.0)
            times_without.append(time.perf_counter() - started)
    median = statistics.median(times)
    running = sum(1 for job in state.jobs if job.gpu_uuids)
    print(
        f"fifo decide(): {median * 1000:.1f} ms median of {args.runs} "
        f"({args.pending} pending, {len(state.gpus)} GPUs, {running} running; "
        f"{len(decision.allocations) - running} started, {len(decision.notes)} waiting)"
    )
    print(f"ratio to the {TARGET_S * 1000:.0f} ms target: {median / TARGET_S:.2f}")
    if times_without:
        other = statistics.median(times_without)
        print(f"moves off: {other * 1000:.1f} ms median; moves on / off: {median / other:.2f}")


if __name__ == "__main__":
    main()
