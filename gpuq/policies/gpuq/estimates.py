"""Remaining-time estimates for the `gpuq` policy, from a job's own models.

A job's remaining work is `remaining_iterations` at its batch size
(`JobView.batch_size`, or M0 when unset): exact in the simulator (an
oracle), estimated in the daemon, None when unknown. Its remaining time on
`gpus` GPUs over `nodes` nodes is that work over its rate there:

- an adaptive job (Pollux's agent picks its batch size) progresses in
  M0-sized scale-invariant iterations at `goodput / M0` per second, at the
  best batch for the placement (`GoodputFunction.optimize`, accumulation
  allowed); its remaining work in those units is
  `remaining_iterations * B * E(B) / M0`, with E the statistical efficiency
  of this epoch's gradient statistics (`gpuq.goodput.efficiency`);
- a job with a fixed batch runs `remaining_iterations` steps of
  `fixed_batch_step_time` (`gpuq.policies.baselines`).

Estimates are None without a goodput model or a remaining count, and
infinite where the model predicts no progress. They are pure functions of
the job view; models are immutable, so values are memoized per model.
"""

from __future__ import annotations

import math
from functools import lru_cache

from gpuq.goodput import GoodputFunction
from gpuq.policies.baselines import fixed_batch_step_time
from gpuq.policies.interface import JobView


@lru_cache(maxsize=1 << 14)
def _best_goodput(
    model: GoodputFunction,
    nodes: int,
    gpus: int,
    max_batch: int,
    bounds: tuple[int, int],
) -> float:
    """Goodput (M0-equivalent samples per second) at the best batch, memoized."""
    return float(model.optimize(nodes, gpus, max_batch, bounds, accumulation=True)[0])


def remaining_time(job: JobView, nodes: int, gpus: int) -> float | None:
    """Seconds `job` needs to finish on `gpus` GPUs spread over `nodes` nodes (module docstring)."""
    model = job.goodput
    remaining = job.remaining_iterations
    if model is None or remaining is None or gpus < 1:
        return None
    if remaining <= 0:
        return 0.0
    nodes = min(max(nodes, 1), gpus)
    if not job.adaptive:
        step = fixed_batch_step_time(job, gpus, math.ceil(gpus / nodes))
        return remaining * step if step > 0 and math.isfinite(step) else math.inf
    init = model.init_batch_size
    batch = job.batch_size if job.batch_size > 0 else init
    max_batch = max(job.max_batch_size, init) if job.max_batch_size else init
    goodput = _best_goodput(model, nodes, gpus, max_batch, job.local_bsz_bounds)
    if not goodput > 0:
        return math.inf
    work = remaining * batch * model.efficiency(batch)
    return float(work / goodput)


__all__ = ["remaining_time"]
