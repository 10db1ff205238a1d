"""Every policy side by side on the Pollux workloads: `python bench/bench_compare.py`.

Runs each registered policy (`gpuq.policies.registry`) on the bundled
workloads 1-4, their 0.5x-load versions, and 4 generated TunedJobs workloads
(seeds 1-4), on the paper's 16 x 4-GPU cluster with a 60 s interval and a
30 s restart penalty, in parallel worker processes (`--jobs`, default: the
CPUs; each worker one BLAS thread). A policy whose module is not in this
build is reported as missing; a run that fails is reported with its error.

It prints, on stdout:

- one table per workload: average and p99 JCT, average and worst
  finish-time fairness (rho), reallocations and decision time, with the
  published simulator's average JCT beside pollux, tiresias and optimus
  (Pollux OSDI'21; workloads 1-4 only) and the difference, flagged over 15%;
- the acceptance checks: pollux's average JCT, averaged over workloads 1-4
  (the mean of the four averages), at least 25% below tiresias's and 40%
  below optimus's; pollux below both at 0.5x load; gpuq within 2% of the
  best average JCT on every workload, with a p99 JCT and worst rho no worse
  than pollux's (over several seeds: the paired ratio and its 95% interval,
  `gpuq.sim.metrics.paired_ratio`; worse only when the whole interval lies
  above 1); pollux's longest decision against the 0.2 s target;
- the wall time against the 15-minute budget, and the summed run time of
  the workload 1-4 runs divided by the workers (the budget's own scope);
- a markdown table (average JCT per policy and workload, published figures
  in parentheses) to paste into bench/RESULTS.md.

`--seeds 0,1,2` runs every (policy, workload) pair once per policy seed (the
randomized policies, pollux, gpuq and ones, decide differently per seed):
the tables and checks then use the mean of each metric over the seeds, and a
section lists each pair's spread (lowest and highest average JCT, p99 JCT
and worst rho), to tell a policy's real differences from its search noise.

`--policies` takes registry names with options (`gpuq:starts=free`), so a
variant runs beside the default; each `gpuq` variant is checked against the
other policies and pollux as `gpuq` is.

Progress goes to stderr. No test runs this: it takes minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import sys
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from gpuq.cli.render import table
from gpuq.policies.registry import (
    POLICY_NAMES,
    available_policies,
    split_policy_spec,
)
from gpuq.sim.metrics import paired_ratio
from gpuq.sim.run import SimSettings, one_thread, resolve_workload, run_policy

BUDGET_S = 15 * 60.0
DECISION_TARGET_S = 0.2
MAIN = tuple(f"workload-{i}" for i in range(1, 5))
HALF = tuple(f"workload-0.5-{i}" for i in range(1, 5))
GENERATED = tuple(f"gen:{seed}" for seed in range(1, 5))
PUBLISHED: dict[str, tuple[float, ...]] = {
    "pollux": (2089, 3323, 2188, 2721),
    "tiresias": (2474, 5145, 3876, 3280),
    "optimus": (4087, 6914, 3944, 5968),
}
"""The published simulator's average JCT (s) on workloads 1-4 (Tiresias and
Optimus with TunedJobs, Optimus with the oracle)."""
SLOW_FIRST = ("optimus", "pollux", "ones", "gpuq", "gandiva", "afs", "afs-p")


SPREAD_METRICS = ("avg_jct", "p99_jct", "max_rho")
"""Metrics whose range over seeds the spread section reports."""


@dataclass
class Outcome:
    """One (policy, workload) pair: its summary (mean over seeds), or the error that ended it."""

    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)
    seeds: int = 1
    runs: tuple[dict[str, Any], ...] = ()
    """Each seed's own summary, in seed order."""


def combine(runs: list[Outcome]) -> Outcome:
    """One pair's outcome over seeds: mean of every numeric metric, ranges, summed seconds."""
    failed = [run for run in runs if run.error]
    if failed:
        return Outcome(error=failed[0].error, seconds=sum(r.seconds for r in runs))
    summary: dict[str, Any] = {}
    for key, value in runs[0].summary.items():
        values = [run.summary[key] for run in runs]
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        varies = any(v != value for v in values)
        summary[key] = sum(values) / len(values) if numeric and varies else value
    spread = {
        key: (min(r.summary[key] for r in runs), max(r.summary[key] for r in runs))
        for key in SPREAD_METRICS
        if key in summary
    }
    return Outcome(
        summary,
        sum(r.seconds for r in runs),
        spread=spread,
        seeds=len(runs),
        runs=tuple(run.summary for run in runs),
    )


def timed_run(name: str, workload_name: str, settings: SimSettings) -> tuple[dict[str, Any], float]:
    """Run one policy on one workload in a worker; the summary and the run's seconds."""
    started = time.perf_counter()
    gpus = settings.nodes * settings.gpus_per_node
    jobs = resolve_workload(workload_name, gpus, settings.gpus_per_node)
    summary = run_policy(name, jobs, settings)
    return summary, time.perf_counter() - started


def run_all(
    policies: list[str],
    workloads: list[str],
    settings: SimSettings,
    workers: int,
    seeds: tuple[int, ...] = (0,),
) -> dict[tuple[str, str], Outcome]:
    """Every (policy, workload) outcome over `seeds`, slow policies submitted first."""
    tasks = sorted(
        ((p, w, seed) for seed in seeds for w in workloads for p in policies),
        key=lambda task: SLOW_FIRST.index(task[0]) if task[0] in SLOW_FIRST else 99,
    )
    runs: dict[tuple[str, str, int], Outcome] = {}
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=one_thread) as pool:
        futures: dict[Future[tuple[dict[str, Any], float]], tuple[str, str, int]] = {
            pool.submit(timed_run, p, w, dataclasses.replace(settings, seed=seed)): (p, w, seed)
            for p, w, seed in tasks
        }
        for future in as_completed(futures):
            task = futures[future]
            try:
                summary, seconds = future.result()
                runs[task] = Outcome(summary, seconds)
            except Exception as error:  # noqa: BLE001 - reported in the tables; others go on
                traceback.print_exception(error, file=sys.stderr)
                runs[task] = Outcome(error=f"{type(error).__name__}: {error}")
            label = f"{task[0]} on {task[1]}" + (f", seed {task[2]}" if len(seeds) > 1 else "")
            print(f"\r{len(runs)}/{len(tasks)} runs done ({label})", end="", file=sys.stderr)
    print(file=sys.stderr)
    return {
        (p, w): combine([runs[(p, w, seed)] for seed in seeds]) for w in workloads for p in policies
    }


def published(policy: str, workload: str) -> float | None:
    """The published average JCT of `policy` on `workload`, if there is one."""
    if policy in PUBLISHED and workload in MAIN:
        return PUBLISHED[policy][MAIN.index(workload)]
    return None


def workload_table(
    workload: str, policies: list[str], outcomes: dict[tuple[str, str], Outcome]
) -> str:
    """One workload: a row per policy, with the published figure and the difference."""
    header = [
        "policy",
        "avg JCT",
        "p99 JCT",
        "rho avg",
        "rho max",
        "realloc",
        "decide ms",
        "paper",
        "diff",
    ]
    rows = []
    for policy in policies:
        outcome = outcomes[(policy, workload)]
        if outcome.error:
            rows.append([policy, f"error: {outcome.error[:60]}", *[""] * 7])
            continue
        s = outcome.summary
        paper = published(policy, workload)
        diff = "" if paper is None else f"{100 * (s['avg_jct'] / paper - 1):+.1f}%"
        if paper is not None and abs(s["avg_jct"] / paper - 1) > 0.15:
            diff += " (>15%)"
        rows.append(
            [
                policy,
                f"{s['avg_jct']:.0f}",
                f"{s['p99_jct']:.0f}",
                f"{s['avg_rho']:.2f}",
                f"{s['max_rho']:.2f}",
                f"{s['reallocations']:.0f}",
                f"{1000 * s['decision_time_mean']:.1f}",
                "" if paper is None else f"{paper:.0f}",
                diff,
            ]
        )
    return table(header, rows)


def mean_jct(
    policy: str, workloads: tuple[str, ...], outcomes: dict[tuple[str, str], Outcome]
) -> float | None:
    """The mean of a policy's average JCTs over `workloads`, if every run succeeded."""
    values = [outcomes.get((policy, w), Outcome(error="not run")) for w in workloads]
    if any(v.error for v in values):
        return None
    return sum(float(v.summary["avg_jct"]) for v in values) / len(values)


def acceptance(
    policies: list[str], workloads: list[str], outcomes: dict[tuple[str, str], Outcome]
) -> list[str]:
    """The acceptance checks that the runs at hand allow, one line each."""
    lines = []
    for group, label in ((MAIN, "workloads 1-4"), (HALF, "0.5x workloads 1-4")):
        pollux = mean_jct("pollux", group, outcomes)
        for rival, needed in (("tiresias", 0.25), ("optimus", 0.40)):
            other = mean_jct(rival, group, outcomes)
            if pollux is None or other is None:
                lines.append(f"pollux vs {rival} on {label}: not available")
                continue
            cut = 1 - pollux / other
            target = needed if group is MAIN else 0.0
            verdict = "ok" if cut >= target else "FAIL"
            lines.append(
                f"pollux vs {rival} on {label}: {pollux:.0f} s vs {other:.0f} s, "
                f"{100 * cut:.1f}% lower (need >= {100 * target:.0f}%): {verdict}"
            )
    ours_names = [p for p in policies if split_policy_spec(p)[0] == "gpuq"] or ["gpuq"]
    for workload in workloads:
        done = {p: outcomes[(p, workload)] for p in policies if not outcomes[(p, workload)].error}
        for name in ours_names:
            if name not in done:
                lines.append(f"{name} on {workload}: not available")
                continue
            # The best of the others and this variant: variants do not compete with each other.
            rivals = [p for p in done if p == name or p not in ours_names]
            best_name = min(rivals, key=lambda p: done[p].summary["avg_jct"])
            best = done[best_name].summary["avg_jct"]
            ratio = done[name].summary["avg_jct"] / best
            verdict = "ok" if ratio <= 1.02 else "FAIL"
            line = f"{name} on {workload}: {ratio:.3f} x best ({best_name}) avg JCT: {verdict}"
            if "pollux" in done:
                line += "".join(
                    f"; {label} " + against_pollux(done[name], done["pollux"], key)
                    for key, label in (("p99_jct", "p99"), ("max_rho", "rho max"))
                )
            lines.append(line)
    slowest = [
        outcomes[("pollux", w)].summary["decision_time_max"]
        for w in MAIN
        if ("pollux", w) in outcomes and not outcomes[("pollux", w)].error
    ]
    if slowest:
        worst = max(slowest)
        verdict = "ok" if worst < DECISION_TARGET_S else "FAIL"
        lines.append(
            f"pollux longest decision on workloads 1-4: {worst:.3f} s "
            f"(target {DECISION_TARGET_S} s, ratio {worst / DECISION_TARGET_S:.2f}): {verdict}"
        )
    return lines


def against_pollux(ours: Outcome, theirs: Outcome, key: str) -> str:
    """`key` of gpuq against pollux: means, and over seeds the paired ratio and its verdict."""
    mean = f"{ours.summary[key]:.4g} vs pollux {theirs.summary[key]:.4g}"
    if ours.seeds < 2 or ours.seeds != theirs.seeds:
        return f"{mean}: " + ("ok" if ours.summary[key] <= theirs.summary[key] else "FAIL")
    paired = paired_ratio([run[key] for run in ours.runs], [run[key] for run in theirs.runs])
    verdict = {"lower": "ok", "same": "ok (same within noise)", "higher": "FAIL"}[paired.verdict]
    if paired.verdict == "same" and paired.ratio <= 1.0:
        verdict = "ok"
    return (
        f"{mean}, ratio {paired.ratio:.3f} [{paired.low:.3f}, {paired.high:.3f}] "
        f"over {paired.pairs} seeds: {verdict}"
    )


def markdown(
    policies: list[str], workloads: list[str], outcomes: dict[tuple[str, str], Outcome]
) -> str:
    """Average JCT (s) per policy and workload, published figures in parentheses."""
    lines = [
        "| policy | " + " | ".join(workloads) + " |",
        "| --- |" + " ---: |" * len(workloads),
    ]
    for policy in policies:
        cells = []
        for workload in workloads:
            outcome = outcomes[(policy, workload)]
            if outcome.error:
                cells.append("error")
                continue
            cell = f"{outcome.summary['avg_jct']:.0f}"
            paper = published(policy, workload)
            cells.append(cell if paper is None else f"{cell} ({paper:.0f})")
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def spread_lines(
    policies: list[str], workloads: list[str], outcomes: dict[tuple[str, str], Outcome]
) -> list[str]:
    """Each pair's range over seeds: average JCT, p99 JCT and worst rho (low-high)."""
    lines = []
    for workload in workloads:
        for policy in policies:
            outcome = outcomes[(policy, workload)]
            if outcome.error or outcome.seeds < 2:
                continue
            avg, p99, rho = (outcome.spread[key] for key in SPREAD_METRICS)
            lines.append(
                f"{workload} {policy} ({outcome.seeds} seeds): avg JCT {avg[0]:.0f}-{avg[1]:.0f}"
                f", p99 {p99[0]:.0f}-{p99[1]:.0f}, rho max {rho[0]:.2f}-{rho[1]:.2f}"
            )
    return lines


def main() -> None:
    """Run the comparison and print the tables, checks, timings and markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default=",".join(POLICY_NAMES))
    parser.add_argument("--workloads", default=",".join((*MAIN, *HALF, *GENERATED)))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--seeds", default="0", help="policy seeds, comma-separated; metrics are their mean"
    )
    args = parser.parse_args()

    wanted = [p for p in args.policies.split(",") if p]
    available = set(available_policies())
    missing = [p for p in wanted if split_policy_spec(p)[0] not in available]
    policies = [p for p in wanted if p not in missing]
    workloads = [w for w in args.workloads.split(",") if w]
    settings = SimSettings()
    workers = max(1, args.jobs)
    try:
        seeds = tuple(int(seed) for seed in args.seeds.split(",") if seed)
    except ValueError:
        parser.error(f"--seeds takes integers separated by commas, got {args.seeds!r}")
    if not seeds:
        parser.error("--seeds needs at least one seed")

    started = time.perf_counter()
    outcomes = run_all(policies, workloads, settings, workers, seeds)
    wall = time.perf_counter() - started

    if missing:
        print(f"missing (no module in this build): {', '.join(missing)}\n")
    for workload in workloads:
        count = next(
            (o.summary["jobs"] for (_, w), o in outcomes.items() if w == workload and not o.error),
            "?",
        )
        print(f"## {workload} ({count} jobs)\n")
        print(workload_table(workload, policies, outcomes))
        print()
    print("## Acceptance\n")
    for line in acceptance(policies, workloads, outcomes):
        print(f"- {line}")
    spread = spread_lines(policies, workloads, outcomes)
    if spread:
        print(f"\n## Spread over seeds {','.join(map(str, seeds))}\n")
        for line in spread:
            print(f"- {line}")
    main_seconds = sum(o.seconds for (_, w), o in outcomes.items() if w in MAIN)
    print("\n## Time\n")
    print(
        f"- wall time: {wall:.0f} s for {len(outcomes) * len(seeds)} runs on {workers} workers "
        f"(budget {BUDGET_S:.0f} s for workloads 1-4 x all policies)"
    )
    if main_seconds:
        estimate = main_seconds / workers
        print(
            f"- workloads 1-4 x {len(policies)} policies: {main_seconds:.0f} s of runs, "
            f"about {estimate:.0f} s on {workers} workers, "
            f"ratio {estimate / BUDGET_S:.2f} to the budget"
        )
    print("\n## Markdown (average JCT, s; published in parentheses)\n")
    print(markdown(policies, workloads, outcomes))


if __name__ == "__main__":
    main()
