"""Run workloads through the simulator, one policy or several side by side.

This is the run loop behind `gpuq sim` and the benchmarks: they parse their
arguments and render the results, and call these functions for the rest.

Workloads (`resolve_workload`)
    `FILE`: a CSV in the artifact's format (`name,time,application,
    num_replicas,batch_size`). `workload-1` ... `workload-4` and
    `workload-0.5-1` ... `workload-0.5-4`: the bundled Pollux traces (1x and
    0.5x load). `philly-1` ... `philly-4` and `saturn-1` ... `saturn-5`: the
    bundled Sia traces (Philly and Helios Saturn, 160 jobs each).
    `gen:SEED[:tuned|realistic][:LOAD]`: a workload drawn by the Pollux
    recipe for this cluster's GPU count (`generate_workload`; TunedJobs by
    default, load 1). `lab:SEED[:tuned|realistic][:LOAD]`: the generator's
    lab variant, drawn for one server of 8 GPUs whatever the cluster
    (`lab_workload`; load 1.5, 30 jobs). An existing file wins over a
    bundled name.

Policies
    By registry name (`gpuq.policies.registry`), optionally with constructor
    options: `NAME:KEY=VALUE[:KEY=VALUE...]`, such as `gpuq:starts=free` or
    `pollux:p=-0.5`, so variants of one policy can run side by side.

Several policies
    `run_policies` runs each policy on the same workload, in worker
    processes (each policy in its own) when more than one worker is allowed,
    else one after the other in this process.

numpy, scipy and the simulator's tables are imported inside the functions,
so importing this module stays light.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from gpuq.errors import UsageError
from gpuq.workloads import WORKLOAD_FORMS

if TYPE_CHECKING:
    from gpuq.sim.cluster import SimCluster
    from gpuq.sim.engine import SimProgress
    from gpuq.sim.fair import SimLab
    from gpuq.sim.workload import WorkloadJob


WORKLOAD_HINT = f"give {WORKLOAD_FORMS}"


MAX_GPUS = 8192
"""The most GPUs of a simulated cluster: a hundred times the papers' 64, and minutes to run."""


@dataclass(frozen=True, slots=True)
class SimSettings:
    """The cluster and simulator settings shared by every policy of one run.

    With a `cluster`, `nodes` and `gpus_per_node` only describe it (its node
    count and largest node), for workload generators.
    """

    nodes: int = 16
    gpus_per_node: int = 4
    interval: float = 60.0
    restart_penalty: float = 30.0
    interference: float = 0.0
    seed: int = 0
    cluster: SimCluster | None = None
    """Nodes with GPU types (`gpuq.sim.cluster`); None: `nodes` x `gpus_per_node` T4."""
    lab: SimLab | None = None
    """Fair-share settings (`gpuq.sim.fair`); None: the defaults where jobs have users."""

    def check(self) -> None:
        """Raise UsageError for settings the simulator cannot run (NaN and infinity included)."""
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise UsageError(
                "--nodes and --gpus-per-node must be at least 1",
                hint="the default cluster is 16 nodes of 4 GPUs; --cluster names others",
            )
        total = self.nodes * self.gpus_per_node if self.cluster is None else self.cluster.total_gpus
        if total > MAX_GPUS:
            raise UsageError(
                f"a cluster of {total} GPUs is past what gpuq sim models: {MAX_GPUS} at most",
                hint="the default cluster is 16 nodes of 4 GPUs; the Pollux and Sia papers "
                "simulate 64",
            )
        if not (self.interval > 0 and math.isfinite(self.interval)):
            raise UsageError(
                f"--interval must be a positive number of seconds, got {self.interval:g}",
                hint="the policies decide every 60 s by default",
            )
        if not (self.restart_penalty >= 0 and math.isfinite(self.restart_penalty)):
            raise UsageError(
                f"--restart-penalty must be a number of seconds, 0 or more, "
                f"got {self.restart_penalty:g}",
                hint="each (re)start costs 30 s by default; 0 makes reallocations free",
            )
        if not 0.0 <= self.interference < 1.0:
            raise UsageError(
                f"--interference must be in [0, 1), got {self.interference:g}",
                hint="0 (the default) is no slowdown; 0.25 slows jobs that share a node by 25%",
            )
        if self.seed < 0:
            raise UsageError(
                f"--seed must be 0 or more, got {self.seed}", "e.g. --seed 1; 0 is the default"
            )


@dataclass(frozen=True)
class Generated:
    """A `gen:` or `lab:` workload value, parsed."""

    lab: bool
    seed: int
    variant: Literal["tuned", "realistic"]
    load: float


def parse_generated(spec: str) -> Generated | None:
    """The generator's arguments in `spec`; None if it names no generator; UsageError if bad.

    The seed must be a whole number from 0, the load a number in
    (0, `MAX_LOAD`]: a load of L draws L times the reference count of jobs.
    """
    from gpuq.sim.workload import LAB_LOAD, MAX_LOAD

    if not spec.startswith(("gen:", "lab:")):
        return None
    lab = spec.startswith("lab:")
    parts = spec.split(":")[1:]
    try:
        seed = int(parts[0])
        variant: Literal["tuned", "realistic"] = "tuned"
        load = LAB_LOAD if lab else 1.0
        for part in parts[1:]:
            if part in ("tuned", "realistic"):
                variant = "realistic" if part == "realistic" else "tuned"
            else:
                load = float(part)
    except (IndexError, ValueError):
        raise UsageError(f"bad generated workload {spec!r}", hint=WORKLOAD_HINT) from None
    if seed < 0:
        raise UsageError(
            f"bad generated workload {spec!r}: the seed must be 0 or more", hint=WORKLOAD_HINT
        )
    if not (0 < load <= MAX_LOAD):  # NaN fails too
        raise UsageError(
            f"bad generated workload {spec!r}: the load must be in (0, {MAX_LOAD:g}], got {load:g}",
            hint=f"1 is the Pollux recipe's load{' (lab: 1.5, 30 jobs)' if lab else ''}",
        )
    return Generated(lab, seed, variant, load)


def check_workload(spec: str) -> None:
    """Refuse a `--workload` value that names no workload, before any work is done."""
    from gpuq.sim.workload import BUNDLED_WORKLOADS

    if parse_generated(spec) is None and not Path(spec).is_file() and spec not in BUNDLED_WORKLOADS:
        raise UsageError(f"no workload file or bundled workload {spec!r}", hint=WORKLOAD_HINT)


def resolve_workload(spec: str, gpus: int, gpus_per_node: int) -> tuple[WorkloadJob, ...]:
    """The jobs of a `--workload` value (module docstring), for a cluster of `gpus` GPUs."""
    from gpuq.sim.workload import (
        BUNDLED_WORKLOADS,
        bundled_workload,
        generate_workload,
        lab_workload,
        load_workload,
    )

    generated = parse_generated(spec)
    if generated is not None:
        if generated.lab:
            return lab_workload(generated.seed, variant=generated.variant, load=generated.load)
        return generate_workload(
            generated.seed,
            variant=generated.variant,
            load=generated.load,
            cluster_gpus=gpus,
            gpus_per_node=gpus_per_node,
        )
    if Path(spec).is_file():
        return load_workload(spec)
    if spec in BUNDLED_WORKLOADS:
        return bundled_workload(spec)
    raise UsageError(f"no workload file or bundled workload {spec!r}", hint=WORKLOAD_HINT)


def policy_names(policy: str | None, compare: str | None) -> list[str]:
    """The policies to run, in order, each known and present (else a UsageError)."""
    from gpuq.policies.registry import get_policy

    names: list[str] = []
    for name in [policy or "", *(compare or "").split(",")]:
        name = name.strip()
        if name and name not in names:
            names.append(name)
    if not names:
        raise UsageError("no policy given", hint="use --policy NAME or --compare a,b,c")
    for name in names:
        get_policy(name)  # unknown or missing: a UsageError listing the known ones
    return names


def run_policy(
    name: str,
    workload: tuple[WorkloadJob, ...],
    settings: SimSettings,
    progress: Callable[[SimProgress], None] | None = None,
) -> dict[str, Any]:
    """Simulate one policy on `workload`; its summary metrics (JSON-ready)."""
    from gpuq.policies.registry import get_policy
    from gpuq.sim.engine import Simulator

    simulator = Simulator(
        get_policy(name, settings.seed),
        workload,
        nodes=settings.nodes,
        gpus_per_node=settings.gpus_per_node,
        interval=settings.interval,
        restart_penalty=settings.restart_penalty,
        interference=settings.interference,
        seed=settings.seed,
        cluster=settings.cluster,
        lab=settings.lab,
    )
    result = simulator.run(progress=progress)
    summary: dict[str, Any] = result.summary()
    summary.pop("policy", None)
    users = result.users()
    if users:
        summary["users"] = users
    return summary


def parse_users(text: str) -> dict[str, float]:
    """`NAME=NUMBER,...` (`alice=10,bob=1`) as a mapping; UsageError if malformed.

    For the options that name users with a number each: the weights of
    `assign_users`, the copies of `copies_for_users`, the shares of `SimLab`.
    """
    parsed: dict[str, float] = {}
    for part in text.split(","):
        name, equals, value = part.strip().partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not equals or not name or not 0 <= number < math.inf or name in parsed:
            raise UsageError(
                f"bad user entry {part.strip()!r} in {text!r}",
                hint="write NAME=NUMBER pairs separated by commas, such as alice=10,bob=1",
            )
        parsed[name] = number
    return parsed


def run_policies(
    names: list[str],
    workload: tuple[WorkloadJob, ...],
    settings: SimSettings,
    workers: int,
    report: Callable[[str], None] = lambda text: None,
) -> dict[str, dict[str, Any]]:
    """Every policy's summary, in `names` order; in worker processes when worthwhile.

    `report` gets a one-line status as the runs progress: the percentage of
    the workload's jobs finished for a run in this process, or how many
    policies have finished when they run in worker processes.
    """
    if workers <= 1 or len(names) == 1:
        results = {}
        for name in names:
            results[name] = run_policy(name, workload, settings, _percent(f"sim {name}", report))
        return results
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    done: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    context = multiprocessing.get_context("spawn")
    pool_size = min(workers, len(names))
    with ProcessPoolExecutor(pool_size, mp_context=context, initializer=one_thread) as pool:
        futures = {pool.submit(run_policy, name, workload, settings): name for name in names}
        report(f"sim: 0/{len(names)} policies done")
        for future in as_completed(futures):
            name = futures[future]
            done[name] = future.result()
            elapsed = time.monotonic() - started
            report(f"sim: {len(done)}/{len(names)} policies done ({name}, {elapsed:.0f} s)")
    return {name: done[name] for name in names}


def _percent(label: str, report: Callable[[str], None]) -> Callable[[SimProgress], None]:
    """A simulator callback reporting `label: NN% (finished/total jobs)`."""

    def update(snapshot: SimProgress) -> None:
        done = snapshot.finished / snapshot.total if snapshot.total else 1.0
        report(f"{label}: {int(100 * done)}% ({snapshot.finished}/{snapshot.total} jobs)")

    return update


def one_thread() -> None:
    """Keep each worker's numeric libraries to one thread: the workers fill the CPUs."""
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")
