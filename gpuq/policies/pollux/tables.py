"""SPEEDUP tables for the `pollux` policy: per job, by (nodes used, GPUs).

`SpeedupTables.build` returns a `[jobs, nodes + 1, GPUs + 1]` array whose
entry `[j, k, r]` is job j's SPEEDUP on r GPUs spread over k nodes, relative
to its fair share (rules in `gpuq.policies.pollux.policy`). Entries for placements
that cannot exist (k > r, or r GPUs that do not fit on k nodes) are 0, as is
`[j, 0, 0]`. Goodput depends on the nodes a job spans only through "one node
or more" (`gpuq.goodput`: T_sync switches to the inter-node terms once N > 1),
so each table is evaluated at one and two nodes and the two-node values are
copied to every larger span; a test checks this against `SpeedupFunction`.
Goodput models are memoized per (model, batch limits) with every value
computed from them, and with their finished table rows per (cap, fair
share, cluster shape), so a decision evaluates only models that are new
since the previous one and copies the others' rows (the memo keeps only the
last decision's models).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np
from numpy.typing import NDArray

from gpuq.goodput import SpeedupFunction
from gpuq.policies.interface import JobView

FloatArray = NDArray[np.float64]


def fewest_nodes(node_gpus: Sequence[int] | NDArray[np.int16], max_gpus: int) -> NDArray[np.intp]:
    """For each count 0..max_gpus, the fewest nodes that hold it (largest nodes first).

    A count the cluster cannot hold gets one more than the number of nodes.
    """
    held = np.cumsum(np.sort(np.asarray(node_gpus, dtype=np.int64))[::-1])
    counts = np.arange(max_gpus + 1)
    return np.where(counts > 0, np.searchsorted(held, counts) + 1, 0)


def min_nodes_for(node_gpus: Sequence[int] | NDArray[np.int16], gpus: int) -> int:
    """The fewest nodes that together hold `gpus` GPUs (see `fewest_nodes`)."""
    return int(fewest_nodes(node_gpus, max(gpus, 0))[-1])


def fair_share(node_gpus: Sequence[int] | NDArray[np.int16], jobs: int) -> tuple[int, int]:
    """a_f as (nodes, GPUs): ceil(GPUs / jobs) GPUs on the fewest nodes that hold them."""
    total = int(np.sum(node_gpus))
    gpus = max(math.ceil(total / max(jobs, 1)), 1)
    return min_nodes_for(node_gpus, gpus), gpus


def placements(
    node_gpus: Sequence[int] | NDArray[np.int16], max_nodes: int, max_gpus: int
) -> NDArray[np.bool_]:
    """Which (nodes used, GPUs) pairs exist, `[max_nodes + 1, max_gpus + 1]`."""
    gpus = np.arange(max_gpus + 1)
    nodes = np.arange(max_nodes + 1)[:, None]
    return (nodes >= fewest_nodes(node_gpus, max_gpus)) & (nodes <= gpus) & (nodes >= 1)


def speedup_function(job: JobView) -> SpeedupFunction | None:
    """The job's goodput relative to one GPU, or None without a model (prior)."""
    if job.goodput is None:
        return None
    init = job.goodput.init_batch_size
    fixed = None if job.adaptive else (job.batch_size or init)
    return SpeedupFunction(
        job.goodput,
        # A limit below M0 cannot be honoured: the job runs at M0 at least.
        max_batch_size=max(job.max_batch_size, init) if job.max_batch_size else None,
        local_bsz_bounds=job.local_bsz_bounds,
        accumulation=True,
        fixed_batch_size=fixed,
    )


def _model_key(job: JobView) -> Hashable | None:
    """What a job's speedup function depends on, or None if it cannot be hashed."""
    key = (job.goodput, job.adaptive, job.batch_size, job.max_batch_size, job.local_bsz_bounds)
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Model:
    """A job's speedup over one GPU, memoized by (one node or more, GPUs).

    For an adaptive job this is `speedup_function(job)` evaluated directly
    with `GoodputFunction.optimize` (the same numbers, without the function's
    per-call bookkeeping; its one-GPU normalizer comes with the first
    evaluation); a fixed-batch job uses `SpeedupFunction` itself.
    """

    def __init__(self, job: JobView) -> None:
        goodput = job.goodput
        if goodput is None:
            raise ValueError(f"job {job.id} has no goodput model")
        self.goodput = goodput
        self.function = None if job.adaptive else speedup_function(job)
        init = goodput.init_batch_size
        self._max_batch = max(job.max_batch_size, init) if job.max_batch_size else None
        self._bounds = job.local_bsz_bounds
        self._base: float | None = None
        self._values = np.full((3, 1), np.nan)
        self._values[:, 0] = 0.0
        self.grids: dict[Hashable, FloatArray] = {}
        """Finished table rows by (cap + 1, fair share, node sizes, node limit)."""

    def speedups(self, nodes: NDArray[np.intp], gpus: NDArray[np.intp]) -> FloatArray:
        """Speedups over one GPU at (nodes, GPUs) pairs, evaluating only unseen ones."""
        spans = np.minimum(nodes, 2)
        width = int(gpus.max(initial=0)) + 1
        if width > self._values.shape[1]:
            grown = np.full((3, width), np.nan)
            grown[:, : self._values.shape[1]] = self._values
            self._values = grown
        missing = np.isnan(self._values[spans, gpus])
        if missing.any():
            keys = np.unique(spans[missing] * width + gpus[missing])
            new_spans, new_gpus = np.divmod(keys, width)
            self._values[new_spans, new_gpus] = _clean(self._evaluate(new_spans, new_gpus))
        return self._values[spans, gpus]

    def _evaluate(self, nodes: NDArray[np.intp], gpus: NDArray[np.intp]) -> FloatArray:
        """`SpeedupFunction(...)(nodes, gpus)` for this job's model (class docstring)."""
        if self.function is not None:
            return np.asarray(self.function(nodes, gpus), dtype=np.float64)
        model = self.goodput
        base = self._base
        if base is None:  # (1, 1), the normalizer, rides along with the first pairs
            nodes, gpus = np.concatenate([[1], nodes]), np.concatenate([[1], gpus])
        raw = model.optimize(nodes, gpus, self._max_batch, self._bounds, accumulation=True)[0]
        if base is None:
            base = float(raw[0])
            if base <= 0:  # one GPU cannot run it: compare with it unbounded
                init = model.init_batch_size
                base = init / model.step_time(1, 1, init, 0)
            self._base, raw = base, raw[1:]
        return np.asarray(raw / base, dtype=np.float64)


def _clean(values: FloatArray) -> FloatArray:
    """Non-finite or negative predictions count as no progress."""
    values = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(values) & (values > 0), values, 0.0)


class SpeedupTables:
    """Builds each decision's SPEEDUP table, memoizing goodput models between decisions."""

    def __init__(self) -> None:
        self._models: dict[Hashable, _Model] = {}

    def build(
        self,
        jobs: Sequence[JobView],
        caps: NDArray[np.int16],
        node_gpus: NDArray[np.int16],
        max_nodes: int,
        fair: tuple[int, int],
    ) -> FloatArray:
        """The `[jobs, max_nodes + 1, max(caps) + 1]` SPEEDUP table (module docstring)."""
        max_gpus = int(caps.max(initial=0))
        valid = placements(node_gpus, max_nodes, max_gpus)
        one_node: NDArray[np.bool_] = valid[1]
        more_nodes = np.asarray(valid[2:].any(axis=0), dtype=bool)
        table = np.zeros((len(jobs), max_nodes + 1, max_gpus + 1))
        gpus = np.arange(max_gpus + 1)
        models: dict[Hashable, _Model] = {}
        # The (nodes, GPUs) pairs to evaluate depend only on the cap: built once per cap.
        pairs: dict[int, tuple[NDArray[np.intp], ...]] = {}
        for row, (job, cap) in enumerate(zip(jobs, caps, strict=True)):
            width = int(cap) + 1
            model = self._model(job, models)
            if model is None:
                table[row, :, :width] = np.where(valid[:, :width], gpus[:width] / fair[1], 0.0)
                continue
            if width not in pairs:
                one = np.flatnonzero(one_node[:width])
                more = np.flatnonzero(more_nodes[:width])
                shares = _shares(node_gpus, fair, width - 1)
                nodes = np.concatenate([np.ones_like(one), np.full_like(more, 2), shares[:, 0]])
                counts = np.concatenate([one, more, shares[:, 1]])
                pairs[width] = (one, more, nodes, counts)
            shape = (width, fair, node_gpus.tobytes(), max_nodes)
            done = model.grids.get(shape)
            if done is not None:  # the same job shape as in an earlier decision
                table[row, :, :width] = done
                continue
            one, more, nodes, counts = pairs[width]
            values = model.speedups(nodes, counts)
            found = values[one.size + more.size :]
            base = float(found[found > 0][0]) if (found > 0).any() else 1.0
            grid = table[row, :, :width]
            grid[1, one] = values[: one.size] / base
            grid[2:, more] = values[one.size : one.size + more.size] / base
            grid[~valid[:, :width]] = 0.0
            model.grids[shape] = grid.copy()
        self._models = models
        return table

    def _model(self, job: JobView, models: dict[Hashable, _Model]) -> _Model | None:
        """The job's memoized model (recorded in `models`), or None without one."""
        key = _model_key(job)
        model = None
        if key is not None:
            model = models.get(key) or self._models.get(key)
        if model is None:
            if job.goodput is None:
                return None
            model = _Model(job)
        if key is not None:
            models[key] = model
        return model


def _shares(node_gpus: NDArray[np.int16], fair: tuple[int, int], cap: int) -> NDArray[np.intp]:
    """Candidate normalizers as (nodes, GPUs) rows: a_f, then a_f cut to the cap, then one GPU."""
    reduced = max(min(fair[1], cap), 1)
    rows = [fair, (min_nodes_for(node_gpus, reduced), reduced), (1, 1)]
    return np.array([row for row in rows if 1 <= row[0] <= min(row[1], len(node_gpus))])
