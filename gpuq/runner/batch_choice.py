"""Which batch configuration to run next: the choice among predicted goodputs, and its bounds.

Pure functions over a fitted `gpuq.goodput.GoodputFunction` and the step
times measured so far; `gpuq.runner.tuning.BatchTuner` calls them at each
decision (its module docstring says when and why).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

from gpuq.goodput import GoodputFunction, PerfParams

SPEEDUP_THRESHOLD = 1.05
"""A new configuration must be predicted this much faster (goodput) to be taken."""
EXPLORE_FACTOR = 2
"""How far beyond the largest local batch timed so far the step-time model is trusted."""


@dataclasses.dataclass(frozen=True, slots=True)
class BatchConfig:
    """Local (per-GPU) batch size and accumulation steps: (accum_steps + 1) micro-batches a step.

    On `replicas` ranks, each with its own local batch.
    """

    local_bsz: int
    accum_steps: int = 0
    replicas: int = 1

    @property
    def batch_size(self) -> int:
        """Samples per optimizer step, all replicas together."""
        return self.local_bsz * (self.accum_steps + 1) * self.replicas


def memory_bound(peaks: dict[int, int], capacity: int) -> int | None:
    """The largest local batch whose predicted peak memory fits `capacity`; None without data.

    The peak is taken as linear in the local batch, fitted by least squares;
    with one batch size seen, as proportional to it (which over-predicts larger ones).
    """
    if not peaks:
        return None
    sizes = sorted(peaks)
    if len(sizes) == 1:
        per_sample, base = peaks[sizes[0]] / sizes[0], 0.0
    else:
        mean_m = statistics.fmean(sizes)
        mean_p = statistics.fmean(peaks[m] for m in sizes)
        spread = sum((m - mean_m) ** 2 for m in sizes)
        per_sample = sum((m - mean_m) * (peaks[m] - mean_p) for m in sizes) / spread
        base = mean_p - per_sample * mean_m
    if per_sample <= 0:
        return None
    return max(1, math.floor((capacity - base) / per_sample))


def extrapolation(
    times: dict[tuple[int, int], float], replicas: int, perf: PerfParams
) -> tuple[int, PerfParams] | None:
    """The largest local batch timed on `replicas`, and the step-time model to use beyond it.

    Beyond it the step time is extrapolated as a power of the batch size
    through the two largest sizes timed (their elasticity, between 0 and 1)
    rather than along the fitted line: on the CPU the time per sample still
    falls well past the initial batch (the vector units fill up), and a line
    through the sizes timed so far overstates what a larger batch costs, so
    a batch the goodput model would favour once timed is never tried (an
    LSTM timed at 8 and 16 samples predicted 32 a third slower than it is;
    the power law predicts it within a tenth). Returned as the line through
    (top, T(top)) and (2 top, T(2 top)) in `perf`'s form: what the
    exploration cap lets a decision reach. None with fewer than two sizes
    timed, or on several replicas (their times include the all-reduce).
    """
    sizes = sorted(m for k, m in times if k == replicas)
    if replicas > 1 or len(sizes) < 2:
        return None
    top, below = sizes[-1], sizes[-2]
    top_seconds = times[(replicas, top)]
    ratio = top_seconds / times[(replicas, below)]
    elasticity = min(1.0, max(0.0, math.log(ratio) / math.log(top / below)))
    beta = top_seconds * (2**elasticity - 1) / top
    alpha = max(top_seconds - beta * top, 0.0)
    return top, dataclasses.replace(perf, alpha_c=alpha, beta_c=beta)


def choose_config(
    goodput_fn: GoodputFunction,
    current: BatchConfig,
    *,
    max_batch_size: int,
    max_local: int,
    accumulation: bool,
    threshold: float = SPEEDUP_THRESHOLD,
    beyond: tuple[int, PerfParams] | None = None,
) -> BatchConfig:
    """The configuration of best predicted goodput on `current`'s GPUs, if `threshold` x its.

    With `beyond` = (the largest local batch timed, a step-time model), local
    batches above it (up to `max_local`) are predicted with that model instead
    of the fitted one (`extrapolation`), and the current configuration, if it is
    that largest size, by the better of the two models: the extrapolation passes
    through its measured time, which the fitted line may overstate.
    """
    k = current.replicas
    max_local = max(1, min(max_local, max_batch_size))
    known = max_local if beyond is None else max(1, min(beyond[0], max_local))
    best, local, accum = goodput_fn.optimize(
        1, k, max_batch_size, (1, known), accumulation=accumulation
    )
    top, extrapolated = None, None  # the largest size timed, and the model beyond it
    if beyond is not None:
        top = beyond[0]
        extrapolated = GoodputFunction(beyond[1], goodput_fn.grad, goodput_fn.init_batch_size)
    if extrapolated is not None and known < max_local:  # the sizes not timed yet
        bounds = (known + 1, max_local)
        tried = extrapolated.optimize(1, k, max_batch_size, bounds, accumulation=accumulation)
        if tried[0] > best:
            best, local, accum = tried
    if best <= 0:
        return current
    fits = current.local_bsz <= max_local
    now = goodput_fn.evaluate(1, k, current.local_bsz, current.accum_steps) if fits else 0.0
    if fits and extrapolated is not None and current.local_bsz == top:
        # The largest size timed, judged as the sizes beyond it are: by its own time, which
        # the power law passes through, where the fitted line may overstate it. Otherwise
        # the two models' difference reads as a gain, and a size one sample larger is taken.
        now = max(now, extrapolated.evaluate(1, k, current.local_bsz, current.accum_steps))
    return BatchConfig(local, accum, k) if best > threshold * now else current


def agreed(current: BatchConfig, choices: list[BatchConfig]) -> BatchConfig:
    """`current`, unless every one of `choices` moves the batch size the same way; then the nearest.

    The choices are the best configurations under the noise scales the
    measurements cannot tell apart: the estimate's first, then those with
    |G|^2 one standard error either side (`gpuq.runner.noise.NoiseAverage.bounds`).
    The estimate's choice of another split of the same batch size (local
    batch and accumulation steps) is taken as it is: the noise scale bears on
    the batch size alone. Where they
    disagree on the direction, the estimate is too uncertain to act on: a
    CNN's noise scale, measured once in 32 steps, read 47 to 242 within one
    run, and a tuner that followed it went 61 -> 117 -> 58 -> 148 -> 88 and
    needed 28,700 samples where the fixed size it kept passing (64) needs
    17,500. Where they agree, the move goes as far as the most cautious of them.
    """
    size = current.batch_size
    if choices[0].batch_size == size:
        return choices[0]
    if all(choice.batch_size > size for choice in choices):
        return min(choices, key=lambda choice: choice.batch_size)
    if all(choice.batch_size < size for choice in choices):
        return max(choices, key=lambda choice: choice.batch_size)
    return current
