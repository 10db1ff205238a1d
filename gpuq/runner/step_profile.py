"""Measured step times and memory peaks per batch configuration, and the step-time fit.

`gpuq.runner.tuning.BatchTuner` records into a `StepProfile` as steps end
and fits Pollux's step-time model to it at each decision.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from gpuq.goodput import PerfParams, fit_one_replica, fit_perf_params
from gpuq.runner.batch_choice import BatchConfig

PROFILE_WINDOW = 32
"""Step times kept per configuration; their median is what the fit sees."""


class StepProfile:
    """Measured step times per configuration and peak memory per local batch size."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        """Step times by "local,accum" (",replicas" added above one); the latest
        `PROFILE_WINDOW` of each count."""
        self.peaks: dict[int, int] = {}

    @staticmethod
    def key(config: BatchConfig) -> str:
        """The key of `config`'s step times in `times`."""
        key = f"{config.local_bsz},{config.accum_steps}"
        return key if config.replicas == 1 else f"{key},{config.replicas}"

    def window(self, config: BatchConfig) -> list[float]:
        """The list of `config`'s step times (created empty), which `record_time` appends to."""
        return self.times.setdefault(self.key(config), [])

    def record_time(self, config: BatchConfig, seconds: float) -> None:
        """Keep one optimizer step's wall time under its configuration."""
        window = self.window(config)
        window.append(seconds)
        if len(window) >= 2 * PROFILE_WINDOW:
            del window[:PROFILE_WINDOW]

    def record_peak(self, local_bsz: int, peak_bytes: int) -> None:
        """Keep the largest per-iteration memory peak seen at `local_bsz`."""
        self.peaks[local_bsz] = max(self.peaks.get(local_bsz, 0), peak_bytes)

    def compute_times(self) -> dict[tuple[int, int], float]:
        """Median time of one micro-batch per (replicas, local batch size): T_grad on one."""
        pooled: dict[tuple[int, int], list[float]] = {}
        for key, window in self.times.items():
            local, accum, replicas = (*(int(v) for v in key.split(",")), 1)[:3]
            times = (t / (accum + 1) for t in window[-PROFILE_WINDOW:])
            pooled.setdefault((replicas, local), []).extend(times)
        return {km: statistics.median(v) for km, v in sorted(pooled.items()) if v}

    def fit(self, times: dict[tuple[int, int], float] | None = None) -> PerfParams | None:
        """Pollux's step-time model fitted to the medians; None before any step was timed.

        A median on several replicas is a step's T_iter only (module docstring).
        `times` are the medians if the caller has them (`compute_times`).
        """
        times = self.compute_times() if times is None else times
        if not times or min(times.values()) <= 0:
            return None
        replicas, sizes = [k for k, _ in times], [m for _, m in times]
        seconds = list(times.values())
        if max(replicas) == 1:  # the same fit without a solver, cheap enough for any step
            return fit_one_replica(sizes, seconds)
        compute = [t if k == 1 else math.nan for k, t in zip(replicas, seconds, strict=True)]
        return fit_perf_params([1] * len(sizes), replicas, sizes, compute, seconds)

    def state_dict(self) -> dict[str, Any]:
        """The measurements, for a checkpoint."""
        peaks = {str(m): p for m, p in self.peaks.items()}
        return {"times": {k: list(v) for k, v in self.times.items()}, "peaks": peaks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what `state_dict` returned."""
        self.times = {str(k): [float(t) for t in v] for k, v in state["times"].items()}
        self.peaks = {int(m): int(p) for m, p in state["peaks"].items()}
