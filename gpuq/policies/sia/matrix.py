"""Sia's goodput matrix G, one row per job over the configurations it may take.

Rules (Sia 3.3 and the artifact's `sia.py`; each tested in
`tests/test_policy_sia.py`):

Candidates
    A job's configurations (`gpuq.policies.sia.configs`) with at least
    max(`min_gpus`, 1) GPUs and at most its cap: min(`max_growth` x
    max(`max_profiled_gpus`, 1), batch limit, `max_gpus`, the policy's
    `max_gpus`), raised to its minimum; the batch limit is `max_batch_size`
    (adaptive) or `batch_size` (fixed) over the type's smallest per-GPU
    batch. So a job at most doubles per round, and a rigid job (`min_gpus`
    = `max_gpus`) gets only configurations of exactly its count. A
    `spread` keeps the configurations of exactly that many nodes; a
    placement constraint (`JobView.nodes`) keeps the pools, and node counts,
    its nodes allow. A running job may always keep its current
    configuration, if it has one and it is within [minimum, `max_gpus`].
Values
    G[i, j] is job i's goodput on configuration j (`gpuq.policies.sia.goodputs`),
    divided by its smallest positive value over the candidates, times
    max(`min_gpus`, 1): "effective GPUs", 1 (or N_min) at the worst option.
    A configuration where the model predicts no progress gets no entry.
Unknown goodput
    On a type where the job has no model, its smallest configurations of
    that type (and its current one, if there) get the row's minimum value,
    as the artifact gives 1 on the one-GPU configurations; a job with no
    model anywhere (or none predicting progress) gets only those: 1 GPU, or
    exactly its minimum, on every type.
Prior for a new job (`Limits.prior`, gpuq's rule; off in Sia's)
    A job with no model anywhere instead gets every candidate valued by the
    prior: m s_t (k / m)^0.8 for k GPUs of type t, m its minimum and s_t
    the type's prior single-GPU speed over the cluster's slowest
    (`gpuq.gputypes.relative_speed`; a type without one counts as the
    slowest). Why: under Sia's rule a new job starts on one GPU of whatever
    type the ILP finds for it, and moves a round later, once its first start
    has measured it (cifar10 on Sia's tables: a 50 s restart in a 60 s
    round, then growth by doubling); the prior starts it on up to its cap (2
    GPUs) of the fastest free type, where its model usually takes it.
Restart factor
    Every configuration except the current one is multiplied by
    r = max(T - N S, 0) / (T + S), with T the job's age (`now - submit_time`),
    N its restarts and S its `restart_penalty` (else the state's); r = 1
    while T < S (the artifact). Starting a pending job counts as a change.
Room
    A configuration needs `nodes` of the job's allowed nodes in its pool
    with `per_node` GPUs free of jobs that cannot be preempted (the current
    configuration excepted). Normalization comes first, so only the job's
    limits, not other jobs, set its scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuq.gputypes import relative_speed
from gpuq.policies.interface import JobView
from gpuq.policies.sia.columns import BoolArray, Columns, IntArray
from gpuq.policies.sia.configs import Config, Pool, exact_config, spread_configs
from gpuq.policies.sia.goodputs import FloatArray, GoodputMemo, model_on


def restart_factor(age: float, restarts: int, penalty: float) -> float:
    """Sia's r: `max(T - N S, 0) / (T + S)`, and 1 while T < S."""
    if age < penalty or age + penalty <= 0:
        return 1.0
    return max(age - restarts * penalty, 0.0) / (age + penalty)


def gpu_limit(job: JobView, min_local: int, max_growth: int, max_gpus: int) -> int:
    """The most GPUs `job` may get this round, before its minimum raises it."""
    explore = max_growth * max(job.max_profiled_gpus, 1)
    batch = job.max_batch_size if job.adaptive else job.batch_size
    by_batch = max(batch // max(min_local, 1), 1) if batch > 0 else max_gpus
    return max(min(explore, by_batch, job.max_gpus, max_gpus), 1)


@dataclass(frozen=True, slots=True)
class Row:
    """A job's row of G: its columns, their values after the restart factor."""

    job: JobView
    columns: IntArray
    values: FloatArray
    """G times the restart factor (the current configuration unscaled)."""
    current: Config | None
    current_column: int
    """The current configuration's column, or -1."""
    factor: float


@dataclass(frozen=True, slots=True)
class Limits:
    """The policy's options that shape rows."""

    max_growth: int
    max_gpus: int
    prior: bool = False
    """Value a job with no model by the types' prior speeds (module docstring)."""


PRIOR_SCALING = 0.8
"""k GPUs are worth k ** 0.8 of one in the prior: about 87% efficiency at 2 GPUs."""


def type_speeds(types: Sequence[str]) -> FloatArray:
    """Each type's prior single-GPU speed over the slowest of `types` (unknown: the slowest)."""
    known = [speed for kind in types if (speed := relative_speed(kind)) is not None]
    slowest = min(known, default=1.0)
    return np.array([(relative_speed(kind) or slowest) / slowest for kind in types])


def prior_values(speeds: FloatArray, gpus: IntArray, least: IntArray | int) -> FloatArray:
    """The prior's value of `gpus` GPUs of types with `speeds`, for a minimum of `least`."""
    least = np.asarray(least, dtype=np.float64)
    return least * speeds * np.power(gpus / least, PRIOR_SCALING)


def job_rows(
    jobs: Sequence[tuple[JobView, Config | None, float]],
    columns: Columns,
    names: Sequence[str],
    limits: Limits,
    memo: GoodputMemo,
) -> list[Row]:
    """The rows of G of (job, current configuration, restart factor) triples, in order.

    Jobs without a placement constraint or multi-node spread, whose minimum
    and current shape are standard configurations (nearly all), are done
    together as (jobs x standard columns) matrices; the rest by `job_row`.
    """
    memo.prefill(
        (memo.curve(job, model, bounds), columns.token, kind, *columns.standard_shapes[kind])
        for job, _, _ in jobs
        for kind, (model, bounds) in enumerate(model_on(job, t) for t in columns.types)
        if model is not None
    )
    size = columns.standard
    pool, nodes, gpus, fits = (array[:size] for array in columns.arrays())
    rows: list[Row | None] = [None] * len(jobs)
    batch: list[int] = []
    for index, (job, held_config, factor) in enumerate(jobs):
        minimum = max(job.min_gpus, 1)
        usual = minimum == 1 or all(minimum in counts for counts in _counts(columns, job.spread))
        if job.nodes is None and job.spread in (None, 1) and usual:
            if held_config is None or 0 <= columns.find(held_config) < size:
                batch.append(index)
                continue
        rows[index] = job_row(job, columns, names, held_config, limits, memo, factor)
    count, kinds = len(batch), len(columns.types)
    least = np.ones(count, dtype=np.int64)
    caps = np.zeros((count, kinds), dtype=np.int64)
    single = np.zeros(count, dtype=bool)
    ceiling = np.zeros(count, dtype=np.int64)
    current = np.full(count, -1, dtype=np.int64)
    factors = np.ones(count)
    raw = np.zeros((count, size))
    unknown = np.zeros((count, size), dtype=bool)
    for r, index in enumerate(batch):
        job, config, factor = jobs[index]
        least[r] = max(job.min_gpus, 1)
        single[r] = job.spread == 1
        ceiling[r] = max(job.max_gpus, least[r])
        current[r] = columns.find(config)
        factors[r] = factor
        for kind, where in enumerate(columns.standard_by_type):
            model, bounds = model_on(job, columns.types[kind])
            cap = gpu_limit(job, bounds[0], limits.max_growth, limits.max_gpus)
            caps[r, kind] = max(cap, least[r])
            if model is None:
                unknown[r, where] = True
            else:
                curve = memo.curve(job, model, bounds)
                shape = columns.standard_shapes[kind]
                raw[r, where] = curve.standard(columns.token, kind, *shape)
    kind_of = columns.type_of_pool[pool]
    allowed = (gpus >= least[:, None]) & (gpus <= caps[:, kind_of])
    allowed &= ~single[:, None] | (nodes == 1)
    is_current = np.arange(size) == current[:, None]
    held = np.where(current >= 0, gpus[current], 0)
    keeps = (current >= 0) & (least <= held) & (held <= ceiling) & (~single | (nodes[current] == 1))
    is_current &= keeps[:, None]
    allowed |= is_current
    positive = allowed & (raw > 0) & ~unknown
    smallest = np.where(positive, raw, np.inf).min(axis=1, initial=np.inf)
    known = np.isfinite(smallest)
    scale = np.where(known, least / np.where(known, smallest, 1.0), 0.0)
    normalized = np.where(allowed & ~unknown, raw * scale[:, None], 0.0)
    unknown = (unknown | ~known[:, None]) & allowed
    for index in range(len(columns.pools)):  # unknown types: each pool's smallest shapes
        here = unknown & (pool == index)
        if here.any():
            least_gpus = np.where(here, gpus, np.iinfo(np.int64).max).min(axis=1)
            mark = here & (gpus == least_gpus[:, None])
            normalized = np.where(mark, least[:, None], normalized)
    normalized = np.where(unknown & is_current, least[:, None], normalized)
    if limits.prior and not known.all():
        speeds = type_speeds(columns.types)[kind_of]
        prior = prior_values(speeds[None, :], gpus[None, :].astype(np.int64), least[:, None])
        normalized = np.where(~known[:, None] & allowed, prior, normalized)
    keep = (normalized > 0) & allowed & (fits | is_current)
    values = normalized * np.where(is_current, 1.0, factors[:, None])
    for r, index in enumerate(batch):
        mine = np.flatnonzero(keep[r])
        job, config, factor = jobs[index]
        column = int(current[r]) if keeps[r] else -1
        rows[index] = Row(job, mine, values[r, mine], config, column, factor)
    return [row for row in rows if row is not None]


def _counts(columns: Columns, spread: int | None) -> list[frozenset[int]]:
    return columns.single_counts if spread == 1 else columns.counts


def job_row(
    job: JobView,
    columns: Columns,
    names: Sequence[str],
    current: Config | None,
    limits: Limits,
    memo: GoodputMemo,
    factor: float,
) -> Row:
    """Job's row of G (module docstring)."""
    least = max(job.min_gpus, 1)
    models = [model_on(job, kind) for kind in columns.types]
    caps = np.array(
        [max(gpu_limit(job, b[0], limits.max_growth, limits.max_gpus), least) for _, b in models],
        dtype=np.int64,
    )
    allowed: dict[int, BoolArray] = {}
    if job.nodes is None and job.spread in (None, 1):
        ids = _standard_candidates(job, columns, least, caps)
    else:
        ids, allowed = _other_candidates(job, columns, names, least, caps)
    current_column = -1
    if current is not None and least <= current.gpus <= max(job.max_gpus, least):
        if job.spread is None or current.nodes == job.spread:
            current_column = columns.add(current)
            if current_column not in ids:
                ids.append(current_column)
    chosen = np.array(ids, dtype=np.int64)
    pool, nodes, gpus, fits = columns.arrays()
    kinds = columns.type_of_pool[pool[chosen]]
    standard = chosen < columns.standard
    raw = np.zeros(chosen.size)
    unknown = np.zeros(chosen.size, dtype=bool)
    for kind, (model, bounds) in enumerate(models):
        mine = kinds == kind
        if not mine.any():
            continue
        if model is None:
            unknown |= mine
            continue
        curve = memo.curve(job, model, bounds)
        table = np.zeros(columns.standard)
        where = columns.standard_by_type[kind]
        table[where] = curve.standard(columns.token, kind, *columns.standard_shapes[kind])
        usual = mine & standard
        raw[usual] = table[chosen[usual]]
        other = mine & ~standard
        if other.any():
            raw[other] = curve.values(nodes[chosen[other]], gpus[chosen[other]])
    positive = raw[raw > 0]
    normalized = raw / positive.min() * least if positive.size else raw
    if not positive.size:
        unknown[:] = True
    for index in np.unique(pool[chosen[unknown]]):  # unknown types: the smallest shapes
        here = unknown & (pool[chosen] == index)
        normalized[here & (gpus[chosen] == gpus[chosen[here]].min())] = least
    normalized[unknown & (chosen == current_column)] = least
    if limits.prior and not positive.size:
        normalized = prior_values(type_speeds(columns.types)[kinds], gpus[chosen], least)
    if allowed:
        room = np.array(
            [columns.room.fits(columns.configs[c], allowed.get(int(pool[c]))) for c in chosen],
            dtype=bool,
        )
    else:
        room = fits[chosen]
    is_current = chosen == current_column
    keep = (normalized > 0) & (room | is_current)
    values = normalized[keep] * np.where(is_current[keep], 1.0, factor)
    return Row(job, chosen[keep], values, current, current_column, factor)


def _standard_candidates(job: JobView, columns: Columns, least: int, caps: IntArray) -> list[int]:
    """Columns of an unconfined job with no spread or a spread of 1 (the common case)."""
    pool, nodes, gpus, _ = columns.arrays()
    standard = slice(0, columns.standard)
    cap = caps[columns.type_of_pool[pool[standard]]]
    mask = (gpus[standard] >= least) & (gpus[standard] <= cap)
    if job.spread == 1:
        mask &= nodes[standard] == 1
    ids: list[int] = np.flatnonzero(mask).tolist()
    if least > 1:
        for index, pool_view in enumerate(columns.pools):
            counts = columns.single_counts[index] if job.spread == 1 else columns.counts[index]
            if least in counts or least > caps[columns.type_of_pool[index]]:
                continue
            exact = exact_config(index, pool_view, least, job.spread)
            if exact is not None:
                ids.append(columns.add(exact))
    return ids


def _other_candidates(
    job: JobView, columns: Columns, names: Sequence[str], least: int, caps: IntArray
) -> tuple[list[int], dict[int, BoolArray]]:
    """Columns of a job with a placement constraint or a multi-node spread, pool by pool."""
    ids: list[int] = []
    allowed_by_pool: dict[int, BoolArray] = {}
    standard = columns.configs[: columns.standard]
    for index, pool in enumerate(columns.pools):
        allowed = None
        if job.nodes is not None:
            allowed = np.array([job.may_run_on(names[n]) for n in pool.nodes], dtype=bool)
            if not allowed.any():
                continue
            allowed_by_pool[index] = allowed
        cap = int(caps[columns.type_of_pool[index]])
        mine = [c for c in standard if c.pool == index]
        for config in _candidates(job, index, pool, mine, least, cap, allowed):
            ids.append(columns.add(config))
    return ids, allowed_by_pool


def _candidates(
    job: JobView,
    index: int,
    pool: Pool,
    standard: Sequence[Config],
    least: int,
    cap: int,
    allowed: BoolArray | None,
) -> list[Config]:
    """The job's configurations in one pool, before room and values."""
    spread = job.spread
    if spread is None:
        shapes: Sequence[Config] = standard
    elif spread == 1:
        shapes = [c for c in standard if c.nodes == 1]
    else:
        shapes = spread_configs(index, pool, spread)
    reachable = len(pool.nodes) if allowed is None else int(allowed.sum())
    mine = [c for c in shapes if least <= c.gpus <= cap and c.nodes <= reachable]
    if least <= cap and all(c.gpus != least for c in mine):
        exact = exact_config(index, pool, least, spread)
        if exact is not None and exact.nodes <= reachable:
            mine.append(exact)
    return mine


__all__ = ["Limits", "Row", "gpu_limit", "job_row", "job_rows", "restart_factor"]
