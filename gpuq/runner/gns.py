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

  Two micro-batches may have different sizes n1 and n2 (`pair_stats`):
  g1 . g2 estimates |G|^2 and |g1 - g2|^2 estimates tr(Sigma) (1/n1 + 1/n2).
  `gpuq.runner.AdaptiveDataLoader` hands a measured step that has no
  accumulation to the loop as two halves of its batch, so every measurement
  compares gradients taken at the same weights.

- With one micro-batch per step that cannot be split, the same formulas are
  applied to the last two steps' gradients (count = 2, S = 2 m / M0): Wang
  and Yu's differenced estimator. It is biased while the weights move: the
  first step moves the weights against its own noise, so the second
  gradient is anti-correlated with that noise, and |G|^2 comes out low (about
  half on a CNN with momentum and on an LSTM with Adam, which doubled their
  noise scales). The two estimators' averages are never mixed (switching
  resets them).

Gradients are preconditioned first, as Pollux does, so the statistics
describe the step the optimizer actually takes: for Adam and AdamW each
element is divided by ``sqrt(max(v, mean(v))) + eps``, where ``v =
exp_avg_sq / (1 - beta2^t)`` and ``mean(v)`` is its mean over the element's
parameter tensor, once the optimizer has taken 5 steps (identity before).
The floor is what keeps the estimate finite on models with embeddings:
an embedding row that no step has touched yet has ``v = 0`` and Pollux's
unfloored divisor ``eps`` (1e-8) multiplies its gradient by 1e8 the first
time a batch holds its token, so the rows seen least decide tr(Sigma) alone
(on a small language model, grad_var / grad_sqr of about 3e7 where the
efficiency its batch sizes measure implies a few hundred). Adam's own step
never amplifies a rare row that way: its divisor includes the current
gradient. With the floor a coordinate counts at most as much as a typical
coordinate of its tensor. A tensor whose second moment is still all zero
is left out of the statistics. The estimates are averaged with an
exponential moving average whose factor 0.999^S gives larger batches more
weight, with Adam-style bias correction; `NoiseAverage.cautious` keeps
|G|^2 at or above the uncertainty of its average for the decisions made on
it.

`GradientNoiseScale` gets the gradients from public hooks only: an optimizer
step pre-hook (``Optimizer.register_step_pre_hook``) sees each micro-batch's
gradient in ``param.grad`` when ``optimizer.step()`` is called after its
backward pass. On a micro-batch that is not the last of its step it adds the
gradient to a flat buffer and sets ``param.grad`` to None, so the optimizer
skips every parameter and the step is a no-op; on the last one it writes the
sample-weighted mean gradient back into ``param.grad`` and lets the step run.
The training loop stays the plain ``backward(); step(); zero_grad()``.

The noise is measured on one optimizer step in `every`, counted in optimizer
steps whatever the epochs are. Pollux measures every step; a measurement
copies the gradients and costs some Python, and a split step pays the
per-step cost twice, which a short step notices (about 100 us against a
0.3 ms step in bench/bench_adaptive.py). So, given a clock, `pace` sets
`every` from what measurements cost against the step time: the smallest
interval that keeps them under `MEASURE_SHARE` of the training time, at
most `MEASURE_EVERY`. A model whose steps take milliseconds is measured
every other step (`due` never asks for two in a row, so unsplit steps keep
being timed), so the estimate follows a new batch size within a few steps
even when an epoch is only a few steps long (a fixed interval of 32 steps
left a language model at 8 steps an epoch with no new measurement for four
epochs). The interval alternates between `every` and one more, so that
measurements do not all fall on one parity of steps. The first
measurement, and the first after the batch size changes, comes at once
rather than after the interval, and the first `warmup` measurements (the
tuner's `MIN_MEASUREMENTS`) come every other step whatever the interval:
until then the tuner has nothing to act on. Once steps are measured from
their halves, a step the loader leaves whole (a pass's first) is not
measured with the step before it: the biased estimator would restart the
average. Each measurement is weighted as the steps it
stands for (since the previous one), so the average spans as many steps as
Pollux's. Under
DistributedDataParallel every gradient it sees is already the mean over
all ranks (the all-reduce runs in the backward pass), so each micro-batch
counts the samples of all ranks, and every rank computes the same statistics.

Limits: accumulation hands the optimizer nothing on the micro-batches it
absorbs, so gradient clipping before ``step()`` clips micro-batches rather
than their mean, and `torch.amp.GradScaler` (which checks the gradients it
unscales) cannot be combined with accumulation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gpuq.goodput import GradParams
from gpuq.runner.noise import NoiseAverage, noise_stats, pair_stats

PRECONDITION_AFTER = 5
"""Adam steps before its second moments are trusted as a preconditioner."""
MEASURE_EVERY = 32
"""The most optimizer steps per noise measurement (Pollux measures every step; see below)."""
MEASURE_SHARE = 0.02
"""The share of the training time that `pace` lets noise measurements take."""


def measure_interval(measure_seconds: float, step_seconds: float) -> int:
    """Optimizer steps per measurement so that measuring costs at most `MEASURE_SHARE` of them.

    Between 1 (a step long enough that a measurement is negligible) and `MEASURE_EVERY`.
    """
    if step_seconds <= 0 or measure_seconds <= 0:
        return 1 if measure_seconds <= 0 else MEASURE_EVERY
    needed = math.ceil(measure_seconds / (MEASURE_SHARE * step_seconds))
    return max(1, min(MEASURE_EVERY, needed))


def preconditioner(optimizer: torch.optim.Optimizer, params: Sequence[Any]) -> Any:
    """Adam's elementwise step divisor for `params`, flattened; None for the identity.

    Each element's bias-corrected second moment is floored at its tensor's
    mean (see the module docstring: rows of an embedding seen rarely would
    otherwise swamp the statistics). A tensor without a trusted second
    moment (fewer than `PRECONDITION_AFTER` steps, or all zero) gets an
    infinite divisor, which leaves it out. Identity for optimizers without
    second moments, and for Adam until some tensor has a trusted one.
    """
    group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
    parts = []
    trusted = False
    for param in params:
        group, state = group_of[id(param)], optimizer.state.get(param, {})
        if "betas" not in group:
            return None
        steps = float(state.get("step", 0))
        floor = 0.0
        if "exp_avg_sq" in state and steps >= PRECONDITION_AFTER:
            moment = state["exp_avg_sq"].reshape(-1) / (1 - float(group["betas"][1]) ** steps)
            floor = float(moment.mean())
        if floor <= 0:
            parts.append(torch.full((param.numel(),), math.inf, device=param.device))
            continue
        trusted = True
        parts.append(moment.clamp_(min=floor).sqrt_().add_(float(group["eps"])))
    return torch.cat(parts) if trusted else None


def _sqr(vector: Any) -> float:
    return float(torch.dot(vector, vector))


class GradientNoiseScale:
    """Measures the PGNS of an optimizer's steps and performs gradient accumulation.

    Tell it about each micro-batch with `micro_batch(size, last)` before the
    training loop's ``optimizer.step()`` for it; `estimate()` returns the
    averaged statistics. One optimizer step in `every` is measured (the
    differenced estimator also keeps the gradient of the step before it), so
    that the cost stays a small share of a short step; the others cost a few
    Python operations. With a `clock`, the time spent measuring is kept, and
    `pace(step_seconds)` adapts `every` to it (see the module docstring).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        init_batch_size: int,
        every: int | None = None,
        *,
        hook: bool = True,
        clock: Callable[[], float] | None = None,
        warmup: int = 0,
    ) -> None:
        """Watch `optimizer`; with ``hook=False`` its owner calls `before_step` from its hook.

        The first `warmup` measurements are taken as often as `due` allows,
        whatever `every` is: until then the estimate is too uncertain to act on.
        """
        params = [p for group in optimizer.param_groups for p in group["params"]]
        every = MEASURE_EVERY if every is None else every
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.optimizer = optimizer
        self.init_batch_size = init_batch_size
        self.every = every
        """Optimizer steps per measurement (`MEASURE_EVERY` until `pace` sets it)."""
        self.clock = clock
        self.warmup = warmup
        self.measure_seconds = 0.0
        """Clock time spent measuring since the last `pace` (keeping a gradient included)."""
        self.measurements = 0
        """Measurements since the last `pace`."""
        self.average = NoiseAverage()
        self.accumulated = False
        """True when the latest step only absorbed a micro-batch (the optimizer skipped it)."""
        self.step_samples = 0
        """Samples in the latest real optimizer step."""
        self.micro_samples = 0
        """Samples in the latest micro-batch announced (a whole step's when not accumulating)."""
        self.steps = 0
        """Real optimizer steps announced so far."""
        self._size: int | None = None
        self._last = True
        self._sizes: list[int] = []  # of the micro-batches absorbed so far in this step
        self._stash: Any = None  # sum of size * gradient over them, flat
        self._stash_sqr = 0.0  # sum of their preconditioned squared norms
        self._previous: Any = None  # the previous step's preconditioned gradient, flat
        self._previous_size = 0  # and its samples (0: none kept)
        self._previous_step = -1  # and the step it was kept at
        self._next = 0  # the step to measure next
        self._measured = -2  # the step measured last
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

    def cautious_estimate(self) -> GradParams | None:
        """`estimate` with |G|^2 at least its uncertainty (`NoiseAverage.cautious`)."""
        return self.average.cautious()

    def due(self) -> bool:
        """True when the next optimizer step should be measured from two micro-batches.

        Never two steps in a row, so that the steps between keep being timed
        as they are (`gpuq.runner.AdaptiveDataLoader` splits such a step in two).
        """
        return self.steps >= self._next and self.steps > self._measured + 1

    def pending(self) -> int:
        """Micro-batches of the current step absorbed so far (0 between steps)."""
        return len(self._sizes)

    def discard_pending(self) -> int:
        """Drop the micro-batches of the current step absorbed so far; returns their samples.

        For a step that cannot go on as it began (a job resumed with another
        number of ranks): the optimizer has not stepped on them, so taking
        their samples again loses nothing.
        """
        samples = sum(self._sizes)
        self._stash, self._stash_sqr, self._sizes = None, 0.0, []
        return samples

    def _unbiased_recently(self, step: int) -> bool:
        """True while steps are measured from two micro-batches (the unbiased estimator).

        A step left whole among them (a pass's first, which the loader never
        splits) waits for the next split one rather than be measured with the
        previous step's gradient: the biased estimator would restart the average.
        """
        recent = step - self._measured <= 2 * (self.every + 1)
        return self.average.estimator == "unbiased" and recent

    def _gap(self, step: int) -> int:
        """The steps a measurement at `step` stands for: those since the previous one.

        At most `every` + 1, so a first measurement, or one after a long
        stretch without, does not outweigh the rest.
        """
        return max(1, min(step - self._measured, self.every + 1))

    def _interval(self) -> int:
        """Steps to the next measurement: `every`, one more after every other measurement.

        The alternation keeps measurements off a fixed parity of steps: with
        momentum near the edge of stability |G|^2 can swing with period two,
        and measuring every other step would see one side of the swing only.
        """
        updates = self.average.updates
        return (1 if updates < self.warmup else self.every) + updates % 2

    def pace(self, step_seconds: float) -> None:
        """Set `every` from the measurements' cost since the last call and a step's time."""
        if self.measurements:
            self.every = measure_interval(self.measure_seconds / self.measurements, step_seconds)
            self.measure_seconds, self.measurements = 0.0, 0

    def before_step(self, optimizer: Any = None, args: Any = None, kwargs: Any = None) -> None:
        """The step pre-hook: absorb, average or measure the gradients of this micro-batch."""
        size, last = self._size, self._last
        self._size, self._last = None, True
        self.accumulated = False
        if size is None:  # a step the data loader did not announce
            self.step_samples = 0
            return
        self.micro_samples = size
        step = self.steps
        if last and not self._sizes:
            if size != self.step_samples:  # a new batch size: measure it at its next step
                self._next = min(self._next, step + 1)
            self.step_samples = size
            self.steps += 1
            if step >= self._next - 1 and not self._unbiased_recently(step):
                params = [p for p in self._params if p.grad is not None]
                if params:
                    start = self.clock() if self.clock is not None else 0.0
                    self._differenced(params, size, step)
                    if self.clock is not None:
                        self.measure_seconds += self.clock() - start
            return
        params = [p for p in self._params if p.grad is not None]
        if not params:
            self.step_samples = 0
            return
        measure = step >= self._next
        start = self.clock() if measure and self.clock is not None else 0.0
        flat = torch.cat([p.grad.detach().reshape(-1) for p in params])
        pinv = preconditioner(self.optimizer, params) if measure and self._adam else None
        sqr = _sqr(flat if pinv is None else flat / pinv) if measure else 0.0
        if self._sizes and self._stash.shape != flat.shape:  # the parameters changed
            self._stash, self._stash_sqr, self._sizes = None, 0.0, []
        if last:
            self._finish_accumulation(params, flat, size, sqr, pinv, measure)
            self.steps += 1
        else:
            self._absorb(params, flat, size, sqr)
        if measure and self.clock is not None:
            self.measure_seconds += self.clock() - start

    def _absorb(self, params: list[Any], flat: Any, size: int, sqr: float) -> None:
        """Add a micro-batch that is not its step's last to the stash; the optimizer skips it."""
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
        stats = None
        if measure and len(sizes) == 2:  # two micro-batches: any sizes (a split odd batch)
            conditioned = mean if pinv is None else mean / pinv
            total = _sqr(conditioned) * samples**2
            first, second = sizes
            stats = pair_stats(self._stash_sqr, sqr, total, first, second, self.init_batch_size)
        elif measure and len(set(sizes)) == 1:  # more: only equal micro-batches are unbiased
            conditioned = mean if pinv is None else mean / pinv
            local = (self._stash_sqr + sqr) / len(sizes)
            stats = noise_stats(local, _sqr(conditioned), len(sizes), size, self.init_batch_size)
        if stats is not None:
            weight = self._gap(self.steps) * samples / self.init_batch_size
            self.average.update(*stats, weight, "unbiased")
            self.measurements += 1
            self._next, self._measured = self.steps + self._interval(), self.steps
        self._stash, self._stash_sqr, self._sizes = None, 0.0, []
        self._previous, self._previous_size = None, 0
        self.step_samples = samples

    def _differenced(self, params: list[Any], size: int, step: int) -> None:
        """Keep this step's gradient; when due, estimate from it and the previous step's.

        Only the gradient of the step just before, of as many samples, pairs
        with this one; without it, this one is kept and the next step measures.
        """
        grads = [p.grad.detach().reshape(-1) for p in params]
        pinv = preconditioner(self.optimizer, params) if self._adam else None
        previous = self._previous
        usable = (
            previous is not None
            and self._previous_size == size
            and self._previous_step == step - 1
            and previous.numel() == sum(g.numel() for g in grads)
        )
        if not (step >= self._next and usable):
            flat = torch.cat(grads)
            self._previous = flat if pinv is None else flat.div_(pinv)
            self._previous_size, self._previous_step = size, step
            return
        pair = torch.cat([previous, *grads]).view(2, -1)  # one copy, then one product
        if pinv is not None:
            pair[1].div_(pinv)
        (first, cross), (_, second) = (pair @ pair.T).tolist()
        total = (first + second + 2 * cross) / 4
        local = (first + second) / 2
        stats = noise_stats(local, total, 2, size, self.init_batch_size)
        weight = self._gap(step) * 2 * size / self.init_batch_size
        self.average.update(*stats, weight, "differenced")
        self.measurements += 1
        self._next, self._measured = step + self._interval(), step
        self._previous, self._previous_size, self._previous_step = pair[1], size, step

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
            "previous_step": self._previous_step,
            "step_samples": self.step_samples,
            "next": self._next,
            "measured": self._measured,
            "every": self.every,
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
        self._previous_step = int(state.get("previous_step", self.steps - 1))
        self._next = int(state.get("next", self.steps))
        self._measured = int(state.get("measured", -2))
        self.step_samples = int(state.get("step_samples", self._previous_size))
        self.every = int(state.get("every", self.every))
