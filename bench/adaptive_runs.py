"""One training run of bench/bench_adaptive.py: a task trained to a validation loss.

A run trains one of the tasks of bench/adaptive_tasks.py through
`gq.AdaptiveDataLoader` in one of three ways:

- at the initial batch size, fixed: no tuner, the learning rate as given
  (what a script without goodput tuning does);
- at a larger batch size, fixed ("pinned"): the tuner runs, so the learning
  rate follows the task's scaling rule (AdaScale's gain or sqrt(B / M0)) and
  epochs are counted in progress, exactly as in an adaptive run, but it
  never changes the batch size (`pinned`);
- adaptive: the tuner picks the batch size for goodput.

The validation loss is measured every `eval_every` training samples (the
same points for every run, whatever its epochs), and the run stops at the
first measurement at or below the target; the time it reached the target is
interpolated linearly between that measurement and the one before, so that
the spacing of the measurements does not round the figure. Training time is this thread's
CPU time with the evaluations left out: the bench runs on shared machines,
where another process's load would move wall-clock times by more than the
differences being measured. Wall time is kept too. For the same reason the
tuner times its steps on this CPU clock too (`gpuq.runner.tuning.step_clock`),
which is right for CPU training, the only kind this bench does, and with the
validations left out as well: they come every 32nd of the dataset, after every
step at the larger batches, and the tuner would take them for part of
the step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

import gpuq.runner as gq
import gpuq.runner.gns
import gpuq.runner.tuning
from bench.adaptive_tasks import Samples, Task, keep
from gpuq.goodput import GradParams


@dataclass
class Outcome:
    """One run to the target loss."""

    task: str
    batch: int | None
    """The fixed batch size; None for the adaptive run."""
    reached: bool
    seconds: float
    """Training CPU time (this thread, evaluations excluded) to the target, or to the end."""
    wall_seconds: float
    samples: int
    steps: int
    loss: float
    batches: list[int] = field(default_factory=list)
    """The batch size (samples per optimizer step) at each evaluation."""
    losses: list[float] = field(default_factory=list)
    """The validation loss at each evaluation."""
    times: list[float] = field(default_factory=list)
    """The training CPU time at each evaluation."""
    sample_counts: list[int] = field(default_factory=list)
    """The samples trained on at each evaluation (above `eval_every` apart at large batches)."""
    rule: str = ""
    """The learning-rate scaling rule of a fixed run above M0 when not the task's own."""
    seed: int = 0
    """The seed of the model's initial weights and of the order of the data."""

    @property
    def label(self) -> str:
        """Adaptive, or fixed and its batch size (and its scaling rule, if not the task's)."""
        if self.batch is None:
            return "adaptive"
        return f"fixed {self.batch}" + (f" {self.rule}" if self.rule else "")


class TrainingClock:
    """This thread's CPU time, less the time spent validating: training time only."""

    def __init__(self) -> None:
        self.paused = 0.0

    def __call__(self) -> float:
        """Seconds of training so far."""
        return time.thread_time() - self.paused

    @contextlib.contextmanager
    def pause(self) -> Iterator[None]:
        """Time spent inside is not counted."""
        start = time.thread_time()
        try:
            yield
        finally:
            self.paused += time.thread_time() - start


@contextlib.contextmanager
def cpu_clock(clock: TrainingClock) -> Iterator[None]:
    """While inside, tuners time steps on `clock`."""
    saved = gpuq.runner.tuning.step_clock
    gpuq.runner.tuning.step_clock = clock
    try:
        yield
    finally:
        gpuq.runner.tuning.step_clock = saved


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """While inside, tuners keep their configuration: no step boundary is due to decide.

    Everything else runs as in an adaptive run: the noise measurements (which
    AdaScale's gain needs), the step timing, the progress count.
    """
    tuner = gpuq.runner.tuning.BatchTuner
    saved = tuner.decision_due
    tuner.decision_due = lambda self: False  # type: ignore[method-assign]
    try:
        yield
    finally:
        tuner.decision_due = saved  # type: ignore[method-assign]


@contextlib.contextmanager
def measuring(share: float | None = None, every: int | None = None) -> Iterator[None]:
    """While inside, noise measurements may take `share` of the time, one in `every` steps at least.

    A diagnosis of how much the tuner's decisions and AdaScale's gain suffer from
    measuring the noise too seldom (gpuq.runner.gns `MEASURE_SHARE` and
    `MEASURE_EVERY`, 2% and 32); fixed and adaptive runs alike (bench/RESULTS.md, the
    sixth round of goodput tuning). None keeps gpuq's value.
    """
    saved = gpuq.runner.gns.MEASURE_SHARE, gpuq.runner.gns.MEASURE_EVERY
    if share is not None:
        gpuq.runner.gns.MEASURE_SHARE = share
    if every is not None:
        gpuq.runner.gns.MEASURE_EVERY = every
    try:
        yield
    finally:
        gpuq.runner.gns.MEASURE_SHARE, gpuq.runner.gns.MEASURE_EVERY = saved


@contextlib.contextmanager
def decisions_see_noise_times(factor: float) -> Iterator[None]:
    """While inside, tuners decide as if tr(Sigma) were `factor` times the measured one.

    A diagnosis, not a tuning rule: the noise scale a decision sees is multiplied
    by `factor` (the learning rate's gain and the progress count still use the
    measured one), to ask whether the batch sizes a tuner reaches with the noise
    scale the fixed runs' sample counts imply would close the gap to the best fixed
    size (bench/RESULTS.md, the fifth round of goodput tuning).
    """
    if factor == 1.0:
        yield
        return
    tuner = gpuq.runner.tuning.BatchTuner
    noise = gpuq.runner.gns.GradientNoiseScale
    retune, measured = tuner.retune, noise.cautious_estimate

    def scaled(self: gpuq.runner.gns.GradientNoiseScale) -> GradParams | None:
        estimate = measured(self)
        return (
            None if estimate is None else dataclasses.replace(estimate, var=estimate.var * factor)
        )

    def deciding(self: gpuq.runner.tuning.BatchTuner) -> gpuq.runner.tuning.BatchConfig:
        noise.cautious_estimate = scaled  # type: ignore[method-assign]
        try:
            return retune(self)
        finally:
            noise.cautious_estimate = measured  # type: ignore[method-assign]

    tuner.retune = deciding  # type: ignore[method-assign]
    try:
        yield
    finally:
        tuner.retune = retune  # type: ignore[method-assign]


def _loader(task: Task, data: Samples, batch: int | None, seed: int) -> gq.AdaptiveDataLoader:
    """The run's loader: fixed at M0, pinned at `batch` with the tuner on, or adaptive."""
    if batch == task.init_batch:
        return gq.AdaptiveDataLoader(data, batch_size=batch, collate_fn=keep, seed=seed)
    top = task.max_batch if batch is None else batch
    loader = gq.AdaptiveDataLoader(
        data, batch_size=task.init_batch, max_batch_size=top, collate_fn=keep, seed=seed
    )
    tuner = loader.tuner if loader.adaptive else None
    if tuner is None:
        raise RuntimeError("the loader should tune its batch size")
    if batch is not None:  # start at `batch` through the public checkpoint interface
        state = tuner.state_dict() | {"config": [batch, 0]}
        loader.load_state_dict({"epoch": -1, "index": 0, "in_progress": False, "tuner": state})
    return loader


def train(
    task: Task,
    data: Samples,
    validation: tuple[torch.Tensor, torch.Tensor],
    *,
    batch: int | None,
    target: float,
    eval_every: int,
    max_samples: int,
    rule: str | None = None,
    lr_factor: float = 1.0,
    max_seconds: float = math.inf,
    seed: int = 0,
) -> Outcome:
    """Train until the validation loss, measured every `eval_every` samples, reaches `target`.

    Above M0 the learning rate scales by `rule` (the task's own if None); `lr_factor`
    multiplies the task's learning rate (the grid of `bench.bench_adaptive.tune_lr`);
    `seed` sets the model's initial weights and the loader's order of the data.
    The run gives up, unreached, after `max_samples` or `max_seconds` of training.
    """
    gq.init(environ={}).close()
    torch.manual_seed(seed)
    model = task.make_model()
    optimizer = task.optimizer(model, lr_factor)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=task.lr_decay)
    job = gq.init(environ={})
    own = rule is None or rule == task.lr_scaling
    scaling = None if batch == task.init_batch else rule or task.lr_scaling
    gq.State(model=model, optimizer=optimizer, lr_scaling=scaling)
    outcome = Outcome(task.name, batch, False, 0.0, 0.0, 0, 0, float("inf"), seed=seed)
    outcome.rule = "" if own or batch == task.init_batch else str(rule)
    next_eval = eval_every
    clock = TrainingClock()
    with cpu_clock(clock), contextlib.closing(job):
        loader = _loader(task, data, batch, seed)
        cpu, wall = clock(), time.perf_counter()
        for _ in gq.epochs(10**6):
            for x, y in loader:
                torch.autograd.backward(task.loss(model, (x, y)))
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                gq.step()
                outcome.samples += len(x)
                if outcome.samples < next_eval:
                    continue
                outcome.seconds += clock() - cpu
                outcome.wall_seconds += time.perf_counter() - wall
                next_eval += eval_every
                with clock.pause():
                    outcome.loss = _validation_loss(task, model, validation)
                outcome.batches.append(loader.batch_size * (loader.accumulation_steps + 1))
                outcome.losses.append(outcome.loss)
                outcome.sample_counts.append(outcome.samples)
                outcome.times.append(outcome.seconds)
                outcome.reached = outcome.loss <= target
                if outcome.reached and len(outcome.losses) > 1:
                    outcome.seconds = _crossing(outcome.times, outcome.losses, target)
                if (
                    outcome.reached
                    or outcome.samples >= max_samples
                    or outcome.seconds > max_seconds
                ):
                    outcome.steps = loader.tuner.steps if loader.tuner else job.step
                    return outcome
                cpu, wall = clock(), time.perf_counter()
            schedule.step()
    return outcome


def initial_loss(task: Task, validation: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The validation loss of the model every run starts from (the same seed), untrained."""
    torch.manual_seed(0)
    return _validation_loss(task, task.make_model(), validation)


def _crossing(times: list[float], losses: list[float], target: float) -> float:
    """When the loss crossed `target`, linear between the last two measurements."""
    (before, now), (above, below) = times[-2:], losses[-2:]
    if above <= below:
        return now
    return before + (now - before) * (above - target) / (above - below)


@torch.no_grad()
def _validation_loss(
    task: Task, model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor]
) -> float:
    """The mean loss over the validation set, in chunks of 1,024 samples."""
    x, y = data
    total = sum(
        float(task.loss(model, (x[i : i + 1024], y[i : i + 1024]))) * len(x[i : i + 1024])
        for i in range(0, len(x), 1024)
    )
    return total / len(x)
