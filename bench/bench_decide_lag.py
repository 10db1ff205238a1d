"""How long the event loop waits while a policy decides: `python -m bench.bench_decide_lag`.

The daemon makes every decision in a worker thread (`gpuq.daemon.scheduler.
tick.decide`), so a slow policy must not delay a client's request. Here a
1,000-job queue on one server of 64 GPUs (64 jobs running, the rest
waiting, each with a throughput and gradient-noise model and a remaining
work estimate) is decided by each policy several times, through the
daemon's own `tick.decide`, while a probe task on the same event loop
sleeps 1 ms again and again and records how late it wakes. The same
decision made on the loop itself (as before decisions moved off it) gives
the other column: its lag is the decision time.

Printed per policy: decision time (median, max) and the probe's worst and
99th-percentile lateness, off the loop and on it, with the ratio of the
worst to the 50 ms target. No test asserts wall-clock times.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from types import SimpleNamespace
from typing import Any

from gpuq.daemon.scheduler import tick
from gpuq.daemon.timings import DecisionTimes
from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.interface import ClusterState, JobView, NodeView
from gpuq.policies.registry import get_policy

TARGET_S = 0.050
GPUS = 64


def busy_state(jobs: int, seed: int) -> ClusterState:
    """One 64-GPU server, 64 one-GPU jobs running and the rest waiting (deterministic)."""
    rng = random.Random(seed)
    views = []
    for job_id in range(1, jobs + 1):
        perf = PerfParams(
            alpha_c=rng.uniform(0.02, 0.2),
            beta_c=rng.uniform(0.001, 0.01),
            alpha_n=rng.uniform(0.1, 0.5),
            beta_n=rng.uniform(0.01, 0.05),
            alpha_r=rng.uniform(0.01, 0.05),
            beta_r=rng.uniform(0.001, 0.01),
            gamma=rng.uniform(1.0, 3.0),
        )
        init = rng.choice([64, 128, 256])
        model = GoodputFunction(perf, GradParams(1.0, rng.uniform(1.0, 1000.0)), init)
        running = job_id <= GPUS
        views.append(
            JobView(
                id=job_id,
                submit_time=float(job_id),
                gpus_requested=rng.choice([1, 1, 1, 2, 4]) if not running else 1,
                batch_size=init,
                init_batch_size=init,
                max_batch_size=init * 16,
                local_bsz_bounds=(16, init * 2),
                adaptive=True,
                max_gpus=16,
                allocation=(1,) if running else (),
                attained_service=rng.uniform(0, 7200) if running else 0.0,
                run_time=rng.uniform(0, 7200) if running else 0.0,
                goodput=model,
                remaining_iterations=rng.uniform(1e3, 1e5),
            )
        )
    return ClusterState(nodes=(NodeView("gpu1", GPUS),), jobs=tuple(views))


async def probe_lateness(stop: asyncio.Event, lateness: list[float]) -> None:
    """Sleep 1 ms at a time until `stop`, recording how late each wake-up is."""
    while not stop.is_set():
        expected = time.perf_counter() + 0.001
        await asyncio.sleep(0.001)
        lateness.append(max(0.0, time.perf_counter() - expected))


async def measure(policy: Any, state: ClusterState, runs: int, off_loop: bool) -> dict[str, float]:
    """Decide `runs` times with a probe on the loop; decision times and lateness."""
    daemon = SimpleNamespace(
        policy=policy, decision_in_flight=None, wake=asyncio.Event(), decision_times=DecisionTimes()
    )
    lateness: list[float] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(probe_lateness(stop, lateness))
    await asyncio.sleep(0.01)
    times = []
    for run in range(runs):
        started = time.perf_counter()
        if off_loop:
            decision = await tick.decide(daemon, state, 60.0 * run)  # type: ignore[arg-type]
            assert not isinstance(decision, str), decision
        else:
            policy.decide(state, 60.0 * run)
        times.append(time.perf_counter() - started)
        await asyncio.sleep(0.01)
    stop.set()
    await probe
    ordered = sorted(lateness)
    return {
        "decide_median": statistics.median(times),
        "decide_max": max(times),
        "lag_max": ordered[-1],
        "lag_p99": ordered[int(0.99 * (len(ordered) - 1))],
    }


def main() -> None:
    """Print decision time and loop lateness per policy (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="fifo,tiresias,pollux,gpuq")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    state = busy_state(args.jobs, args.seed)
    print(f"{args.jobs} jobs, {GPUS} GPUs, {args.runs} decisions per policy and mode")
    header = "policy    decide ms (median / max)  off-loop lag ms (p99 / max)  on-loop lag max ms"
    print(header + "  off-loop max / 50 ms")
    for name in args.policies.split(","):
        off = asyncio.run(measure(get_policy(name, seed=args.seed), state, args.runs, True))
        on = asyncio.run(measure(get_policy(name, seed=args.seed), state, args.runs, False))
        print(
            f"{name:<9} {1000 * off['decide_median']:>9.1f} / {1000 * off['decide_max']:<9.1f}"
            f"    {1000 * off['lag_p99']:>9.1f} / {1000 * off['lag_max']:<9.1f}"
            f"      {1000 * on['lag_max']:>9.1f}"
            f"           {off['lag_max'] / TARGET_S:.2f}"
        )


if __name__ == "__main__":
    main()
