"""A job's goodput on a configuration, from its model on that GPU type; memoized.

Which model
    On a node of type t, `JobView.per_type[t]` (its goodput model and the
    per-GPU batch range that fits t's memory); where `per_type` has no entry
    for t (a caller that knows no types), the job's `goodput` and
    `local_bsz_bounds`. An entry whose model is None means nothing is known
    on t yet.
Adaptive jobs
    The best batch size for the configuration: `GoodputFunction.optimize` with
    the job's `max_batch_size` (at least M0; 0 means the batch is fixed at
    M0), the type's bounds and gradient accumulation, as Pollux's tables.
Fixed-batch jobs
    Goodput at the job's own total batch (`batch_size`, else M0, clamped to
    `max_batch_size`), split as the simulator runs it
    (`gpuq.sim.apps.Application.fixed_batch_config`): per-GPU share
    ceil(B / K), accumulation only past the type's upper bound (and one step
    on a single GPU above M0), the micro-batch capped so the total stays
    within `max_batch_size`. Goodput 0 when K > B or the micro-batch exceeds
    the upper bound.

Goodput depends on a configuration's nodes only through "one node or more"
(`gpuq.goodput`), so each model is tabulated by (one node or several, GPUs)
and only unseen pairs are evaluated, all of a job's at once. Tables are kept
per (model, batch terms) for one decision to the next; a decision drops the
tables its jobs no longer use. Each table also keeps its values on the
standard configurations of each type, by cluster shape.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np
from numpy.typing import NDArray

from gpuq.goodput import GoodputFunction, optimize_many
from gpuq.policies.interface import JobView

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

_EPS = 1e-8


def model_on(job: JobView, gpu_type: str) -> tuple[GoodputFunction | None, tuple[int, int]]:
    """The job's goodput model and per-GPU batch range on `gpu_type` (module docstring)."""
    typed = job.per_type.get(gpu_type)
    if typed is not None:
        return typed.goodput, typed.local_bsz_bounds
    return job.goodput, job.local_bsz_bounds


def fixed_batch_goodput(
    model: GoodputFunction,
    nodes: IntArray,
    gpus: IntArray,
    batch_size: int,
    max_batch_size: int,
    bounds: tuple[int, int],
) -> FloatArray:
    """Goodput at a fixed total batch on each (nodes, GPUs) pair (module docstring)."""
    batch = min(batch_size, max_batch_size) if max_batch_size > 0 else batch_size
    max_local = bounds[1]
    local = np.ceil(batch / gpus - _EPS)
    accum = np.maximum(np.ceil(local / max_local - _EPS) - 1, 0)
    accum = np.where((gpus == 1) & (batch > model.init_batch_size), np.maximum(accum, 1), accum)
    atomic = np.ceil(local / (accum + 1) - _EPS)
    if max_batch_size > 0:
        atomic = np.minimum(atomic, max_batch_size // (gpus * (accum + 1)))
    atomic = np.maximum(atomic, 1)
    fits = (gpus <= batch) & (atomic <= max_local)
    values = model.evaluate(nodes, gpus, atomic, accum)
    return np.where(fits, values, 0.0)


class Curve:
    """One model's goodput by (one node or several, GPUs), filled in as asked."""

    def __init__(
        self,
        model: GoodputFunction,
        adaptive: bool,
        batch_size: int,
        max_batch_size: int,
        bounds: tuple[int, int],
    ) -> None:
        self.model = model
        self.adaptive = adaptive
        self.batch_size = batch_size
        self.max_batch_size = max_batch_size
        self.bounds = bounds
        self._values: FloatArray = np.full((2, 1), np.nan)
        self._standard: dict[tuple[int, int], FloatArray] = {}

    def standard(self, token: int, kind: int, nodes: IntArray, gpus: IntArray) -> FloatArray:
        """`values(nodes, gpus)` on a decision's standard columns of one type, memoized.

        `token` names the standard set (`GoodputMemo.token`), `kind` the type.
        """
        found = self._standard.get((token, kind))
        if found is None:
            found = self.values(nodes, gpus)
            self._standard[(token, kind)] = found
        return found

    def values(self, nodes: IntArray, gpus: IntArray) -> FloatArray:
        """Goodput on each (nodes, GPUs) pair; pairs not seen before are evaluated together."""
        spans = np.minimum(nodes, 2) - 1
        width = int(gpus.max(initial=0)) + 1
        if width > self._values.shape[1]:
            grown = np.full((2, max(width, 2 * self._values.shape[1])), np.nan)
            grown[:, : self._values.shape[1]] = self._values
            self._values = grown
        found = self._values[spans, gpus]
        missing = np.isnan(found)
        if missing.any():
            new_spans, new_gpus = spans[missing], gpus[missing]
            computed = _clean(self._evaluate(new_spans + 1, new_gpus))
            self._values[new_spans, new_gpus] = computed
            found = self._values[spans, gpus]
        return np.asarray(found, dtype=np.float64)

    def _evaluate(self, nodes: IntArray, gpus: IntArray) -> FloatArray:
        model = self.model
        if not self.adaptive:
            batch = self.batch_size or model.init_batch_size
            return fixed_batch_goodput(model, nodes, gpus, batch, self.max_batch_size, self.bounds)
        best = model.optimize(nodes, gpus, self.max_batch(), self.bounds, accumulation=True)[0]
        return np.asarray(best, dtype=np.float64)

    def max_batch(self) -> int | None:
        """The largest total batch an adaptive job may pick (None: its M0)."""
        init = self.model.init_batch_size
        return max(self.max_batch_size, init) if self.max_batch_size else None


def _clean(values: FloatArray) -> FloatArray:
    """Non-finite or negative predictions count as no progress."""
    values = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(values) & (values > 0), values, 0.0)


class GoodputMemo:
    """Curves by model and batch terms, kept from one decision to the next."""

    def __init__(self) -> None:
        self._previous: dict[Hashable, Curve] = {}
        self._current: dict[Hashable, Curve] = {}
        self._tokens: dict[Hashable, int] = {}

    def token(self, key: Hashable) -> int:
        """A number for `key` (a cluster's standard set), the same while the memo lives."""
        return self._tokens.setdefault(key, len(self._tokens))

    def start_decision(self) -> None:
        """Forget the curves no job used in the decision that just ended."""
        self._previous, self._current = self._current, {}

    def prefill(self, wanted: Iterable[tuple[Curve, int, int, IntArray, IntArray]]) -> None:
        """Evaluate the standard columns of many adaptive curves at once.

        `wanted` holds (curve, token, type, nodes, GPUs) as `Curve.standard`
        takes them; those not yet known are computed together, one
        `optimize_many` per (token, type), with the values `standard` would
        give one by one. Why: when most jobs' models changed since the last
        decision (each refit), one call per job and type dominates.
        """
        groups: dict[tuple[int, int], dict[int, Curve]] = {}
        shapes: dict[tuple[int, int], tuple[IntArray, IntArray]] = {}
        for curve, token, kind, nodes, gpus in wanted:
            key = (token, kind)
            if curve.adaptive and key not in curve._standard:
                groups.setdefault(key, {})[id(curve)] = curve
                shapes[key] = (nodes, gpus)
        for key, members in groups.items():
            nodes, gpus = shapes[key]
            curves = list(members.values())
            best = optimize_many(
                [curve.model for curve in curves],
                nodes,
                gpus,
                [curve.max_batch() for curve in curves],
                [curve.bounds for curve in curves],
                accumulation=True,
            )
            for curve, row in zip(curves, best, strict=True):
                curve._standard[key] = _clean(row)

    def curve(self, job: JobView, model: GoodputFunction, bounds: tuple[int, int]) -> Curve:
        """The job's curve for `model` with `bounds` (a fresh one if new)."""
        batch = 0 if job.adaptive else job.batch_size
        key = (model, job.adaptive, batch, job.max_batch_size, bounds)
        found = self._current.get(key) or self._previous.get(key)
        if found is None:
            found = Curve(model, job.adaptive, batch, job.max_batch_size, bounds)
        self._current[key] = found
        return found


__all__ = ["Curve", "GoodputMemo", "fixed_batch_goodput", "model_on"]
