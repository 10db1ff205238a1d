"""MetricsRecorder: what a metrics sample says about the interval since the previous one."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpuq.control import parse_sample, sample_to_dict
from gpuq.runner.job import RunnerError, StepInfo
from gpuq.runner.metrics import MetricsRecorder


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def info(
    step: int,
    seconds: float | None = 0.5,
    *,
    epoch: int = 0,
    boundary: int | None = None,
    peak: int | None = None,
    loss: Any = None,
) -> StepInfo:
    """A synthetic iteration boundary."""
    return StepInfo(step, epoch, seconds, boundary, peak, loss)


class ScalarLoss:
    """A stand-in for a detached loss tensor that records which threads read it."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.read_by: list[str] = []

    def item(self) -> float:
        self.read_by.append(threading.current_thread().name)
        return self.value


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorder(clock: FakeClock) -> MetricsRecorder:
    return MetricsRecorder(clock=clock)


def test_no_sample_before_the_first_step(recorder: MetricsRecorder) -> None:
    recorder.update_batch(local_batch_size=32)
    recorder.update_goodput(gain=1.5)
    assert recorder.sample() is None


def test_a_sample_carries_the_latest_step_epoch_and_the_clock_time(
    recorder: MetricsRecorder, clock: FakeClock
) -> None:
    recorder.on_step(info(1, None, epoch=0))
    recorder.on_step(info(2, epoch=1))
    clock.now = 1_234.5
    sample = recorder.sample()
    assert sample is not None
    assert (sample.time, sample.step, sample.epoch) == (1_234.5, 2, 1)


def test_step_seconds_is_the_mean_over_the_interval_without_the_untimed_first_step(
    recorder: MetricsRecorder,
) -> None:
    for step, seconds in enumerate([None, 0.2, 0.4, 0.6], start=1):
        recorder.on_step(info(step, seconds))
    first = recorder.sample()
    recorder.on_step(info(5, 1.0))
    second = recorder.sample()
    assert first is not None and second is not None
    assert first.step_seconds == pytest.approx(0.4)
    assert second.step_seconds == pytest.approx(1.0)


def test_samples_per_second_uses_the_global_batch_of_local_times_accumulation_times_replicas(
    recorder: MetricsRecorder,
) -> None:
    recorder.update_batch(local_batch_size=32, accumulation_steps=2, replicas=4)
    recorder.on_step(info(1, 0.5))
    recorder.on_step(info(2, 0.5))
    sample = recorder.sample()
    assert sample is not None
    assert sample.batch_size == 256
    assert (sample.local_batch_size, sample.accumulation_steps, sample.replicas) == (32, 2, 4)
    assert sample.samples_per_second == pytest.approx(512.0)


def test_a_loop_that_marks_every_micro_batch_counts_one_micro_batch_per_replica_each_step(
    recorder: MetricsRecorder,
) -> None:
    recorder.update_batch(
        local_batch_size=32, accumulation_steps=2, replicas=4, boundary_per_micro_batch=True
    )
    recorder.on_step(info(1, 0.5))
    recorder.on_step(info(2, 0.5))
    sample = recorder.sample()
    assert sample is not None
    assert sample.batch_size == 256
    assert sample.samples_per_second == pytest.approx(256.0)  # 2 x 32 x 4 samples in 1 s


def test_a_batch_change_within_an_interval_counts_each_step_at_its_own_batch_size(
    recorder: MetricsRecorder,
) -> None:
    recorder.update_batch(local_batch_size=100)
    recorder.on_step(info(1, 1.0))
    recorder.update_batch(local_batch_size=300)
    recorder.on_step(info(2, 1.0))
    sample = recorder.sample()
    assert sample is not None
    assert sample.samples_per_second == pytest.approx(200.0)  # 400 samples in 2 s
    assert sample.batch_size == 300


def test_without_a_batch_size_there_is_no_throughput(recorder: MetricsRecorder) -> None:
    recorder.on_step(info(1, 0.5))
    sample = recorder.sample()
    assert sample is not None
    assert sample.samples_per_second is None and sample.batch_size is None
    assert sample.step_seconds == 0.5


def test_memory_is_the_smallest_boundary_and_the_largest_peak_of_the_interval(
    recorder: MetricsRecorder,
) -> None:
    recorder.on_step(info(1, boundary=300, peak=900))
    recorder.on_step(info(2, boundary=200, peak=1_500))
    recorder.on_step(info(3, boundary=250, peak=1_100))
    first = recorder.sample()
    recorder.on_step(info(4, boundary=280, peak=1_000))
    second = recorder.sample()
    assert first is not None and second is not None
    assert (first.memory_min_bytes, first.memory_peak_bytes) == (200, 1_500)
    assert (second.memory_min_bytes, second.memory_peak_bytes) == (280, 1_000)


def test_without_cuda_there_are_no_memory_figures(recorder: MetricsRecorder) -> None:
    recorder.on_step(info(1))
    sample = recorder.sample()
    assert sample is not None
    assert sample.memory_min_bytes is None and sample.memory_peak_bytes is None


def test_an_interval_without_steps_keeps_progress_and_loss_but_has_no_timings(
    recorder: MetricsRecorder,
) -> None:
    recorder.update_batch(local_batch_size=8)
    recorder.on_step(info(7, 0.5, epoch=2, boundary=10, peak=20, loss=1.25))
    recorder.sample()
    idle = recorder.sample()  # e.g. parked between the two samples
    assert idle is not None
    assert (idle.step, idle.epoch, idle.loss, idle.batch_size) == (7, 2, 1.25, 8)
    assert idle.step_seconds is None and idle.samples_per_second is None
    assert idle.memory_min_bytes is None and idle.memory_peak_bytes is None


def test_the_loss_is_the_latest_one_given(recorder: MetricsRecorder) -> None:
    recorder.on_step(info(1, loss=2.0))
    recorder.on_step(info(2, loss=1.5))
    recorder.on_step(info(3))  # a step without a loss keeps the previous one
    sample = recorder.sample()
    assert sample is not None and sample.loss == 1.5


def test_a_tensor_loss_is_read_in_sample_on_the_sampling_thread_and_only_once(
    recorder: MetricsRecorder,
) -> None:
    loss = ScalarLoss(0.75)
    training = threading.Thread(target=recorder.on_step, args=(info(1, loss=loss),))
    training.start()
    training.join()
    assert loss.read_by == []  # on_step never converts it
    first, second = recorder.sample(), recorder.sample()
    assert first is not None and second is not None
    assert first.loss == second.loss == 0.75
    assert loss.read_by == [threading.current_thread().name]


@pytest.mark.parametrize("bad", [math.nan, math.inf, "low", object()])
def test_a_loss_that_is_not_a_finite_number_is_reported_as_none(
    recorder: MetricsRecorder, bad: object
) -> None:
    recorder.on_step(info(1, loss=bad))
    sample = recorder.sample()
    assert sample is not None and sample.loss is None


@pytest.mark.torch
def test_torch_losses_become_floats_and_non_scalar_ones_none(recorder: MetricsRecorder) -> None:
    import torch

    recorder.on_step(info(1, loss=torch.tensor(0.5, requires_grad=True).detach() * 3))
    scalar = recorder.sample()
    recorder.on_step(info(2, loss=torch.ones(3)))
    vector = recorder.sample()
    assert scalar is not None and vector is not None
    assert scalar.loss == pytest.approx(1.5) and isinstance(scalar.loss, float)
    assert vector.loss is None


def test_goodput_figures_persist_and_a_none_keeps_the_previous_value(
    recorder: MetricsRecorder,
) -> None:
    recorder.update_goodput(grad_sqr=4.0, grad_var=9.0, gain=1.5, perf_params=(1, 2.5, 3))
    recorder.on_step(info(1))
    first = recorder.sample()
    recorder.update_goodput(efficiency=0.8, goodput=120.0, progress=5_000.0)
    second = recorder.sample()
    assert first is not None and second is not None
    assert (first.grad_sqr, first.grad_var, first.gain, first.efficiency) == (4.0, 9.0, 1.5, None)
    assert first.perf_params == (1.0, 2.5, 3.0)
    assert (second.grad_sqr, second.gain, second.efficiency) == (4.0, 1.5, 0.8)
    assert (second.goodput, second.progress) == (120.0, 5_000.0)
    assert first.batch_limits is None
    recorder.update_goodput(batch_limits=(64, 1024, 1, 256))
    third = recorder.sample()
    assert third is not None and third.batch_limits == (64, 1024, 1, 256)
    assert third.perf_params == (1.0, 2.5, 3.0)  # kept


def test_figures_the_daemon_would_refuse_are_reported_as_none(
    recorder: MetricsRecorder,
) -> None:
    recorder.update_goodput(grad_sqr=-0.1, grad_var=math.nan, gain=math.inf)
    recorder.update_goodput(perf_params=(1.0, math.nan))
    recorder.on_step(info(1))
    sample = recorder.sample()
    assert sample is not None
    assert (sample.grad_sqr, sample.grad_var, sample.gain, sample.perf_params) == (None,) * 4


def test_every_sample_passes_the_control_channel_validation(recorder: MetricsRecorder) -> None:
    recorder.update_batch(local_batch_size=16, accumulation_steps=2)
    recorder.update_goodput(grad_sqr=-1.0, grad_var=2.0, perf_params=(0.1, 0.01, 0.2))
    recorder.on_step(info(1, None, boundary=10, peak=50, loss=-0.5))
    recorder.on_step(info(2, 0.25, epoch=1, loss=math.nan))
    for _ in range(2):
        sample = recorder.sample()
        assert sample is not None
        assert parse_sample(sample_to_dict(sample)) == sample


@pytest.mark.parametrize(
    "batch",
    [
        {"local_batch_size": 0},
        {"local_batch_size": 8, "accumulation_steps": 0},
        {"local_batch_size": 8, "replicas": -1},
        {"local_batch_size": True},
        {"local_batch_size": 8.0},
    ],
)
def test_update_batch_refuses_counts_that_are_not_positive_integers(
    recorder: MetricsRecorder, batch: dict[str, Any]
) -> None:
    with pytest.raises(RunnerError):
        recorder.update_batch(**batch)


def test_concurrent_steps_and_samples_split_into_disjoint_intervals(
    recorder: MetricsRecorder,
) -> None:
    steps = 20_000
    recorder.update_batch(local_batch_size=2)

    def train() -> None:
        for step in range(1, steps + 1):
            recorder.on_step(info(step, 1.0, boundary=step, peak=step))

    training = threading.Thread(target=train)
    training.start()
    samples = []
    while training.is_alive():
        samples.append(recorder.sample())
    training.join()
    samples.append(recorder.sample())
    timed = [s for s in samples if s is not None and s.step_seconds is not None]
    assert timed and all(s.step_seconds == 1.0 and s.samples_per_second == 2.0 for s in timed)
    for before, after in zip(timed, timed[1:], strict=False):
        assert before.memory_peak_bytes is not None and after.memory_min_bytes is not None
        assert after.memory_min_bytes == before.memory_peak_bytes + 1
    assert timed[0].memory_min_bytes == 1 and timed[-1].memory_peak_bytes == steps
    assert timed[-1].step == steps


@pytest.fixture
def outside_job() -> Iterator[None]:
    """A job handle outside gpuq, closed afterwards."""
    import gpuq.runner as gq

    gq.init(environ={}).close()
    gq.init(environ={})
    yield
    gq.init(environ={}).close()


@pytest.mark.torch
def test_as_a_step_hook_it_summarises_a_real_training_loop(outside_job: None) -> None:
    import torch

    import gpuq.runner as gq

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = MetricsRecorder()
    job = gq.init()
    job.add_step_hook(recorder.on_step)
    recorder.update_batch(local_batch_size=8)
    losses = []
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        gq.step(loss=loss)
        losses.append(loss.item())
    sample = recorder.sample()
    assert sample is not None
    assert sample.step == 3 and sample.loss == pytest.approx(losses[-1])
    assert sample.step_seconds is not None and sample.step_seconds > 0
    assert sample.samples_per_second == pytest.approx(8 / sample.step_seconds)
    assert sample.memory_min_bytes is None  # CUDA is not in use


def test_a_new_fitted_model_is_flagged_for_the_channel_and_the_same_one_is_not(
    recorder: MetricsRecorder,
) -> None:
    model = (0.1, 0.01, 0.0, 0.0, 0.0, 0.0, 1.0)
    recorder.update_goodput(grad_sqr=1.0)
    assert not recorder.model_changed.is_set()
    recorder.update_goodput(perf_params=model)
    assert recorder.model_changed.is_set()
    recorder.model_changed.clear()
    recorder.update_goodput(perf_params=model, grad_sqr=2.0)
    assert not recorder.model_changed.is_set()
