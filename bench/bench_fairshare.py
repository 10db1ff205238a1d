"""Fair share across users in the simulator: `python -m bench.bench_fairshare`.

Two users, `heavy` submitting ten times the work of `light` (each job of a
base workload ten times, against once: `gpuq.sim.copies_for_users`), the
`gpuq` policy, 60 s ticks, 4-GPU nodes, the default lab settings (equal
shares, a week's half-life). Two scenarios:

- arrivals (`--seeds`, default 0 1 2): the base is every `--every`th job
  (5) of `lab:SEED` (a day of a lab's submissions) on `--nodes` nodes (2: 8
  GPUs, busy). Per seed and user: the configured share, the GPU-time share
  over the whole run and while the light user has jobs, its decayed usage
  and fair-share factor at the end, jobs and average JCT. Then the light
  user's average JCT with fair share, alone on half the cluster, and
  without fair share (the same jobs, no users), with the ratios to alone;
  and the max-min checks: the light user's mean GPUs in the ticks where
  one of its jobs waits (against its share), and the GPUs held in the
  ticks where any job waits.
- backlog: the first 8 (shares 1:1) or 6 (shares 3:1) jobs of `lab:0`, all
  submitted at once, on 2 nodes: each user's GPU-time share over the ticks
  in which both have a job waiting, and over the first 30 of them.

It prints the tables on stdout, progress on stderr; a few minutes on two
cores. The acceptance criteria are those of tests/test_sim_fairshare.py.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from gpuq.cli.render import table
from gpuq.fairshare import FairShare
from gpuq.policies.registry import get_policy
from gpuq.sim import SimLab, Simulator, WorkloadJob, copies_for_users
from gpuq.sim.fair import UserTick, all_backlogged, gpu_time_shares
from gpuq.sim.metrics import SimResult
from gpuq.sim.workload import lab_workload

COPIES = {"heavy": 10, "light": 1}
GPUS_PER_NODE = 4


def simulate(work: tuple[WorkloadJob, ...], nodes: int, lab: SimLab | None = None) -> SimResult:
    """The `gpuq` policy on `nodes` nodes of 4 GPUs, timed on stderr."""
    started = time.perf_counter()
    result = Simulator(get_policy("gpuq"), work, nodes=nodes, gpus_per_node=4, lab=lab).run()
    print(
        f"  {len(work)} jobs on {nodes * 4} GPUs: {time.perf_counter() - started:.0f} s",
        file=sys.stderr,
    )
    return result


def light_jct(result: SimResult) -> float:
    """Average JCT of the light user's jobs (by name: they keep it without users)."""
    jcts = [job.jct for job in result.jobs if job.name.endswith("-light-0")]
    return sum(jcts) / len(jcts)


def final_standing(ticks: tuple[UserTick, ...], lab: SimLab) -> dict[str, tuple[float, float]]:
    """Each user's decayed usage (GPU-hours) and factor after the run, as the engine keeps them."""
    account = FairShare(lab.half_life)
    for tick in ticks:
        account.record_all(dict(tick.gpus), 60.0, tick.time + 60.0)
    standing = account.standings(account.usage, lab.share_of)
    return {user: (s.usage / 3600.0, s.factor) for user, s in standing.items()}


def mean(values: list[float]) -> float:
    """The mean, NaN for none."""
    return sum(values) / len(values) if values else float("nan")


def arrivals(seed: int, every: int, nodes: int) -> tuple[list[list[str]], list[str]]:
    """One seed's rows per user and its light-JCT row."""
    print(f"arrivals, lab:{seed}", file=sys.stderr)
    base = lab_workload(seed)[::every]
    work = copies_for_users(base, COPIES)
    lab = SimLab()
    shared = simulate(work, nodes, lab)
    alone = simulate(tuple(job for job in work if job.user == "light"), max(nodes // 2, 1))
    unfair = simulate(tuple(replace(job, user="") for job in work), nodes)
    ticks = shared.user_ticks
    overall = gpu_time_shares(ticks)
    light_on = gpu_time_shares(ticks, lambda tick: tick.active.get("light", 0) > 0)
    standing = final_standing(ticks, lab)
    figures = shared.users()
    rows = []
    for user in sorted(figures):
        usage, factor = standing.get(user, (0.0, 1.0))
        rows.append(
            [
                str(seed),
                user,
                f"{lab.share_of(user) / sum(lab.share_of(u) for u in figures):.2f}",
                f"{overall.get(user, 0.0):.3f}",
                f"{light_on.get(user, 0.0):.3f}",
                f"{usage:.1f}",
                f"{factor:.3f}",
                str(figures[user]["jobs"]),
                f"{float(figures[user]['avg_jct']) / 3600:.2f}",
            ]
        )
    share = nodes * GPUS_PER_NODE / 2
    light_waits = [t.gpus.get("light", 0.0) for t in ticks if t.waiting.get("light", 0)]
    held = [sum(t.gpus.values()) for t in ticks if sum(t.waiting.values())]
    fair, solo, plain = light_jct(shared), light_jct(alone), light_jct(unfair)
    jct = [
        str(seed),
        f"{shared.gpu_utilization:.2f}",
        f"{fair / 3600:.2f}",
        f"{solo / 3600:.2f}",
        f"{plain / 3600:.2f}",
        f"{fair / solo:.2f}",
        f"{plain / solo:.2f}",
        f"{len(light_waits)}: {mean(light_waits):.1f} of {share:g}" if light_waits else "none",
        f"{mean(held):.2f} of {nodes * GPUS_PER_NODE}",
    ]
    return rows, jct


def backlog(shares: dict[str, float], base_jobs: int) -> list[list[str]]:
    """Rows per user: configured share, share over the contention window and its first 30 ticks."""
    print(f"backlog, shares {shares}", file=sys.stderr)
    base = tuple(replace(job, time=0.0) for job in lab_workload(0)[:base_jobs])
    result = simulate(copies_for_users(base, COPIES), 2, SimLab(shares))
    window = [tick for tick in result.user_ticks if all_backlogged(tick)]
    whole, first = gpu_time_shares(window), gpu_time_shares(window[:30])
    total = sum(shares.values())
    label = ":".join(f"{shares[u]:g}" for u in sorted(shares))
    return [
        [
            label,
            user,
            f"{shares[user] / total:.3f}",
            str(len(window)),
            f"{whole.get(user, 0.0):.3f}",
            f"{whole.get(user, 0.0) / (shares[user] / total):.3f}",
            f"{first.get(user, 0.0):.3f}",
        ]
        for user in sorted(shares)
    ]


def main(argv: list[str] | None = None) -> int:
    """Run both scenarios and print their tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args(argv)
    users, jcts = [], []
    for seed in args.seeds:
        rows, jct = arrivals(seed, args.every, args.nodes)
        users.extend(rows)
        jcts.append(jct)
    print("Arrivals: heavy submits 10x the work of light (equal shares)")
    print(
        table(
            [
                "seed",
                "user",
                "share",
                "gpu-time",
                "while light",
                "usage GPU-h",
                "factor",
                "jobs",
                "avg JCT h",
            ],
            users,
        )
    )
    print()
    print("Light user's average JCT (hours): with fair share, alone on half, without")
    print(
        table(
            [
                "seed",
                "util",
                "fair",
                "alone/2",
                "unfair",
                "fair/alone",
                "unfair/alone",
                "light waits: GPUs",
                "held when any waits",
            ],
            jcts,
        )
    )
    print()
    rows = backlog({"heavy": 1.0, "light": 1.0}, 8) + backlog({"heavy": 3.0, "light": 1.0}, 6)
    print("Backlog: every job at once; GPU-time shares while both have a job waiting")
    print(table(["shares", "user", "configured", "ticks", "measured", "ratio", "first 30"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
