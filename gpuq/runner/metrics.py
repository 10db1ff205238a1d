"""Aggregate what the iteration boundaries measured into control-channel samples.

`MetricsRecorder.on_step` is a step hook (`Job.add_step_hook`): the training
thread calls it at every `gpuq.runner.step()`. The data loader and the goodput
tuner tell it the batch configuration (`update_batch`) and their gradient
statistics (`update_goodput`). The control-channel thread calls `sample()`
every few seconds; each sample describes the interval since the previous one:

- ``step_seconds``: mean time of the iterations that ended in the interval
  (the first iteration of a process has no time and is left out; so is time
  spent suspended, which `step()` excludes);
- ``samples_per_second``: samples those iterations processed (each at the
  global batch size in force when it ended, or one micro-batch per replica
  where the loop marks every micro-batch) over their total time;
- ``memory_min_bytes`` / ``memory_peak_bytes``: the smallest allocated memory
  at a boundary and the largest per-iteration peak (None without CUDA);
- ``loss``: the loss given to the most recent ``step()``, whenever that was.

Step, epoch, batch configuration and goodput figures are the latest known.
A newly fitted model (`perf_params` that differ from the last ones) sets
`model_changed`, and the control thread sends a sample at once rather than
at the end of its interval: a policy that allocates by goodput decides
from it without waiting.
A value the daemon would refuse (a loss that is not finite, a negative or
non-finite statistic) is reported as None rather than breaking the channel.

Threads: every method takes one lock, held only to copy or update plain
values. The loss arrives as a detached tensor and is converted to a float in
`sample()`, outside the lock, on the control thread: ``.item()`` on a CUDA
tensor waits for the device to reach it, and that wait must not fall on the
training thread (it would stall the GPU pipeline at every step) nor hold the
lock the training thread takes. Keeping the tensor costs one scalar of device
memory.

This module imports neither torch nor anything else heavy.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuq.control import MetricsSample
from gpuq.runner.job import RunnerError, StepInfo

GOODPUT_FIELDS = ("grad_sqr", "grad_var", "gain", "efficiency", "goodput", "progress")
"""The scalar goodput figures `update_goodput` keeps, as named in `MetricsSample`."""


@dataclass
class _Interval:
    """What the boundaries since the previous sample measured."""

    steps: int = 0
    timed_steps: int = 0
    seconds: float = 0.0
    samples_timed: int = 0
    seconds_with_batch: float = 0.0
    memory_min: int | None = None
    memory_peak: int | None = None


class MetricsRecorder:
    """Collects step measurements, batch and goodput figures; `sample()` summarises them."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._interval = _Interval()
        self._step: int | None = None
        self._epoch = 0
        self._loss: Any = None
        self._loss_value: float | None = None
        self._loss_converted = True
        self._local_batch_size: int | None = None
        self._accumulation_steps: int | None = None
        self._replicas: int | None = None
        self._boundary_per_micro_batch = False
        self._goodput: dict[str, float | None] = dict.fromkeys(GOODPUT_FIELDS)
        self._perf_params: tuple[float, ...] | None = None
        self._batch_limits: tuple[int, ...] | None = None
        self.model_changed = threading.Event()
        """Set when `update_goodput` brings a new fitted model; the control thread clears it."""

    def __repr__(self) -> str:
        return f"<gpuq.runner.MetricsRecorder step {self._step}>"

    @property
    def batch_size(self) -> int | None:
        """The global batch size last given to `update_batch` (None before)."""
        with self._lock:
            return self._global_batch_size()

    def on_step(self, info: StepInfo) -> None:
        """Record one iteration boundary; the step hook the runner calls from `step()`."""
        with self._lock:
            interval = self._interval
            self._step, self._epoch = info.step, info.epoch
            interval.steps += 1
            if info.seconds is not None:
                interval.timed_steps += 1
                interval.seconds += info.seconds
                batch = self._samples_per_boundary()
                if batch is not None:
                    interval.samples_timed += batch
                    interval.seconds_with_batch += info.seconds
            interval.memory_min = _smaller(interval.memory_min, info.memory_boundary_bytes)
            interval.memory_peak = _larger(interval.memory_peak, info.memory_peak_bytes)
            if info.loss is not None:
                self._loss, self._loss_converted = info.loss, False

    def update_batch(
        self,
        *,
        local_batch_size: int,
        accumulation_steps: int = 1,
        replicas: int = 1,
        boundary_per_micro_batch: bool = False,
    ) -> None:
        """Set the batch configuration that the following iterations run with.

        By default a boundary (`step()`) ends an optimizer step, which processed
        the whole global batch; with `boundary_per_micro_batch` (the goodput
        tuner's loop, which calls `step()` after every micro-batch) it processed
        one micro-batch per replica.
        """
        given = {
            "local_batch_size": local_batch_size,
            "accumulation_steps": accumulation_steps,
            "replicas": replicas,
        }
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RunnerError(
                    f"update_batch: {name}={value!r} is not a positive integer",
                    hint="batch sizes, accumulation steps and replicas count from 1",
                )
        with self._lock:
            self._local_batch_size = local_batch_size
            self._accumulation_steps = accumulation_steps
            self._replicas = replicas
            self._boundary_per_micro_batch = boundary_per_micro_batch

    def update_goodput(
        self,
        *,
        grad_sqr: float | None = None,
        grad_var: float | None = None,
        gain: float | None = None,
        efficiency: float | None = None,
        goodput: float | None = None,
        progress: float | None = None,
        perf_params: tuple[float, ...] | None = None,
        batch_limits: tuple[int, int, int, int] | None = None,
    ) -> None:
        """Update the goodput figures given; a figure left as None keeps its previous value."""
        given = {
            "grad_sqr": grad_sqr,
            "grad_var": grad_var,
            "gain": gain,
            "efficiency": efficiency,
            "goodput": goodput,
            "progress": progress,
        }
        with self._lock:
            for name, value in given.items():
                if value is not None:
                    self._goodput[name] = float(value)
            if perf_params is not None:
                fitted = tuple(float(p) for p in perf_params)
                if fitted != self._perf_params:
                    self._perf_params = fitted
                    self.model_changed.set()
            if batch_limits is not None:
                self._batch_limits = tuple(int(v) for v in batch_limits)

    def sample(self) -> MetricsSample | None:
        """Summarise the interval since the previous call and start the next; None before a step."""
        with self._lock:
            if self._step is None:
                return None
            interval, self._interval = self._interval, _Interval()
            loss, pending = self._loss, not self._loss_converted
            fields: dict[str, Any] = {
                "time": self._clock(),
                "step": self._step,
                "epoch": self._epoch,
                "batch_size": self._global_batch_size(),
                "local_batch_size": self._local_batch_size,
                "accumulation_steps": self._accumulation_steps,
                "replicas": self._replicas,
                **{name: _valid(value) for name, value in self._goodput.items()},
                "perf_params": self._valid_perf_params(),
                "batch_limits": self._batch_limits,
            }
        if pending:  # outside the lock: may wait for the device (see the module docstring)
            value = _loss_to_float(loss)
            with self._lock:
                if self._loss is loss:
                    self._loss_value, self._loss_converted = value, True
        else:
            value = self._loss_value
        return MetricsSample(
            **fields,
            loss=value,
            step_seconds=_ratio(interval.seconds, interval.timed_steps),
            samples_per_second=_ratio(interval.samples_timed, interval.seconds_with_batch),
            memory_min_bytes=interval.memory_min,
            memory_peak_bytes=interval.memory_peak,
        )

    def _samples_per_boundary(self) -> int | None:
        if self._local_batch_size is None or not self._boundary_per_micro_batch:
            return self._global_batch_size()
        return self._local_batch_size * (self._replicas or 1)

    def _global_batch_size(self) -> int | None:
        if self._local_batch_size is None:
            return None
        accumulation, replicas = self._accumulation_steps or 1, self._replicas or 1
        return self._local_batch_size * accumulation * replicas

    def _valid_perf_params(self) -> tuple[float, ...] | None:
        params = self._perf_params
        if params is None or any(_valid(p) is None for p in params):
            return None
        return params


def _smaller(current: int | None, new: int | None) -> int | None:
    if new is None:
        return current
    return new if current is None else min(current, new)


def _larger(current: int | None, new: int | None) -> int | None:
    if new is None:
        return current
    return new if current is None else max(current, new)


def _ratio(numerator: float, denominator: float) -> float | None:
    """The quotient, or None when there is nothing to divide by."""
    if denominator <= 0:
        return None
    return _valid(numerator / denominator)


def _valid(value: float | None) -> float | None:
    """The value if the control channel accepts it (finite, non-negative), else None."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return value


def _loss_to_float(loss: Any) -> float | None:
    """A float for a scalar loss (tensor, NumPy or Python number); None otherwise."""
    item = getattr(loss, "item", None)
    try:
        value = float(item() if callable(item) else loss)
    except (TypeError, ValueError, RuntimeError):  # not a number, or not a scalar tensor
        return None
    return value if math.isfinite(value) else None
