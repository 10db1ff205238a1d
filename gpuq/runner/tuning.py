"""Goodput batch tuning inside the job: profile, fit, choose, scale the LR, count progress.

`BatchTuner` is what an adaptive `gpuq.runner.AdaptiveDataLoader` runs on
(see that module for when a loader is adaptive). It runs the parts, each in
its own module: the profile and the fit (`gpuq.runner.step_profile`), the
choice (`gpuq.runner.batch_choice`), the learning-rate rules and the
progress count (`gpuq.runner.lr_scaling`); this module decides when, and
keeps the state a checkpoint saves:

- **Profile.** The loader times every optimizer step from the end of the
  previous one (data loading, forward, backward, update: all of it), per
  configuration (local batch m, accumulation steps s); the first step of
  each pass, the first after a change of configuration (memory for the new
  size is allocated then) and any step with a park in it are left out, and
  the median of the latest `PROFILE_WINDOW` times of a configuration is
  used, so a stray slow step (a checkpoint written in the loop) does not
  move the model. On CUDA the per-iteration peak of allocated memory is
  kept per m too.
- **Fit.** Pollux's step-time model is fitted to these times (one process:
  T_iter = (s + 1) T_grad(m)) by minimizing the RMSLE:
  `gpuq.goodput.fit_one_replica` on one replica, where the objective comes
  down to a line in log space and needs no solver (well under a millisecond,
  so the fit can run between any two steps), `gpuq.goodput.fit_perf_params`
  (scipy's bounded TNC solver, as documented there) on several.
- **Choose.** With the noise estimate of `gpuq.runner.gns` as the decisions
  see it (|G|^2 as measured, but never below one standard error of its
  average, so that a |G|^2 the measurements cannot tell from zero does not
  read as an infinite noise scale), `GoodputFunction.optimize` picks the
  (m, s) of best goodput for batch sizes between the initial one and the
  loader's ``max_batch_size``, with m under the memory bound: from the
  profiled peaks (linear in m), 90% of the device's memory, or no bound on
  the CPU, and at most twice the largest local batch timed so far
  (`EXPLORE_FACTOR`, after Pollux's cap of twice the most GPUs a job has
  had). A local batch beyond the largest timed one is predicted by the
  power law through the two largest sizes timed (`extrapolation`), not the
  fitted line, whose slope overstates what larger batches cost wherever the
  time per sample still falls (the CPU); once timed, its own times decide.
  Pollux's priors make new GPU counts look perfectly scalable for the same
  reason: a size never tried is never learned. The tuner switches only when the
  prediction beats the current configuration by more than 5%
  (`SPEEDUP_THRESHOLD`), only once the noise average holds
  `MIN_MEASUREMENTS` measurements (the |G|^2 of a few small-batch
  measurements is mostly noise; until then the noise is measured every
  other step), and only in a direction the noise scales one standard error
  of |G|^2 either side of the estimate agree on, as far as the most cautious
  of them goes (`agreed`): where measurements are few (one in 32 steps on a
  small model), the estimate swings several-fold within a run, and a tuner
  that followed it went up and down past the best size.
- **When.** Decisions are made at step boundaries, any of them
  (`decision_due`, asked by the loader before each step), not only at
  epoch starts: a model that reaches its best batch size in a few hundred
  steps would otherwise spend its first epoch at the initial one. After a
  change the next decision comes once the new configuration has run
  `SETTLE_STEPS` steps, `MIN_TIMINGS` of them whole and timed, so a batch held
  back by the exploration cap keeps growing within a few steps; otherwise
  decisions are spaced so that their cost (the fit and the choice, timed)
  stays under `DECISION_SHARE` of the step time. When a decision is next
  due is part of the checkpoint, so every decision depends on checkpointed
  numbers alone. The noise measurements keep pace with the step time
  (`pace` in `gpuq.runner.gns`: every other step when steps are long).
- **Scale the learning rate.** Around each optimizer step the learning rate
  of every parameter group is multiplied by the rule's factor and put back
  afterwards, so the script's own scheduler never sees it: ``"adascale"``
  (the gain r = (var + sqr) / (var / S + sqr), for SGD), ``"sqrt"`` (sqrt(S),
  for Adam and AdamW) or ``"linear"`` (S), with S = batch / initial batch. At
  or below the initial batch size the factor is 1.
- **Count progress.** Each step adds its samples times min(1, efficiency)
  (from the same estimate as the gain):
  samples of the initial batch size's worth. An epoch ends when progress
  reaches (epoch + 1) x dataset size, which at the initial batch size is
  exactly one pass; with larger, less efficient batches an epoch takes more
  than one pass, so schedules keyed on epochs keep their meaning.
- **Report.** When the job has a metrics recorder (inside gpuq), each new
  configuration goes to ``update_batch`` (accumulation steps counted as
  micro-batches per step, and each ``gq.step()`` marked as one micro-batch) and each step's
  statistics, gain, efficiency and progress to ``update_goodput``, with the
  fitted model, the batch limits the daemon's policy needs to use it for
  other GPU counts (M0, the largest batch, samples per GPU from 1 to what
  memory allows) and predicted goodput at each epoch start. ``grad_var`` is
  reported as tr(Sigma), the recorder's unit, not tr(Sigma) / M0.

- **Several ranks** (torchrun). Batch sizes are global; a configuration is
  (m, s) on K replicas, M = K m (s + 1). Steps are profiled per K, and the fit
  sees each K's step times as T_iter on K replicas (T_grad only where K = 1:
  on more, the all-reduce runs inside the backward pass and cannot be timed
  apart), so the model learns the synchronization cost once the job has run
  on two or more. Every rank must make the same choice, or they would run
  different batches into the same all-reduce: each timed step's seconds are
  the maximum over the ranks (one all-reduce of two numbers per step), and
  rank 0's choice is broadcast at each decision. When a checkpoint written
  on K ranks resumes on another number (a resize), `use_replicas` keeps the
  global batch (per-rank batch ceil(M / K')) and chooses again for K' at once,
  with the same threshold against keeping it.

Timing uses `step_clock` (``time.perf_counter``); tests replace it with a
deterministic clock to make decisions reproducible.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from gpuq.goodput import GoodputFunction, PerfParams
from gpuq.runner import distributed
from gpuq.runner.batch_choice import (
    EXPLORE_FACTOR,
    SPEEDUP_THRESHOLD,
    BatchConfig,
    agreed,
    choose_config,
    extrapolation,
    memory_bound,
)
from gpuq.runner.gns import GradientNoiseScale
from gpuq.runner.job import Job, StepInfo
from gpuq.runner.lr_scaling import (
    LR_SCALING_RULES,
    PRIOR,
    LrScaling,
    gain,
    lr_factor,
    progress_of,
    rescale_second_moments,
)
from gpuq.runner.step_profile import PROFILE_WINDOW, StepProfile

__all__ = [
    "DECISION_SHARE",
    "EXPLORE_FACTOR",
    "LR_SCALING_RULES",
    "MIN_MEASUREMENTS",
    "PRIOR",
    "PROFILE_WINDOW",
    "SPEEDUP_THRESHOLD",
    "BatchConfig",
    "BatchTuner",
    "LrScaling",
    "StepProfile",
    "agreed",
    "choose_config",
    "extrapolation",
    "gain",
    "lr_factor",
    "memory_bound",
    "progress_of",
    "rescale_second_moments",
    "step_clock",
]

MIN_TIMINGS = 3
"""Steps a new configuration runs untimed by nothing but its own work before the next
decision (whole, not its first): the median of three resists one stray step."""
MEMORY_HEADROOM = 0.9
"""Share of the device's memory the per-iteration peak may grow to."""
MIN_MEASUREMENTS = 8
"""Noise measurements the average must hold before the tuner acts on it (taken at the
highest rate the noise scale allows until then): enough for the spread of their |G|^2,
behind `NoiseAverage.cautious`, to be known within about a quarter."""
DECISION_SHARE = 0.01
"""The share of the training time that decisions (a fit and a choice) may take: with the
noise measurements (`gpuq.runner.gns.MEASURE_SHARE`) and the per-step hooks, tuning
stays under 5% of a step."""
SETTLE_STEPS = 5
"""Steps a new configuration runs before the next decision: its first (not timed: memory
for the new size is allocated), its noise measured at the second, then timed ones."""
step_clock: Callable[[], float] = time.perf_counter
"""The clock steps are timed with."""


class BatchTuner:
    """One adaptive loader's tuning: noise scale, profile, configuration, LR scaling, progress."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        job: Job,
        *,
        init_batch_size: int,
        max_batch_size: int,
        lr_scaling: LrScaling,
        accumulation: bool = False,
        replicas: int = 1,
    ) -> None:
        self.optimizer, self.job = optimizer, job
        self.init_batch_size, self.max_batch_size = init_batch_size, max_batch_size
        self.lr_scaling, self.accumulation = lr_scaling, accumulation
        self.gns = GradientNoiseScale(  # hook=False: see _before_step
            optimizer,
            init_batch_size,
            hook=False,
            clock=lambda: step_clock(),
            warmup=MIN_MEASUREMENTS,
        )
        self.config = BatchConfig(-(-init_batch_size // replicas), 0, replicas)
        self.profile = StepProfile()
        self.perf: PerfParams | None = None
        self.progress = 0.0
        """Scale-invariant samples trained on (see the module docstring)."""
        self.steps = 0
        """Optimizer steps taken (micro-batches absorbed by accumulation excluded)."""
        self.next_decision = 0
        """The step count from which the next step boundary decides (`decision_due`)."""
        self.changed_at = 0
        """The step count at the latest change of configuration."""
        self.updates_at_change = 0
        """Noise measurements in the average at the latest change of configuration."""
        self.capacity = _device_memory(optimizer)
        self._saved_lrs: list[Any] | None = None
        self._decision_seconds: list[float] = []  # the latest few decisions' cost
        self._group_start: float | None = None
        self._group_suspends = 0
        self._pre_hook = optimizer.register_step_pre_hook(self._before_step)
        self._post_hook: Any = None  # restores the LR; only while steps exceed M0
        if self.capacity is not None:
            job.add_step_hook(self._on_boundary)
        self._use(self.config)

    def close(self) -> None:
        """Remove the optimizer hooks (a job's step hook stays, and records nothing new)."""
        self.gns.close()
        self._pre_hook.remove()
        if self._post_hook is not None:
            self._post_hook.remove()
            self._post_hook = None

    def _use(self, config: BatchConfig) -> None:
        """Adopt `config`: report it, and restore scaled LRs only while it can scale them."""
        self.config = config
        self._window = self.profile.window(config)
        if config.batch_size > self.init_batch_size and self._post_hook is None:
            self._post_hook = self.optimizer.register_step_post_hook(self._restore_lr)
        elif config.batch_size <= self.init_batch_size and self._post_hook is not None:
            self._post_hook.remove()
            self._post_hook = None
        metrics = self.job.metrics
        if metrics is not None:
            metrics.update_batch(
                local_batch_size=config.local_bsz,
                accumulation_steps=config.accum_steps + 1,
                replicas=config.replicas,
                boundary_per_micro_batch=True,
            )

    # The data loader's side.

    def start_pass(self) -> None:
        """A pass begins: its first step is not timed (workers start, caches warm)."""
        self._group_start = None

    def before_micro_batch(self, size: int, last: bool) -> None:
        """The loop is about to receive a micro-batch of `size`; `last` if a step follows it."""
        self.gns.micro_batch(size, last)

    def step_ended(self, timed: bool = True, halves: bool = False) -> None:
        """The loop asked for the micro-batch after a step's last one: time that step.

        Steps cut short by the end of a pass are not `timed`: they are not
        representative of their configuration. A step the loader split in
        `halves` to measure its noise is timed as what it was, two
        micro-batches of half the local batch, and what it took beyond an
        unsplit step counts as the measurement's cost.
        """
        now, suspends = step_clock(), len(self.job.suspends)
        if timed and self._group_start is not None and suspends == self._group_suspends:
            seconds, window = now - self._group_start, self._window
            if self.config.replicas > 1:  # every rank decides alike (module docstring)
                seconds, self.gns.measure_seconds = distributed.max_over_ranks(
                    [seconds, self.gns.measure_seconds]
                )
            if halves or self.gns.measurements:  # a measurement: its cost, and the cadence
                usual = statistics.median(window[-PROFILE_WINDOW:]) if window else None
                if halves:  # two micro-batches of half the batch, and the statistics' own work
                    own = self.gns.measure_seconds
                    halved = BatchConfig(self.config.local_bsz // 2, 1, self.config.replicas)
                    self.profile.record_time(halved, seconds - own if seconds > own else seconds)
                    if usual is not None:  # what the measurement cost beyond an unsplit step
                        self.gns.measure_seconds = max(own, seconds - usual)
                if usual is not None:
                    self.gns.pace(usual)
            if not halves:  # `StepProfile.record_time`, inlined: this runs every step
                window.append(seconds)
                if len(window) >= 2 * PROFILE_WINDOW:
                    del window[:PROFILE_WINDOW]
        self._group_start, self._group_suspends = now, suspends

    def epoch_target(self, epoch: int, dataset_size: int) -> float:
        """The progress at which `epoch` ends: `epoch` + 1 passes' worth of samples at M0."""
        return float(dataset_size * (epoch + 1))

    def epoch_done(self, epoch: int, dataset_size: int) -> bool:
        """True once progress reaches `epoch_target`."""
        return self.progress >= self.epoch_target(epoch, dataset_size)

    def decision_due(self) -> bool:
        """True when the next step boundary should decide (`retune`): cheap, asked at each one."""
        return self.steps >= self.next_decision

    def retune(self) -> BatchConfig:
        """Refit the model, adopt the best configuration if it is worth it, set the next decision.

        Before `MIN_MEASUREMENTS` the next step decides again (nothing is fitted).
        After a change, the next decision comes once the new configuration has
        been timed (`SETTLE_STEPS`), so a batch held back by the 2x exploration
        cap keeps growing within a few steps; otherwise decisions are spaced so
        that their cost stays under `DECISION_SHARE` of the step time.
        """
        if self.gns.average.updates < MIN_MEASUREMENTS or self._settling():
            # Not yet: no estimate to act on, or a new configuration not yet timed enough.
            self.next_decision = self.steps + 1
            return self.config
        started = step_clock()
        times = self.profile.compute_times()
        perf = self.profile.fit(times)
        if perf is None:
            self.next_decision = self.steps + 1
            return self.config
        self.perf = perf
        grad = self.gns.cautious_estimate() or PRIOR
        goodput_fn = GoodputFunction(perf, grad, self.init_batch_size)
        bound = None if self.capacity is None else memory_bound(self.profile.peaks, self.capacity)
        timed = max(m for _, m in times)
        max_local = min(EXPLORE_FACTOR * timed, self.max_batch_size if bound is None else bound)
        choose = functools.partial(
            choose_config,
            current=self.config,
            max_batch_size=self.max_batch_size,
            max_local=max_local,
            accumulation=self.accumulation,
            beyond=extrapolation(times, self.config.replicas, perf),
        )
        chosen = choose(goodput_fn)
        fits = self.config.local_bsz <= min(max_local, self.max_batch_size)  # else it must go
        bounds = self.gns.average.bounds() if chosen != self.config and fits else None
        if bounds is not None:  # a move: only one the uncertain noise scale agrees on
            others = [choose(GoodputFunction(perf, g, self.init_batch_size)) for g in bounds]
            chosen = agreed(self.config, [chosen, *others])
        k = chosen.replicas
        if chosen != self.config:
            interval = SETTLE_STEPS
        else:
            step_seconds = goodput_fn.step_time(1, k, chosen.local_bsz, chosen.accum_steps)
            self._decision_seconds = [*self._decision_seconds[-3:], step_clock() - started]
            spent = min(self._decision_seconds)  # one slow decision does not space them all
            interval = max(1, math.ceil(spent / (DECISION_SHARE * step_seconds)))
        if k > 1:  # rank 0's choice and cadence, lest the ranks differ by a rounding or a clock
            local, accum, interval = distributed.from_rank0(
                [chosen.local_bsz, chosen.accum_steps, interval]
            )
            chosen = BatchConfig(local, accum, k)
        self.next_decision = self.steps + interval
        if chosen != self.config:
            self.changed_at, self.updates_at_change = self.steps, self.gns.average.updates
            old, new = self.config.batch_size, chosen.batch_size
            rescale_second_moments(self.optimizer, grad, self.init_batch_size, old, new)
            self._use(chosen)
        metrics = self.job.metrics
        if metrics is not None:
            predicted = goodput_fn.evaluate(1, k, chosen.local_bsz, chosen.accum_steps)
            per_gpu = self.max_batch_size if bound is None else bound  # what memory allows
            metrics.update_goodput(
                goodput=predicted,
                perf_params=dataclasses.astuple(perf),
                batch_limits=(self.init_batch_size, self.max_batch_size, 1, per_gpu),
            )
        return self.config

    def _settling(self) -> bool:
        """True while a new configuration has run fewer than `MIN_TIMINGS` whole steps.

        Counted from checkpointed numbers (steps, and the noise measurements,
        which take their step in halves), not from the times recorded: a
        resumed run, which has not timed the steps around its checkpoint,
        decides at the same step as an uninterrupted one. At most
        `4 * SETTLE_STEPS` steps, whatever was measured.
        """
        since = self.steps - self.changed_at
        measured = max(0, self.gns.average.updates - self.updates_at_change)
        return since < 4 * SETTLE_STEPS and since - 1 - measured < MIN_TIMINGS

    def use_replicas(self, replicas: int) -> int:
        """Run on `replicas` ranks from now on: a resumed job was resized (module docstring).

        Returns the samples of the step's micro-batches absorbed before the
        checkpoint, which the loader must hand out again (with accumulation;
        0 otherwise): the optimizer has not stepped on them, and the step
        cannot go on with parts from another number of ranks.
        """
        old = self.config
        if old.replicas == replicas:
            return 0
        redo = self.gns.discard_pending()
        per_step = replicas * (old.accum_steps + 1)
        self._use(BatchConfig(-(-old.batch_size // per_step), old.accum_steps, replicas))
        self.retune()
        return redo if old.accum_steps else 0

    # Hooks.

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Let the GNS see the gradients, count progress, scale the LR (`_restore_lr` undoes it).

        One hook for both rather than two: it runs at every step.
        """
        self.gns.before_step()
        samples = self.gns.step_samples
        if self.gns.accumulated or samples == 0:
            return
        self.steps += 1
        init = self.init_batch_size
        grad = None
        if samples <= init:  # efficiency >= 1 and an LR factor of 1
            self.progress += samples
        else:
            grad = self.gns.cautious_estimate()
            self.progress += progress_of(grad, init, samples)
            factor = lr_factor(self.lr_scaling, grad, init, samples)
            if factor != 1.0:
                self._saved_lrs = [group["lr"] for group in optimizer.param_groups]
                for group in optimizer.param_groups:
                    group["lr"] = group["lr"] * factor
        metrics = self.job.metrics
        if metrics is None:
            return
        grad = grad or self.gns.cautious_estimate()
        if grad is not None:
            batch = self.config.batch_size
            metrics.update_goodput(
                grad_sqr=grad.sqr,
                grad_var=grad.var * init,  # tr(Sigma), as the sample documents
                gain=gain(grad, init, batch),
                efficiency=gain(grad, init, batch) * init / batch,
                progress=self.progress,
            )

    def _restore_lr(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._saved_lrs is not None:
            for group, lr in zip(optimizer.param_groups, self._saved_lrs, strict=True):
                group["lr"] = lr
            self._saved_lrs = None

    def _on_boundary(self, info: StepInfo) -> None:
        if info.memory_peak_bytes is not None:  # a measured step's halves are smaller
            local = self.gns.micro_samples // self.config.replicas or self.config.local_bsz
            self.profile.record_peak(local, info.memory_peak_bytes)

    def state_dict(self) -> dict[str, Any]:
        """Everything a decision or a step depends on, for a checkpoint."""
        return {
            "config": [self.config.local_bsz, self.config.accum_steps, self.config.replicas],
            "progress": self.progress,
            "steps": self.steps,
            "next_decision": self.next_decision,
            "changed_at": self.changed_at,
            "updates_at_change": self.updates_at_change,
            "profile": self.profile.state_dict(),
            "gns": self.gns.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put back what `state_dict` returned."""
        local, accum, replicas = (*(int(v) for v in state["config"]), 1)[:3]
        self.progress, self.steps = float(state["progress"]), int(state["steps"])
        self.next_decision = int(state.get("next_decision", self.steps))
        self.changed_at = int(state.get("changed_at", 0))
        self.updates_at_change = int(state.get("updates_at_change", 0))
        self.profile.load_state_dict(state["profile"])
        self.gns.load_state_dict(state["gns"])
        self._use(BatchConfig(local, accum, replicas))


def _device_memory(optimizer: torch.optim.Optimizer) -> int | None:
    """Usable bytes on the parameters' CUDA device; None on the CPU."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.device.type == "cuda":
                total = torch.cuda.get_device_properties(param.device).total_memory
                return int(total * MEMORY_HEADROOM)
            return None
    return None
