"""Unbiased gradient-noise statistics and their moving average (pure arithmetic).

`noise_stats` and `pair_stats` turn the norms of micro-batch gradients into
unbiased estimates of |G|^2 and tr(Sigma) / M0 (the formulas are in
`gpuq.runner.gns`, which measures the norms); `NoiseAverage` averages them
as Pollux does and says how uncertain the |G|^2 average still is.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from gpuq.goodput import GradParams

Estimator = Literal["unbiased", "differenced"]
SMOOTHING = 0.999
"""Per-M0-samples decay of the moving averages (Pollux's artifact)."""
CAUTION = 1.0
"""Standard errors of its average below which |G|^2 is not taken (`NoiseAverage.cautious`)."""


def noise_stats(
    local_sqr: float, total_sqr: float, count: int, micro_batch: int, init_batch: int
) -> tuple[float, float]:
    """Unbiased (|G|^2, tr(Sigma) / M0) from `count` micro-batch gradients of `micro_batch` samples.

    `local_sqr` is the mean of the micro-batch gradients' squared norms and
    `total_sqr` the squared norm of their mean (see the module docstring).
    """
    if count < 2:
        raise ValueError(f"noise statistics need at least two micro-batches, got {count}")
    scale = count * micro_batch / init_batch
    grad_sqr = (count * total_sqr - local_sqr) / (count - 1)
    grad_var = (local_sqr - total_sqr) * scale / (count - 1)
    return grad_sqr, grad_var


def pair_stats(
    first_sqr: float, second_sqr: float, sum_sqr: float, first: int, second: int, init_batch: int
) -> tuple[float, float]:
    """Unbiased (|G|^2, tr(Sigma) / M0) from two micro-batch gradients of any sizes.

    `first_sqr` and `second_sqr` are their squared norms and `sum_sqr` the
    squared norm of ``first * g1 + second * g2``. Their dot product estimates
    |G|^2, and |g1 - g2|^2 estimates tr(Sigma) (1 / first + 1 / second).
    With equal sizes this is `noise_stats` with two micro-batches.
    """
    cross = (sum_sqr - first**2 * first_sqr - second**2 * second_sqr) / (2 * first * second)
    spread = first_sqr + second_sqr - 2 * cross
    return cross, spread / (1 / first + 1 / second) / init_batch


class NoiseAverage:
    """Bias-corrected moving averages of |G|^2 and tr(Sigma) / M0 from one estimator.

    It also keeps the spread of the |G|^2 estimates, for `cautious`: from
    batches much smaller than the noise scale, each estimate of |G|^2 is mostly
    noise, their average can be near zero or negative, and a |G|^2 clamped at
    zero reads as an infinite noise scale, every batch size fully efficient
    (a small language model's first epoch did exactly that).
    """

    def __init__(self, smoothing: float = SMOOTHING) -> None:
        self.smoothing = smoothing
        self.estimator: Estimator | None = None
        self.biased_sqr = self.biased_var = self.weight = 0.0
        self.biased_sqr2 = self.weight2 = 0.0  # of the squared |G|^2 estimates, squared weights
        self.updates = 0
        """Estimates folded into the current average (since its estimator started)."""
        self._params: GradParams | None = None
        self._cautious: GradParams | None = None

    def update(self, grad_sqr: float, grad_var: float, scale: float, estimator: Estimator) -> None:
        """Fold one estimate in; `scale` = samples it used / M0; another estimator starts afresh."""
        if not (math.isfinite(grad_sqr) and math.isfinite(grad_var)):
            return
        if estimator != self.estimator:
            self.estimator = estimator
            self.biased_sqr = self.biased_var = self.weight = 0.0
            self.biased_sqr2 = self.weight2 = 0.0
            self.updates = 0
        theta = self.smoothing**scale
        self.biased_sqr = theta * self.biased_sqr + (1 - theta) * grad_sqr
        self.biased_var = theta * self.biased_var + (1 - theta) * grad_var
        self.biased_sqr2 = theta * self.biased_sqr2 + (1 - theta) * grad_sqr**2
        self.weight = theta * self.weight + (1 - theta)
        self.weight2 = theta**2 * self.weight2 + (1 - theta) ** 2
        self.updates += 1
        self._params = self._cautious = None

    def params(self) -> GradParams | None:
        """The current estimate, clamped at 0; None before the first update."""
        if self.weight <= 0:
            return None
        if self._params is None:
            sqr, var = self.biased_sqr / self.weight, self.biased_var / self.weight
            self._params = GradParams(max(sqr, 0.0), max(var, 0.0))
        return self._params

    def cautious(self) -> GradParams | None:
        """The estimate with |G|^2 never below `CAUTION` standard errors of its average.

        The standard error comes from the spread of the estimates and the
        moving average's effective number of them. What the batch size and
        the learning rate act on: the measured |G|^2 once the measurements
        tell it from zero, and one standard error while they cannot, so that
        the noise scale stays finite. Adding two standard errors to every
        |G|^2 instead would bias every decision: at batches below the noise
        scale a measurement's |G|^2 is mostly noise, the error stays near
        |G|^2 itself for hundreds of steps, and the noise scale the
        decisions saw would be a half to a third of the measured one (an
        LSTM and a transformer language model in bench/bench_adaptive.py,
        whose fixed-batch loss curves agree with the measured one).
        Equal to `params` when the estimates agree; None before the first
        update.
        """
        params = self.params()
        if params is None or self._cautious is not None:
            return params if params is None else self._cautious
        self._cautious = GradParams(max(params.sqr, CAUTION * self.sqr_error()), params.var)
        return self._cautious

    def sqr_error(self) -> float:
        """The standard error of the |G|^2 average: its estimates' spread, over their number.

        The number is the moving average's effective one (its weights'
        squares); 0 before the first update.
        """
        if self.weight <= 0:
            return 0.0
        mean = self.biased_sqr / self.weight
        spread = max(self.biased_sqr2 / self.weight - mean**2, 0.0)
        return math.sqrt(spread * self.weight2) / self.weight

    def bounds(self) -> tuple[GradParams, GradParams] | None:
        """`cautious` with |G|^2 one standard error above, and below (at least 0).

        The noise scales the measurements cannot yet tell from the estimate,
        the lower first: a batch size is changed only where all three agree
        (`gpuq.runner.batch_choice.agreed`). None before the first update.
        """
        middle = self.cautious()
        if middle is None or middle.var <= 0:  # no noise: a noise scale of 0, however measured
            return None
        error = self.sqr_error()
        return (
            GradParams(middle.sqr + error, middle.var),
            GradParams(max(middle.sqr - error, 0.0), middle.var),
        )

    def state_dict(self) -> dict[str, Any]:
        """The averages, for a checkpoint."""
        return {
            "estimator": self.estimator,
            "biased_sqr": self.biased_sqr,
            "biased_var": self.biased_var,
            "biased_sqr2": self.biased_sqr2,
            "weight": self.weight,
            "weight2": self.weight2,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what `state_dict` returned."""
        self.estimator = state["estimator"]
        self.biased_sqr, self.biased_var = float(state["biased_sqr"]), float(state["biased_var"])
        self.weight, self.updates = float(state["weight"]), int(state["updates"])
        self.biased_sqr2 = float(state.get("biased_sqr2", self.biased_sqr**2))
        self.weight2 = float(state.get("weight2", self.weight**2))
        self._params = self._cautious = None
