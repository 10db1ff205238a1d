"""A job's throughput model on each GPU type, bootstrapped as Sia does (SOSP'23, 3.1).

A job measures step times on the GPU types it runs on; on the others its
model is estimated. Per-GPU compute does not depend on the GPU count, so
one type's model carries over to another scaled by the ratio of their
single-GPU throughputs (both measured by the job's profile on one GPU of
each type, or taken from tables in the simulator): on N GPUs of type A
the job runs at its N-GPU speed on type B times A's single-GPU throughput
over B's. Scaling every time term of `PerfParams` by one factor scales the
step time by it (the step-time model is homogeneous of degree one).

`bootstrap` picks, for each type, in this order:

1. the job's own fit there, when it ran there on more than one GPU;
2. the fit of the type where it ran on the most GPUs, scaled;
3. its own fit there from one GPU (scaling is unknown yet: Pollux's
   exploration takes over);
4. the single-GPU fit of another type, scaled.

Ties go to the type named first in `speeds`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from gpuq.goodput import PerfParams


@dataclass(frozen=True, slots=True)
class Fitted:
    """A job's model fitted on one GPU type, and the most GPUs it measured there."""

    perf: PerfParams
    replicas: int


def scale_perf(perf: PerfParams, factor: float) -> PerfParams:
    """`perf` with every time term times `factor` (steps take `factor` times as long)."""
    if not factor > 0:
        raise ValueError(f"a scale factor must be positive, got {factor}")
    return replace(
        perf,
        alpha_c=perf.alpha_c * factor,
        beta_c=perf.beta_c * factor,
        alpha_n=perf.alpha_n * factor,
        beta_n=perf.beta_n * factor,
        alpha_r=perf.alpha_r * factor,
        beta_r=perf.beta_r * factor,
    )


def bootstrap(
    fitted: Mapping[str, Fitted], speeds: Mapping[str, float]
) -> dict[str, tuple[PerfParams, bool]]:
    """Each type's model and whether it was measured there (module docstring).

    `fitted` holds the job's fits by type; `speeds` every type's single-GPU
    throughput (any unit, positive). Types without a speed get only their
    own fit; a job with no fit gets an empty answer.
    """
    if not fitted:
        return {}
    order = {kind: i for i, kind in enumerate(speeds)}

    def rank(kind: str) -> tuple[int, int]:
        return (-fitted[kind].replicas, order.get(kind, len(order)))

    widest = min(fitted, key=rank)
    models: dict[str, tuple[PerfParams, bool]] = {}
    for kind in dict.fromkeys([*speeds, *fitted]):
        own = fitted.get(kind)
        if own is not None and (own.replicas > 1 or fitted[widest].replicas <= 1):
            models[kind] = (own.perf, True)
        elif kind in speeds and widest in speeds:
            source = fitted[widest]
            models[kind] = (scale_perf(source.perf, speeds[widest] / speeds[kind]), False)
        elif own is not None:
            models[kind] = (own.perf, True)
    return models


__all__ = ["Fitted", "bootstrap", "scale_perf"]
