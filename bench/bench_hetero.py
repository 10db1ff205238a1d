"""Policies on Sia's mixed 64-GPU cluster: `python -m bench.bench_hetero`.

Runs `sia`, `pollux` and `gpuq` (or `--policies`) on Sia's Philly
workloads (`philly-1..4`) and Helios-Saturn workloads (`saturn-1..5`) on
the cluster of its paper's Table 3 (`gpuq sim --cluster sia`: 6x4 T4,
3x8 RTX2080Ti, 2x8 A100), 60 s rounds, Sia's tables and per-model restart
delays, in worker processes (`--jobs`, default: the CPUs), once per seed
of `--seeds`.

It prints, on stdout:

- one table per trace: each policy's average and p99 JCT (hours), worst
  finish-time fairness, restarts per job, mean and max decision time, and
  the draft's Table 3 figure beside it (Philly: Sia 0.6 h, Pollux 1.0 h;
  Helios: Sia 0.7 h, Pollux 1.0 h; mean over its traces) with the gap;
- the acceptance checks of the mixed-GPU work: sia's average JCT over
  pollux's on Philly at most 0.75 (paired by workload and seed, geometric
  mean and 95% interval, `gpuq.sim.metrics.paired_ratio`); each policy
  within 15% of the draft's figure; gpuq's average JCT over sia's at most
  0.95 on each trace, with p99 JCT and worst rho no worse (the whole
  interval above 1 counts as worse). A pair that repeats another seed's
  pair exactly (both runs the same) counts once.

Progress goes to stderr. No test runs this: it takes tens of minutes.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from gpuq.cli.render import table
from gpuq.sim.cluster import load_cluster
from gpuq.sim.metrics import paired_ratio
from gpuq.sim.run import SimSettings, one_thread, resolve_workload, run_policy

TRACES = {
    "philly": tuple(f"philly-{i}" for i in range(1, 5)),
    "saturn": tuple(f"saturn-{i}" for i in range(1, 6)),
}
DRAFT_HOURS = {
    ("philly", "sia"): 0.6,
    ("philly", "pollux"): 1.0,
    ("saturn", "sia"): 0.7,
    ("saturn", "pollux"): 1.0,
}
"""Sia draft, Table 3 (p.10): mean average JCT over its traces, hours."""
SLOW_FIRST = ("pollux", "gpuq", "sia")

Key = tuple[str, str, int]
"""(policy, workload, seed)."""


def timed_run(policy: str, workload: str, seed: int) -> tuple[dict[str, Any], float]:
    """One run on the `sia` cluster, in a worker: its summary and seconds."""
    started = time.perf_counter()
    cluster = load_cluster("sia")
    settings = SimSettings(len(cluster.nodes), 8, seed=seed, cluster=cluster)
    summary = run_policy(policy, resolve_workload(workload, cluster.total_gpus, 8), settings)
    return summary, time.perf_counter() - started


def run_all(
    policies: list[str], workloads: list[str], seeds: list[int], workers: int
) -> dict[Key, dict[str, Any]]:
    """Every run's summary, slow policies first, in `workers` processes."""
    tasks = sorted(
        ((p, w, s) for s in seeds for w in workloads for p in policies),
        key=lambda t: SLOW_FIRST.index(t[0]) if t[0] in SLOW_FIRST else 99,
    )
    results: dict[Key, dict[str, Any]] = {}
    started = time.monotonic()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=one_thread) as pool:
        futures = {pool.submit(timed_run, *task): task for task in tasks}
        for future in as_completed(futures):
            task = futures[future]
            summary, seconds = future.result()
            results[task] = summary
            print(
                f"[{len(results)}/{len(tasks)}] {task[0]} {task[1]} seed {task[2]}: "
                f"avg JCT {summary['avg_jct'] / 3600:.2f} h in {seconds:.0f} s "
                f"({time.monotonic() - started:.0f} s in all)",
                file=sys.stderr,
                flush=True,
            )
    return results


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def report(
    results: dict[Key, dict[str, Any]], policies: list[str], seeds: list[int], traces: list[str]
) -> list[str]:
    """Print the tables and checks; the failed checks' lines."""
    failed: list[str] = []
    for trace in traces:
        workloads = TRACES[trace]
        rows = []
        for policy in policies:
            runs = [results[(policy, w, s)] for w in workloads for s in seeds]
            avg = mean([r["avg_jct"] for r in runs]) / 3600
            draft = DRAFT_HOURS.get((trace, policy))
            gap = f"{avg / draft - 1:+.0%}" if draft else ""
            restarts = mean([r["reallocations"] / r["jobs"] for r in runs])
            rows.append(
                [
                    policy,
                    f"{avg:.2f}",
                    f"{mean([r['p99_jct'] for r in runs]) / 3600:.1f}",
                    f"{max(r['max_rho'] for r in runs):.2f}",
                    f"{restarts:.1f}",
                    f"{mean([r['decision_time_mean'] for r in runs]) * 1000:.0f}",
                    f"{max(r['decision_time_max'] for r in runs) * 1000:.0f}",
                    f"{draft:.1f}" if draft else "",
                    gap,
                ]
            )
            if draft and abs(avg / draft - 1) > 0.15:
                failed.append(f"{trace} {policy}: {avg:.2f} h vs the draft's {draft:.1f} h")
        print(f"\n{trace} ({len(workloads)} workloads x {len(seeds)} seeds)")
        header = ["policy", "avg JCT h", "p99 h", "worst rho", "restarts/job",
                  "decide ms", "max ms", "draft h", "gap"]  # fmt: skip
        print(table(header, rows))

    def paired(ours: str, theirs: str, trace: str, metric: str) -> Any:
        # A seed that changes neither run of a workload adds no evidence: Sia's
        # tables carry no noise, so `sia` and `gpuq` give the same run for every seed.
        pairs = {
            (w, results[(ours, w, s)][metric], results[(theirs, w, s)][metric]): None
            for w in TRACES[trace]
            for s in seeds
        }
        return paired_ratio([a for _, a, _ in pairs], [b for _, _, b in pairs])

    print("\nchecks")
    if {"sia", "pollux"} <= set(policies) and "philly" in traces:
        ratio = paired("sia", "pollux", "philly", "avg_jct")
        ok = ratio.ratio <= 0.75
        print(f"  sia / pollux avg JCT on philly: {ratio} (target <= 0.75): {'ok' if ok else 'NO'}")
        if not ok:
            failed.append("sia / pollux on philly above 0.75")
    if {"sia", "gpuq"} <= set(policies):
        for trace in traces:
            avg = paired("gpuq", "sia", trace, "avg_jct")
            p99 = paired("gpuq", "sia", trace, "p99_jct")
            rho = paired("gpuq", "sia", trace, "max_rho")
            worse = [name for name, r in (("p99", p99), ("worst rho", rho)) if r.low > 1]
            ok = avg.ratio <= 0.95 and not worse
            print(
                f"  gpuq / sia on {trace}: avg JCT {avg} (target <= 0.95), p99 {p99}, "
                f"worst rho {rho}: {'ok' if ok else 'NO'}"
            )
            if not ok:
                failed.append(f"gpuq / sia on {trace}")
    for line in failed:
        print(f"  FAILED: {line}")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="sia,pollux,gpuq")
    parser.add_argument("--traces", default="philly,saturn")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    traces = [t for t in args.traces.split(",") if t]
    unknown = [t for t in traces if t not in TRACES]
    if unknown:
        parser.error(f"unknown trace {unknown[0]!r}; known: {', '.join(TRACES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    workloads = [w for t in traces for w in TRACES[t]]
    started = time.monotonic()
    results = run_all(policies, workloads, seeds, max(1, args.jobs))
    failed = report(results, policies, seeds, traces)
    print(f"\nwall time {time.monotonic() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
