"""The gradient noise scale (Pollux's PGNS), measured from the optimizer's own steps.

Pollux's statistical efficiency needs two numbers about the gradient: its
squared norm |G|^2 and its noise tr(Sigma) (kept as tr(Sigma) / M0, the scale
of `gpuq.goodput.GradParams`). They come from comparing gradients of the same
weights computed on different samples (McCandlish et al., App. A.1):

- With ``count`` >= 2 micro-batches of m samples per optimizer step (gradient
  accumulation, or several replicas), let ``local`` be the mean of their
  squared norms and ``total`` the squared norm of their mean. Then, without
  bias::

      |G|^2          = (count * total - local) / (count - 1)
      tr(Sigma) / M0 = (local - total) * S / (count - 1),   S = count * m / M0

- With one micro-batch per step, the same formulas are applied to the last
  two steps' gradients (count = 2, S = 2 m / M0): Wang and Yu's differenced
  estimator, biased while the weights move, which is why the two estimators'
  averages are never mixed (switching resets them).

Gradients are preconditioned first, as Pollux does, so the statistics
describe the step the optimizer actually takes: for Adam and AdamW each
element is divided by ``sqrt(exp_avg_sq / (1 - beta2^t)) + eps`` once the
optimizer has taken 5 steps (identity before). The estimates are averaged with
an exponential moving average whose factor 0.999^S gives larger batches more
weight, with Adam-style bias correction.

`GradientNoiseScale` gets the gradients from public hooks only: an optimizer
step pre-hook (``Optimizer.register_step_pre_hook``) sees each micro-batch's
gradient in ``param.grad`` when ``optimizer.step()`` is called after its
backward pass. On a micro-batch that is not the last of its step it adds the
gradient to a flat buffer and sets ``param.grad`` to None, so the optimizer
skips every parameter and the step is a no-op; on the last one it writes the
sample-weighted mean gradient back into ``param.grad`` and lets the step run.
The training loop stays the plain ``backward(); step(); zero_grad()``. The
noise is measured on one optimizer step in `MEASURE_EVERY` (32; Pollux
measures every step): a measurement copies the gradients twice and costs
some Python, which a short step notices (about 100 us against a 0.3 ms step
in bench/bench_adaptive.py), and the moving average needs many measurements,
not every one. Each measurement is weighted as the `every` steps it stands
for, so the average spans as many steps as Pollux's. Only one process is
supported: with several replicas the micro-batch norms would
have to be taken by per-parameter hooks before the all-reduce, and
`gpuq.runner.AdaptiveDataLoader` does not shard data across replicas.

Limits: accumulation hands the optimizer nothing on the micro-batches it
absorbs, so gradient clipping before ``step()`` clips micro-batches rather
than their mean, and `torch.amp.GradScaler` (which checks the gradients it
unscales) cannot be combined with accumulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

import torch

from gpuq.goodput import GradParams

Estimator = Literal["unbiased", "differenced"]
SMOOTHING = 0.999
"""Per-M0-samples decay of the moving averages (Pollux's artifact)."""
PRECONDITION_AFTER = 5
"""Adam steps before its second moments are trusted as a preconditioner."""
MEASURE_EVERY = 32
"""Optimizer steps per noise measurement (Pollux measures every step; see below)."""


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


class NoiseAverage:
    """Bias-corrected moving averages of |G|^2 and tr(Sigma) / M0 from one estimator."""

    def __init__(self, smoothing: float = SMOOTHING) -> None:
        self.smoothing = smoothing
        self.estimator: Estimator | None = None
        self.biased_sqr = self.biased_var = self.weight = 0.0
        self.updates = 0
        self._params: GradParams | None = None

    def update(self, grad_sqr: float, grad_var: float, scale: float, estimator: Estimator) -> None:
        """Fold one estimate in; `scale` = samples it used / M0; another estimator starts afresh."""
        if not (math.isfinite(grad_sqr) and math.isfinite(grad_var)):
            return
        if estimator != self.estimator:
            self.estimator = estimator
            self.biased_sqr = self.biased_var = self.weight = 0.0
        theta = self.smoothing**scale
        self.biased_sqr = theta * self.biased_sqr + (1 - theta) * grad_sqr
        self.biased_var = theta * self.biased_var + (1 - theta) * grad_var
        self.weight = theta * self.weight + (1 - theta)
        self.updates += 1
        self._params = None

    def params(self) -> GradParams | None:
        """The current estimate, clamped at 0; None before the first update."""
        if self.weight <= 0:
            return None
        if self._params is None:
            sqr, var = self.biased_sqr / self.weight, self.biased_var / self.weight
            self._params = GradParams(max(sqr, 0.0), max(var, 0.0))
        return self._params

    def state_dict(self) -> dict[str, Any]:
        """The averages, for a checkpoint."""
        return {
            "estimator": self.estimator,
            "biased_sqr": self.biased_sqr,
            "biased_var": self.biased_var,
            "weight": self.weight,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what `state_dict` returned."""
        self.estimator = state["estimator"]
        self.biased_sqr, self.biased_var = float(state["biased_sqr"]), float(state["biased_var"])
        self.weight, self.updates = float(state["weight"]), int(state["updates"])
        self._params = None


def preconditioner(optimizer: torch.optim.Optimizer, params: Sequence[Any]) -> Any:
    """Adam's elementwise step divisor for `params`, flattened; None for the identity.

    Identity for optimizers without second moments, and for Adam until every
    parameter has taken `PRECONDITION_AFTER` steps.
    """
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    parts = []
    for param in params:
        group, state = group_of[id(param)], optimizer.state.get(param, {})
        if "betas" not in group or "exp_avg_sq" not in state:
            return None
        steps = float(state["step"])
        if steps < PRECONDITION_AFTER:
            return None
        moment = state["exp_avg_sq"].reshape(-1) / (1 - float(group["betas"][1]) ** steps)
        parts.append(moment.sqrt_().add_(float(group["eps"])))
    return torch.cat(parts)


def _sqr(vector: Any) -> float:
    return float(torch.dot(vector, vector))


class GradientNoiseScale:
    """Measures the PGNS of an optimizer's steps and performs gradient accumulation.

    Tell it about each micro-batch with `micro_batch(size, last)` before the
    training loop's ``optimizer.step()`` for it; `estimate()` returns the
    averaged statistics. One optimizer step in `every` is measured (the
    differenced estimator also keeps the gradient of the step before it), so
    that the cost stays a small share of a short step; the others cost a few
    Python operations.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        init_batch_size: int,
        every: int | None = None,
        *,
        hook: bool = True,
    ) -> None:
        """Watch `optimizer`; with ``hook=False`` its owner calls `before_step` from its hook."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        every = MEASURE_EVERY if every is None else every
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.optimizer = optimizer
        self.init_batch_size = init_batch_size
        self.every = every
        """Optimizer steps per measurement (`MEASURE_EVERY` by default)."""
        self.average = NoiseAverage()
        self.accumulated = False
        """True when the latest step only absorbed a micro-batch (the optimizer skipped it)."""
        self.step_samples = 0
        """Samples in the latest real optimizer step."""
        self.steps = 0
        """Real optimizer steps announced so far."""
        self._size: int | None = None
        self._last = True
        self._sizes: list[int] = []  # of the micro-batches absorbed so far in this step
        self._stash: Any = None  # sum of size * gradient over them, flat
        self._stash_sqr = 0.0  # sum of their preconditioned squared norms
        self._previous: Any = None  # the previous step's preconditioned gradient, flat
        self._previous_size = 0  # and its samples (0: none kept)
        self._params = params
        self._adam = all("betas" in group and "eps" in group for group in optimizer.param_groups)
        self._handle = optimizer.register_step_pre_hook(self.before_step) if hook else None

    def close(self) -> None:
        """Remove the optimizer hook."""
        if self._handle is not None:
            self._handle.remove()

    def micro_batch(self, size: int, last: bool) -> None:
        """Announce the next micro-batch: its samples, and whether the optimizer steps after it."""
        self._size, self._last = size, last

    def estimate(self) -> GradParams | None:
        """The averaged (|G|^2, tr(Sigma) / M0); None until two gradients have been seen."""
        return self.average.params()

    def before_step(self, optimizer: Any = None, args: Any = None, kwargs: Any = None) -> None:
        """The step pre-hook: absorb, average or measure the gradients of this micro-batch."""
        size, last = self._size, self._last
        self._size, self._last = None, True
        self.accumulated = False
        if size is None:  # a step the data loader did not announce
            self.step_samples = 0
            return
        phase = self.steps % self.every  # 0: measure this step
        if last and not self._sizes:
            self.step_samples = size
            self.steps += 1
            if phase == 0 or phase == self.every - 1:  # measure, or keep for the next
                params = [p for p in self._params if p.grad is not None]
                if params:
                    self._differenced(params, size, measure=phase == 0)
            return
        params = [p for p in self._params if p.grad is not None]
        if not params:
            self.step_samples = 0
            return
        measure = phase == 0
        flat = torch.cat([p.grad.detach().reshape(-1) for p in params])
        pinv = preconditioner(self.optimizer, params) if measure and self._adam else None
        sqr = _sqr(flat if pinv is None else flat / pinv) if measure else 0.0
        if self._sizes and self._stash.shape != flat.shape:  # the parameters changed
            self._stash, self._stash_sqr, self._sizes = None, 0.0, []
        if last:
            self._finish_accumulation(params, flat, size, sqr, pinv, measure)
            self.steps += 1
            return
        self._stash = flat * size if self._stash is None else self._stash.add_(flat, alpha=size)
        self._stash_sqr += sqr
        self._sizes.append(size)
        for param in params:
            param.grad = None  # the optimizer skips parameters without a gradient
        self.accumulated = True

    def _finish_accumulation(
        self, params: list[Any], flat: Any, size: int, sqr: float, pinv: Any, measure: bool
    ) -> None:
        """Average the step's micro-batch gradients into param.grad and estimate from them."""
        sizes = [*self._sizes, size]
        samples = sum(sizes)
        mean = self._stash.add_(flat, alpha=size).div_(samples)
        offset = 0
        for param in params:
            count = param.grad.numel()
            param.grad.copy_(mean[offset : offset + count].view_as(param.grad))
            offset += count
        if measure and len(set(sizes)) == 1:  # only groups of equal micro-batches are unbiased
            conditioned = mean if pinv is None else mean / pinv
            local = (self._stash_sqr + sqr) / len(sizes)
            stats = noise_stats(local, _sqr(conditioned), len(sizes), size, self.init_batch_size)
            weight = self.every * samples / self.init_batch_size  # it stands for `every` steps
            self.average.update(*stats, weight, "unbiased")
        self._stash, self._stash_sqr, self._sizes = None, 0.0, []
        self._previous, self._previous_size = None, 0
        self.step_samples = samples

    def _differenced(self, params: list[Any], size: int, measure: bool) -> None:
        """Keep this step's gradient; if `measure`, estimate from it and the previous step's."""
        grads = [p.grad.detach().reshape(-1) for p in params]
        pinv = preconditioner(self.optimizer, params) if self._adam else None
        previous = self._previous
        usable = previous is not None and self._previous_size == size
        if not (measure and usable and previous.numel() == sum(g.numel() for g in grads)):
            flat = torch.cat(grads)
            self._previous = flat if pinv is None else flat.div_(pinv)
            self._previous_size = size
            return
        pair = torch.cat([previous, *grads]).view(2, -1)  # one copy, then one product
        if pinv is not None:
            pair[1].div_(pinv)
        (first, cross), (_, second) = (pair @ pair.T).tolist()
        total = (first + second + 2 * cross) / 4
        local = (first + second) / 2
        stats = noise_stats(local, total, 2, size, self.init_batch_size)
        weight = self.every * 2 * size / self.init_batch_size  # it stands for `every` steps
        self.average.update(*stats, weight, "differenced")
        self._previous, self._previous_size = pair[1], size

    def state_dict(self) -> dict[str, Any]:
        """Averages and any gradients held between steps, so a resume continues bit for bit."""
        return {
            "average": self.average.state_dict(),
            "steps": self.steps,
            "sizes": list(self._sizes),
            "stash": self._stash,
            "stash_sqr": self._stash_sqr,
            "previous": None if self._previous is None else self._previous.clone(),
            "previous_size": self._previous_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what `state_dict` returned (tensors onto the parameters' device)."""
        device = next(p.device for g in self.optimizer.param_groups for p in g["params"])
        self.average.load_state_dict(state["average"])
        self.steps = int(state["steps"])
        self._sizes = [int(s) for s in state["sizes"]]
        stash, previous = state["stash"], state["previous"]
        self._stash = None if stash is None else stash.to(device)
        self._stash_sqr = float(state["stash_sqr"])
        self._previous = None if previous is None else previous.to(device)
        self._previous_size = int(state["previous_size"])
