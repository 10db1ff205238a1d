"""Live against simulated: `python -m bench.bench_live_vs_sim`.

Issue 11's first acceptance test. One workload (default `lab:1`, the
generator's lab variant: 30 jobs for one server of 8 GPUs) runs under each
policy (default gpuq, pollux, gandiva, fifo) twice: in the simulator
(`gpuq.sim`, one node of `--gpus` GPUs) and live, replayed by
`gpuq.replay.run.replay` on a fresh daemon with as many fake GPUs whose
`[scheduler]` section is the simulator's time constants compressed by
`--speedup` (`gpuq.replay.timescale.live_settings`). Printed per policy:
the simulated and live average JCT, p99 JCT and makespan (simulated
seconds), and live / simulated for each; then both orderings of the
policies by average JCT. The targets: live average JCT within 10% of the
simulator's for gpuq and pollux, and the same ordering. `--json FILE`
writes every summary, each job's record, and the live daemon's decision
times (`gpuq daemon status`).

Speedup. A replay lasts the workload's makespan / speedup of real time,
and every real second a job spends off its compressed schedule counts
`speedup` simulated seconds. The replay keeps those few: trace jobs start
through a fork server in tens of milliseconds rather than after seconds of
importing torch, leave their GPUs within 20 ms of a suspend request, and
count the daemon's share of a restart (exit, requeue, spawn) within the
restart penalty (`gpuq.replay.tracejob`). What is left is of the order of
0.1 s per event (a job's exit noticed, a new job's first decision), 6
simulated seconds at 60x. The default, 60 (a simulated minute per real
second: the simulator's tick is the daemon's interval, 1 s), keeps that
near 1% of the lab workload's JCTs (averages of 25-50 simulated minutes)
while its four replays take 50 minutes together (makespans of 11-13
simulated hours); 30x would double the time for little, 120x doubles the
per-event cost (the tests' short version runs at 60x too: 8 jobs, about
ten minutes).

Ties. Where the simulator gives two policies the same average JCT (gpuq
makes Pollux's decisions whenever no GPU stands idle with a job waiting,
which in a busy lab is always), their order is a tie, and the live order of
that pair is not compared: the report says so and gives their live ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuq.policies.registry import get_policy
from gpuq.replay.forkserver import ForkServer
from gpuq.replay.run import ReplayProgress, ReplaySettings, replay
from gpuq.replay.timescale import live_settings
from gpuq.sim.engine import Simulator
from gpuq.sim.metrics import SimResult
from gpuq.sim.run import resolve_workload
from gpuq.sim.workload import WorkloadJob
from tests.daemon_harness import running_daemon

POLICIES = ("gpuq", "pollux", "gandiva", "fifo")
AGREEMENT = 0.10
"""Live average JCT within this fraction of the simulator's (gpuq, pollux)."""
CHECKED = ("gpuq", "pollux")
"""The policies whose average JCT must agree (the issue's acceptance)."""
METRICS = ("avg_jct", "p99_jct", "makespan")


def fake_gpus(count: int) -> str:
    """The config lines declaring `count` fake GPUs."""
    return f'[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = {count}\n'


def simulate(policy: str, workload: tuple[WorkloadJob, ...], gpus: int) -> dict[str, Any]:
    """The simulator's summary of `policy` on one node of `gpus` GPUs, with its jobs."""
    simulator = Simulator(get_policy(policy), workload, nodes=1, gpus_per_node=gpus)
    return with_jobs(simulator.run())


def with_jobs(result: SimResult) -> dict[str, Any]:
    """A result's summary, with each job's record under "jobs" (for the JSON file)."""
    summary: dict[str, Any] = result.summary()
    summary["jobs"] = [asdict(job) for job in result.jobs]
    return summary


def live(
    policy: str,
    workload: tuple[WorkloadJob, ...],
    gpus: int,
    speedup: float,
    root: Path,
    report: bool = False,
) -> dict[str, Any]:
    """The summary of `policy` replayed on a fresh daemon with `gpus` fake GPUs."""
    settings = live_settings(policy, speedup)
    with running_daemon(root, gpus_toml=fake_gpus(gpus), extra_toml=settings) as daemon:
        started = time.monotonic()
        shown: list[tuple[int, int]] = []

        def show(progress: ReplayProgress) -> None:
            counts = (progress.submitted, progress.ended)
            if report and (not shown or shown[-1] != counts):
                shown.append(counts)
                elapsed = time.monotonic() - started
                print(
                    f"  {policy} live: {progress.submitted}/{progress.total} submitted, "
                    f"{progress.ended} ended, {elapsed:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )

        with ForkServer() as server, daemon.client() as client:
            replay_settings = ReplaySettings(
                speedup=speedup, cwd=str(root), fork_server=str(server.path)
            )
            result = replay(client, workload, replay_settings, show)
            status = client.call("status")
    summary = with_jobs(result)
    summary["real_seconds"] = time.monotonic() - started
    summary["daemon_decisions"] = status.get("decisions", {}).get(status.get("policy"), {})
    return summary


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every policy's simulated and live summaries, and what they say."""

    simulated: dict[str, dict[str, Any]]
    live: dict[str, dict[str, Any]]

    def ratio(self, policy: str, metric: str = "avg_jct") -> float:
        """Live over simulated for one policy's metric."""
        return float(self.live[policy][metric]) / float(self.simulated[policy][metric])

    def ordering(self, results: dict[str, dict[str, Any]]) -> list[str]:
        """Policies from the best average JCT to the worst."""
        return sorted(results, key=lambda policy: float(results[policy]["avg_jct"]))

    def ties(self) -> list[tuple[str, str]]:
        """Pairs of policies the simulator gives the same average JCT (module docstring)."""
        names = list(self.simulated)
        return [
            (a, b)
            for i, a in enumerate(names)
            for b in names[i + 1 :]
            if self.simulated[a]["avg_jct"] == self.simulated[b]["avg_jct"]
        ]

    def same_ordering(self) -> bool:
        """True if every pair the simulator orders is ordered alike live."""
        tied = {frozenset(pair) for pair in self.ties()}
        names = list(self.simulated)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if frozenset((a, b)) in tied:
                    continue
                simulated = self.simulated[a]["avg_jct"] < self.simulated[b]["avg_jct"]
                if simulated != (self.live[a]["avg_jct"] < self.live[b]["avg_jct"]):
                    return False
        return True

    def agrees(self, checked: Sequence[str] = CHECKED) -> bool:
        """True if the checked policies agree within `AGREEMENT` and the ordering holds."""
        close = all(abs(self.ratio(p) - 1.0) <= AGREEMENT for p in checked if p in self.simulated)
        return close and self.same_ordering()

    def table(self) -> str:
        """The report: one line per policy, then the orderings."""
        lines = [
            "policy    sim avg JCT  live avg JCT  live/sim   sim p99  live p99  live/sim"
            "   sim makespan  live makespan  live/sim  live real s"
        ]
        for policy in self.simulated:
            sim, got = self.simulated[policy], self.live[policy]
            lines.append(
                f"{policy:<9} {sim['avg_jct']:>11.0f}  {got['avg_jct']:>12.0f}  "
                f"{self.ratio(policy):>8.3f}  {sim['p99_jct']:>8.0f}  {got['p99_jct']:>8.0f}  "
                f"{self.ratio(policy, 'p99_jct'):>8.3f}  {sim['makespan']:>13.0f}  "
                f"{got['makespan']:>13.0f}  {self.ratio(policy, 'makespan'):>8.3f}"
                f"  {got.get('real_seconds', 0.0):>11.0f}"
            )
        lines.append(f"simulated ordering: {' < '.join(self.ordering(self.simulated))}")
        lines.append(f"live ordering:      {' < '.join(self.ordering(self.live))}")
        for a, b in self.ties():
            lines.append(
                f"tied in the simulator: {a} and {b} (live {a}/{b}: "
                f"{self.live[a]['avg_jct'] / self.live[b]['avg_jct']:.3f}), not ordered"
            )
        lines.append(f"same ordering: {'yes' if self.same_ordering() else 'NO'}")
        for policy in CHECKED:
            if policy in self.simulated:
                ok = abs(self.ratio(policy) - 1.0) <= AGREEMENT
                lines.append(
                    f"{policy}: live avg JCT {self.ratio(policy):.3f} of simulated "
                    f"({'within' if ok else 'NOT within'} {AGREEMENT:.0%})"
                )
        return "\n".join(lines)


def compare(
    workload: tuple[WorkloadJob, ...],
    policies: Sequence[str],
    gpus: int,
    speedup: float,
    root: Path,
    report: bool = False,
) -> Comparison:
    """Run every policy simulated and live (each on its own daemon under `root`)."""
    simulated, measured = {}, {}
    for policy in policies:
        simulated[policy] = simulate(policy, workload, gpus)
        measured[policy] = live(policy, workload, gpus, speedup, root / policy, report)
    return Comparison(simulated, measured)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparison and print it (module docstring); exit 1 if it does not agree."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="lab:1")
    parser.add_argument("--first", type=int, help="only the first N jobs to arrive")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs of the one server")
    parser.add_argument("--speedup", type=float, default=60.0)
    parser.add_argument("--json", metavar="FILE", help="write every summary there")
    args = parser.parse_args(argv)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    workload = resolve_workload(args.workload, args.gpus, args.gpus)[: args.first or None]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    print(
        f"{args.workload}: {len(workload)} jobs on {args.gpus} GPUs, speedup {args.speedup:g}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="gq-livesim-") as folder:
        comparison = compare(workload, policies, args.gpus, args.speedup, Path(folder), True)
    print(comparison.table())
    if args.json:
        document = {
            "workload": args.workload,
            "jobs": len(workload),
            "gpus": args.gpus,
            "speedup": args.speedup,
            "simulated": comparison.simulated,
            "live": comparison.live,
        }
        Path(args.json).write_text(json.dumps(document, indent=2))
    if not comparison.agrees():
        sys.exit(1)


if __name__ == "__main__":
    main()
