"""Time and quality of `pollux` decisions: `python -m bench.bench_pollux`.

The cluster has 16 nodes x 4 GPUs. Its jobs come from the six Pollux
applications (`APPS`: throughput parameters fitted with `fit_perf_params` to
the artifact's step-time tables, gradient-noise ratios from its validation
tables, rounded), each job with its own jittered copy, so every job has its
own goodput model. A share of them has never run and has no model yet; the
others have run on up to 16 GPUs and hold the GPUs they had.

A run is a sequence of decisions 60 s apart. After each, the decision is
applied (allocations, restarts, profiled GPUs, attained service), a fifth of
the modelled jobs get new gradient statistics (a new epoch) and three jobs
are replaced by new arrivals, so each decision sees new models as it would in
the simulator. The first decision is cold (every model new).

Printed, for 160 jobs (the acceptance case) and for 40 jobs (fewer jobs than
GPUs, where the search has the most freedom):
- the median wall-clock and CPU time of the decisions after the first, and
  its ratio to the 0.2 s target; the first decision's time; generations run;
- quality: each decision's FITNESS_p relative to a reference setting with
  5x the generations and no early stop, run on the same states, and the
  same for the artifact's operators alone (no greedy seed) at the default
  budget.

No test asserts wall-clock times; this machine is shared, so CPU time is
printed beside wall time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, replace

import numpy as np

from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.interface import ClusterState, Decision, JobView, NodeView
from gpuq.policies.pollux.policy import PolluxPolicy

TARGET_S = 0.2
NODES, GPUS_PER_NODE = 16, 4
TICK_S = 60.0


@dataclass(frozen=True)
class App:
    """One Pollux application: fitted step-time model and batch limits."""

    perf: PerfParams
    noise_ratio: float  # grad var / grad sqr, mid-training
    init_batch_size: int
    max_batch_size: int
    local_bsz_bounds: tuple[int, int]
    weight: float  # share of jobs
    fixed_batch: int = 0  # non-adaptive (NCF under Pollux: batch 32768 on one GPU)


APPS = {
    "cifar10": App(
        PerfParams(0.017, 0.0007, 0.12, 0.0038, 0.0002, 0.0, 2.25), 25, 128, 4096, (32, 1024), 0.3
    ),
    "bert": App(PerfParams(0.17, 0.059, 1.30, 0.010, 0.24, 0.010, 1.6), 35, 12, 384, (4, 12), 0.15),
    "deepspeech2": App(
        PerfParams(0.27, 0.024, 0.54, 0.013, 0.034, 0.0, 1.6), 480, 20, 640, (10, 80), 0.15
    ),
    "imagenet": App(
        PerfParams(0.063, 0.0045, 0.33, 0.0062, 0.12, 0.0009, 2.8), 52, 200, 12800, (20, 200), 0.1
    ),
    "yolov3": App(PerfParams(0.18, 0.025, 0.78, 0.011, 0.32, 0.0, 1.15), 61, 8, 512, (4, 8), 0.15),
    "ncf": App(
        PerfParams(0.0068, 1e-6, 0.015, 0.0009, 0.0078, 0.0, 1.24),
        27000,
        256,
        32768,
        (32, 5803),
        0.15,
        fixed_batch=32768,
    ),
}


def model(app: App, rng: np.random.Generator) -> GoodputFunction:
    """The app's model with per-job jitter of step times and noise scale."""
    perf = app.perf
    alphas_betas = (perf.alpha_c, perf.beta_c, perf.alpha_n, perf.beta_n, perf.alpha_r, perf.beta_r)
    ac, bc, an, bn, ar, br = (v * float(rng.uniform(0.8, 1.25)) for v in alphas_betas)
    jittered = PerfParams(ac, bc, an, bn, ar, br, perf.gamma)
    return GoodputFunction(jittered, new_grad(app, rng), app.init_batch_size)


def new_grad(app: App, rng: np.random.Generator) -> GradParams:
    """Gradient statistics of a new epoch: the app's noise ratio, jittered."""
    return GradParams(1.0, app.noise_ratio * float(rng.lognormal(0.0, 0.7)))


def new_job(job_id: int, now: float, rng: np.random.Generator, ran: bool) -> tuple[JobView, str]:
    """A job of a random app; `ran` ones have a model and a history."""
    names = list(APPS)
    name = str(rng.choice(names, p=[APPS[n].weight for n in names]))
    app = APPS[name]
    profiled = int(rng.choice([1, 2, 4, 8, 16])) if ran else 0
    view = JobView(
        id=job_id,
        submit_time=now - float(rng.uniform(60.0, 4 * 3600.0)) if ran else now - 30.0,
        batch_size=app.fixed_batch or app.init_batch_size,
        init_batch_size=app.init_batch_size,
        max_batch_size=app.max_batch_size,
        local_bsz_bounds=app.local_bsz_bounds,
        adaptive=not app.fixed_batch,
        max_gpus=1 if app.fixed_batch else 1 << 30,
        application=name,
        attained_service=float(rng.uniform(0, 3600.0 * profiled)),
        num_restarts=int(rng.integers(0, 6)) if ran else 0,
        max_profiled_gpus=profiled,
        goodput=model(app, rng) if ran else None,
    )
    return view, name


def initial_state(jobs: int, now: float, rng: np.random.Generator) -> ClusterState:
    """`jobs` jobs, a third never run; the others fill the cluster in random order."""
    views = [new_job(i, now, rng, ran=rng.random() > 1 / 3)[0] for i in range(jobs)]
    free = [GPUS_PER_NODE] * NODES
    spanned = [False] * NODES
    for index in rng.permutation(jobs):
        view = views[index]
        want = min(view.max_profiled_gpus, view.max_gpus)
        if want == 0:
            continue
        allocation = [0] * NODES
        for node in np.argsort([-f for f in free], kind="stable"):
            if want == 0 or free[node] == 0 or (spanned[node] and want > free[node]):
                continue
            take = min(want, free[node])
            allocation[node], free[node], want = take, free[node] - take, want - take
        used = [i for i, c in enumerate(allocation) if c]
        if len(used) > 1 and any(spanned[i] for i in used):
            for i in used:
                free[i] += allocation[i]
            continue
        for i in used:
            spanned[i] = spanned[i] or len(used) > 1
        views[index] = replace(view, allocation=tuple(allocation))
    nodes = tuple(NodeView(f"node{i}", GPUS_PER_NODE) for i in range(NODES))
    return ClusterState(nodes, tuple(views))


def advance(
    state: ClusterState, decision: Decision, now: float, rng: np.random.Generator, next_id: int
) -> ClusterState:
    """Apply `decision`, start new epochs for some jobs and replace three jobs."""
    views = []
    for view in state.jobs:
        allocation = tuple(decision.allocations.get(view.id, ()))
        gpus = sum(allocation)
        changed = allocation != (view.allocation if any(view.allocation) else ())
        app = APPS[view.application]
        goodput = view.goodput
        if gpus and goodput is None:
            goodput = model(app, rng)
        elif goodput is not None and rng.random() < 0.2:
            goodput = replace(goodput, grad=new_grad(app, rng))
        views.append(
            replace(
                view,
                allocation=allocation,
                num_restarts=view.num_restarts + int(changed and bool(view.allocation)),
                max_profiled_gpus=max(view.max_profiled_gpus, gpus),
                attained_service=view.attained_service + gpus * TICK_S,
                goodput=goodput,
            )
        )
    for offset, index in enumerate(rng.choice(len(views), size=3, replace=False)):
        views[index] = new_job(next_id + offset, now, rng, ran=False)[0]
    return replace(state, jobs=tuple(sorted(views, key=lambda v: v.id)))


@dataclass
class Run:
    """One policy over the run's states: per-decision wall and CPU times, fitness."""

    wall: list[float]
    cpu: list[float]
    generations: list[int]
    fitness: list[float]


def states(jobs: int, decisions: int, seed: int) -> list[tuple[ClusterState, float]]:
    """The run's states, driven by the default policy's decisions."""
    rng = np.random.default_rng(seed)
    now = 4 * 3600.0
    state = initial_state(jobs, now, rng)
    policy = PolluxPolicy(seed=seed)
    sequence = []
    for tick in range(decisions):
        sequence.append((state, now))
        decision = policy.decide(state, now)
        now += TICK_S
        state = advance(state, decision, now, rng, next_id=1000 + 3 * tick)
    return sequence


def measure(policy: PolluxPolicy, sequence: list[tuple[ClusterState, float]]) -> Run:
    """Decide every state in order, timing each decision and scoring it."""
    run = Run([], [], [], [])
    judge = PolluxPolicy()
    for state, now in sequence:
        wall, cpu = time.perf_counter(), time.process_time()
        decision = policy.decide(state, now)
        run.cpu.append(time.process_time() - cpu)
        run.wall.append(time.perf_counter() - wall)
        run.generations.append(policy.last_generations)
        run.fitness.append(judge.fitness(state, now, decision.allocations))
    return run


def report(jobs: int, decisions: int, seed: int) -> None:
    """Print decision times and fitness ratios for one cluster load."""
    sequence = states(jobs, decisions, seed)
    fast = measure(PolluxPolicy(seed=seed), sequence)
    reference = measure(PolluxPolicy(seed=seed, generations=500, patience=500), sequence)
    artifact = measure(PolluxPolicy(seed=seed, greedy=False), sequence)
    wall, cpu = statistics.median(fast.wall[1:]), statistics.median(fast.cpu[1:])
    generations = statistics.median(fast.generations)
    print(f"{jobs} jobs on {NODES} x {GPUS_PER_NODE} GPUs, {decisions} decisions")
    print(
        f"  decision time, median after the first: {wall * 1e3:.1f} ms wall, {cpu * 1e3:.1f} ms CPU"
    )
    print(f"  ratio to {TARGET_S:.1f} s: {wall / TARGET_S:.2f} wall, {cpu / TARGET_S:.2f} CPU")
    first_wall, first_cpu = fast.wall[0] * 1e3, fast.cpu[0] * 1e3
    print(f"  first (cold) decision: {first_wall:.1f} ms wall, {first_cpu:.1f} ms CPU")
    print(f"  generations: median {generations}, max {max(fast.generations)}")
    reference_cpu = statistics.median(reference.cpu)
    print(f"  reference (500 generations, no early stop): {reference_cpu:.2f} s CPU")
    for label, run in (("default", fast), ("no greedy seed", artifact)):
        ratios = [a / b for a, b in zip(run.fitness, reference.fitness, strict=True)]
        mean, worst = statistics.mean(ratios), min(ratios)
        print(f"  fitness, {label} / reference: mean {mean:.4f}, min {worst:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decisions", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, nargs="*", default=[160, 40])
    args = parser.parse_args()
    for jobs in args.jobs:
        report(jobs, args.decisions, args.seed)


if __name__ == "__main__":
    main()
