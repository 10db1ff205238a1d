"""Decision time on clusters of several GPU types: `python -m bench.bench_decide_types`.

Times `decide()` of `sia` and `gpuq` (or `--policies`), side by side in
one run, at two sizes: Sia's mixed 64-GPU cluster with 160 active jobs
(targets: median under 0.1 s, longest under 0.5 s), and the same cluster
scaled 8x, 512 GPUs, with 1,000 jobs (target: median under 1 s).

Jobs are drawn from Sia's Philly trace mix (cifar10, deepspeech2, bert,
yolov3, imagenet) with seeded randomness. Each job's model on each type is
fitted to that type's measured tables (`gpuq.sim.apps`), so every job of
one application shares its models, as jobs seen on the same
configurations do in the simulator; `--fresh` refits every job's models
with a little noise each round (each job's own model, the hardest case for
memos). The policy decides `--rounds` rounds in a row, each round's
allocations becoming the next one's current ones and jobs one interval
older; the first round (cold memos) is reported apart. No test runs this.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace

from gpuq.goodput import GoodputFunction, PerfParams, fit_perf_params
from gpuq.policies.interface import ClusterState, JobView, NodeView, TypeModel
from gpuq.policies.registry import get_policy
from gpuq.sim.apps import get_application
from gpuq.sim.cluster import load_cluster
from gpuq.typemodels import scale_perf

APPS = ("cifar10", "deepspeech2", "bert", "yolov3", "imagenet")
SIZES = ((1, 160, 0.1, 0.5), (8, 1000, 1.0, None))
"""(cluster scale, jobs, median target s, longest target s or None)."""


def fitted(app_name: str, kind: str) -> PerfParams:
    """The application's step-time model on `kind`, fitted to its measured tables."""
    return fit_perf_params(*get_application(app_name, kind, "sia").measured_samples())


def cluster_nodes(scale: int) -> tuple[NodeView, ...]:
    """Sia's mixed cluster with every node group `scale` times as large."""
    base = load_cluster("sia").nodes
    return tuple(
        NodeView(f"{node.name}-{copy}", node.gpus, node.gpu_type)
        for node in base
        for copy in range(scale)
    )


def jobs_for(count: int, kinds: tuple[str, ...], seed: int) -> list[JobView]:
    """`count` adaptive jobs with models on every type, none running yet."""
    rng = random.Random(seed)
    models = {(a, k): fitted(a, k) for a in APPS for k in kinds}
    jobs = []
    for i in range(count):
        name = rng.choice(APPS)
        app = get_application(name, kinds[0], "sia")
        grad = app.grad_params(0, app.init_batch_size)
        per_type = {
            kind: TypeModel(
                GoodputFunction(models[(name, kind)], grad, app.init_batch_size),
                get_application(name, kind, "sia").local_bsz_bounds,
                measured=True,
            )
            for kind in kinds
        }
        jobs.append(
            JobView(
                id=i,
                submit_time=-rng.uniform(0, 4 * 3600),
                adaptive=True,
                batch_size=app.init_batch_size,
                init_batch_size=app.init_batch_size,
                max_batch_size=app.max_batch_size,
                local_bsz_bounds=app.local_bsz_bounds,
                max_profiled_gpus=rng.choice((1, 2, 4, 8)),
                application=name,
                per_type=per_type,
                goodput=per_type[kinds[0]].goodput,
                restart_penalty=app.restart_delay,
            )
        )
    return jobs


def refreshed(job: JobView, rng: random.Random) -> JobView:
    """The job with each type's model refitted (scaled by a little noise)."""
    per_type = {}
    for kind, model in job.per_type.items():
        goodput = model.goodput
        assert goodput is not None
        perf = scale_perf(goodput.perf, rng.uniform(0.97, 1.03))
        per_type[kind] = replace(model, goodput=replace(goodput, perf=perf))
    return replace(job, per_type=per_type)


def time_policy(
    policy_name: str, scale: int, count: int, rounds: int, fresh: bool, seed: int
) -> tuple[float, list[float]]:
    """The first decision's seconds, and each later round's."""
    nodes = cluster_nodes(scale)
    kinds = tuple(dict.fromkeys(node.gpu_type for node in nodes))
    jobs = jobs_for(count, kinds, seed)
    policy = get_policy(policy_name, seed)
    rng = random.Random(seed + 1)
    times = []
    now = 0.0
    for _ in range(rounds + 1):
        state = ClusterState(nodes=nodes, jobs=tuple(jobs), interval=60.0)
        started = time.perf_counter()
        decision = policy.decide(state, now)
        times.append(time.perf_counter() - started)
        jobs = [
            replace(
                refreshed(job, rng) if fresh else job,
                allocation=tuple(decision.allocations.get(job.id, ())),
                max_profiled_gpus=max(
                    job.max_profiled_gpus, sum(decision.allocations.get(job.id, ()))
                ),
            )
            for job in jobs
        ]
        now += 60.0
    return times[0], times[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="sia,gpuq")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args(argv)
    policies = [p for p in args.policies.split(",") if p]
    failed = []
    for scale, count, median_target, max_target in SIZES:
        gpus = sum(node.gpus for node in cluster_nodes(scale))
        print(
            f"\n{gpus} GPUs, {count} jobs, {args.rounds} rounds" + (", fresh models" * args.fresh)
        )
        for name in policies:
            first, rest = time_policy(name, scale, count, args.rounds, args.fresh, args.seed)
            median, longest = statistics.median(rest), max(rest)
            verdict = median < median_target and (max_target is None or longest < max_target)
            limits = f"median < {median_target} s" + (
                f", max < {max_target} s" if max_target is not None else ""
            )
            print(
                f"  {name:6} median {median * 1000:7.1f} ms  max {longest * 1000:7.1f} ms  "
                f"first {first * 1000:7.1f} ms  ({limits}: {'ok' if verdict else 'NO'})"
            )
            if not verdict:
                failed.append(f"{name} at {gpus} GPUs")
    for line in failed:
        print(f"FAILED: {line}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
