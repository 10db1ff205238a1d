"""The adaptive data loader: goodput-tuned batch sizes inside a plain training loop.

Step times come from a deterministic clock that the loop advances by a cost
per micro-batch (a fixed overhead plus a cost per sample), so the tuner's
decisions are reproducible; the gradients are real. The noise scale of the
tiny model is measured as often as the runner allows (every other step;
by default at most one step in 32, see `gpuq.runner.gns.MEASURE_EVERY`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import gpuq.runner as gq
import gpuq.runner.gns
import gpuq.runner.loop
import gpuq.runner.tuning
from gpuq.runner import checkpoint, distributed
from gpuq.runner.data import split_in_halves
from gpuq.runner.tuning import DECISION_SHARE, BatchTuner, StepProfile

pytestmark = [pytest.mark.torch]

SAMPLES, M0 = 512, 16


@dataclass
class FakeClock:
    """Seconds that pass only when the training loop says so."""

    now: float = 0.0
    overhead: float = 0.01
    per_sample: float = 0.0001

    def __call__(self) -> float:
        return self.now

    def work(self, samples: int) -> None:
        self.now += self.overhead + self.per_sample * samples


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(gpuq.runner.tuning, "step_clock", fake)
    monkeypatch.setattr(gpuq.runner.gns, "MEASURE_EVERY", 1)  # measure as often as allowed
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gq.init(environ={}).close()
    yield fake
    gq.init(environ={}).close()
    torch.set_num_threads(threads)


def noisy_regression(signal: float = 0.1) -> TensorDataset:
    """Targets x . w plus much noise: a large noise scale, so big batches stay efficient."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 8, generator=generator)
    w = signal * torch.randn(8, 1, generator=generator)
    y = x @ w + 3.0 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(x, y)


@dataclass
class Run:
    """What a training run left behind, for comparisons."""

    final: dict[str, Any]
    batches: list[tuple[int, int, int]] = field(default_factory=list)  # (epoch, size, accum)
    passes: list[int] = field(default_factory=list)  # passes per epoch
    lrs: list[float] = field(default_factory=list)  # during each optimizer step


def train(
    clock: FakeClock,
    epochs: int,
    *,
    lr_scaling: str | None = "adascale",
    accumulation: bool = True,
    max_batch_size: int = 256,
    suspend_at: frozenset[int] = frozenset(),
    run: Run | None = None,
    signal: float = 0.1,
    sharded: bool = False,
) -> Run:
    """Train for `epochs`; may exit with SystemExit at a step in `suspend_at` (inside gpuq)."""
    model = nn.Linear(8, 1)
    nn.init.zeros_(model.weight)  # near the optimum: the gradient is mostly noise
    nn.init.zeros_(model.bias)
    opt = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    run = run or Run({})
    opt.register_step_pre_hook(lambda o, a, k: run.lrs.append(o.param_groups[0]["lr"]))
    job = gq.init()
    job.add_step_hook(lambda info: job.request_suspend() if info.step in suspend_at else None)
    state = gq.State(model=model, optimizer=opt, lr_scheduler=sched, lr_scaling=lr_scaling)
    state.restore()
    data = noisy_regression(signal)
    loader = gq.AdaptiveDataLoader(
        distributed.shard(data) if sharded else data,
        batch_size=M0,
        max_batch_size=max_batch_size,
        gradient_accumulation=accumulation,
    )
    for epoch in gq.epochs(epochs):
        for x, y in loader:
            clock.work(len(x))
            (model(x) - y).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step()
        run.batches.append((epoch, loader.batch_size, loader.accumulation_steps))
        run.passes.append(loader.pass_number + 1)
        sched.step()
    run.final = {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "momentum": [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()],
        "step": job.step,
    }
    return run


def test_without_an_lr_rule_max_batch_size_only_bounds_a_fixed_batch(clock: FakeClock) -> None:
    run = train(clock, 3, lr_scaling=None)
    assert [size for _, size, _ in run.batches] == [M0] * 3
    assert run.passes == [1, 1, 1] and run.final["step"] == 3 * SAMPLES // M0


def test_at_its_initial_batch_an_adaptive_loader_trains_like_a_fixed_one_to_rounding(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed = train(clock, 1, lr_scaling=None)
    gq.init(environ={}).close()
    monkeypatch.setattr(BatchTuner, "decision_due", lambda self: False)  # kept at M0
    adaptive = train(clock, 1)
    tuner = gq.init().loaders["loader0"].tuner
    assert isinstance(tuner, BatchTuner)
    # Measured steps take their batch as two halves (one more gq.step() each), and step once
    # on the mean of the halves' gradients: the same step, summed in another order.
    assert adaptive.passes == [1] and tuner.steps == fixed.final["step"] == SAMPLES // M0
    assert adaptive.final["step"] == tuner.steps + tuner.gns.average.updates
    for key, value in fixed.final["model"].items():
        torch.testing.assert_close(adaptive.final["model"][key], value, rtol=1e-5, atol=1e-6)
    assert set(adaptive.lrs) == {0.002}


def test_with_cheap_large_batches_and_noisy_gradients_the_batch_grows(clock: FakeClock) -> None:
    run = train(clock, 4)
    sizes = [size * (accum + 1) for _, size, accum in run.batches]
    assert max(sizes) > 4 * M0
    grown = [i for i, size in enumerate(sizes) if size > M0]
    assert all(run.batches[i][2] >= 1 for i in grown)  # one process: accumulate at least once
    job = gq.init()
    loader = job.loaders["loader0"]
    tuner = loader.tuner
    assert isinstance(tuner, BatchTuner) and tuner.perf is not None
    assert max(run.lrs) > 0.002 * 0.9**3  # AdaScale raised the LR during the large steps ...
    assert job.state is not None
    assert job.state.objects["optimizer"].param_groups[0]["lr"] == pytest.approx(0.002 * 0.9**4)


def test_the_batch_changes_at_a_step_boundary_in_the_middle_of_a_pass(clock: FakeClock) -> None:
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    gq.State(model=model, optimizer=opt, lr_scaling="adascale")
    loader = gq.AdaptiveDataLoader(noisy_regression(), batch_size=M0, max_batch_size=256)
    seen: list[tuple[int, int]] = []  # (where the step began in its pass, its batch size)
    for _ in gq.epochs(3):
        for x, y in loader:
            seen.append((loader.index - loader.batch_size, loader.batch_size))
            clock.work(len(x))
            (model(x) - y).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step()
    pairs = zip(seen[1:], seen[:-1], strict=True)
    changes = [start for (start, size), (_, before) in pairs if size != before]
    assert changes and any(start % SAMPLES for start in changes)  # not only where a pass begins
    tuner = loader.tuner
    assert tuner is not None and tuner.config.batch_size > M0


def test_decisions_take_at_most_their_share_of_the_training_time(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    fits, configs = [0], [0]
    real_fit, real_use = StepProfile.fit, BatchTuner._use

    def slow_fit(profile: StepProfile, times: Any = None) -> Any:
        fits[0] += 1
        clock.now += 0.05  # a decision costs as much as five steps
        return real_fit(profile, times)

    def counted_use(tuner: BatchTuner, config: Any) -> None:
        configs[0] += 1
        real_use(tuner, config)

    monkeypatch.setattr(StepProfile, "fit", slow_fit)
    monkeypatch.setattr(BatchTuner, "_use", counted_use)
    train(clock, 20)  # decisions 500 steps apart: the first, on 8 measurements, cannot move
    deciding, changes = 0.05 * fits[0], configs[0] - 1  # the first is the initial batch
    # Decisions that kept the configuration cost at most their share; each change is
    # followed by one at once (the new batch size's times are in).
    assert fits[0] > changes >= 1
    assert deciding - 0.05 * changes <= DECISION_SHARE * (clock.now - deciding) + 0.05


def test_an_epoch_of_less_efficient_large_batches_takes_more_than_one_pass(
    clock: FakeClock,
) -> None:
    run = train(clock, 4, accumulation=False, signal=0.5)
    sizes = [size for _, size, _ in run.batches]
    tuner = gq.init().loaders["loader0"].tuner
    grad = tuner.gns.cautious_estimate()
    assert grad is not None and grad.sqr > 0  # efficiency below 1 at larger batches
    assert max(sizes) > M0
    assert any(passes > 1 for passes, size in zip(run.passes, sizes, strict=True) if size > M0)
    assert tuner.progress == pytest.approx(4 * SAMPLES, abs=max(sizes))


def test_a_pass_without_optimizer_steps_ends_the_epoch(clock: FakeClock) -> None:
    train(clock, 2)
    loader = gq.init().loaders["loader0"]
    assert loader.adaptive
    batches = list(loader)  # evaluation: nobody steps the optimizer
    assert 0 < len(batches) <= len(loader) and loader.pass_number == 0


def test_a_resumed_adaptive_run_is_bitwise_equal_to_an_uninterrupted_one(
    tmp_path: Path, clock: FakeClock
) -> None:
    reference = train(clock, 5)
    assert len({(size, accum) for _, size, accum in reference.batches}) > 1
    steps = reference.final["step"]
    # Suspends at the start, in accumulation groups, at epoch ends, and near the finish.
    suspend_at = frozenset({1, 31, 32, 33, 47, steps // 2, steps // 2 + 1, steps - 2})
    resumed = Run({})
    held: list[bool] = []  # whether each checkpoint holds micro-batch gradients of a step
    for attempt in itertools.count(1):
        gq.init(environ={}).close()
        environ = {"GPUQ_JOB_ID": "5", "GPUQ_CHECKPOINT_DIR": str(tmp_path)}
        gq.init(environ=environ | {"GPUQ_ATTEMPT": str(attempt)})
        try:
            train(clock, 5, suspend_at=suspend_at, run=resumed)
            break
        except SystemExit as exit_:
            assert exit_.code == gq.SUSPEND_EXIT_CODE
            saved = checkpoint.load_latest(tmp_path)
            assert saved is not None
            held.append(bool(saved.payload["loaders"]["loader0"]["tuner"]["gns"]["sizes"]))
        assert attempt < 20
    assert attempt == len(suspend_at) + 1
    assert any(held) and not all(held)
    assert resumed.final["step"] == steps
    for key, value in reference.final["model"].items():
        assert torch.equal(value, resumed.final["model"][key]), key
    for ours, theirs in zip(reference.final["momentum"], resumed.final["momentum"], strict=True):
        assert torch.equal(ours, theirs)


def test_the_tuner_reports_its_batch_and_goodput_to_the_job_metrics(clock: FakeClock) -> None:
    recorded: dict[str, list[dict[str, Any]]] = {"batch": [], "goodput": []}

    class Recorder:
        def update_batch(self, **kwargs: Any) -> None:
            recorded["batch"].append(kwargs)

        def update_goodput(self, **kwargs: Any) -> None:
            recorded["goodput"].append(kwargs)

    gq.init().metrics = Recorder()  # type: ignore[assignment]
    train(clock, 3)
    assert recorded["batch"][0] == {
        "local_batch_size": M0,
        "accumulation_steps": 1,
        "replicas": 1,
        "boundary_per_micro_batch": True,  # its loop marks every micro-batch with gq.step()
    }
    assert any(b["local_batch_size"] * b["accumulation_steps"] > M0 for b in recorded["batch"])
    perf = [g["perf_params"] for g in recorded["goodput"] if "perf_params" in g]
    assert perf and all(len(p) == 7 for p in perf)
    # With each model, the limits a policy needs to predict other GPU counts.
    limits = [g["batch_limits"] for g in recorded["goodput"] if "perf_params" in g]
    assert all(len(b) == 4 and b[0] == M0 and b[1] >= b[0] and 1 <= b[2] <= b[3] for b in limits)
    progress = [g["progress"] for g in recorded["goodput"] if "progress" in g]
    assert progress == sorted(progress) and progress[-1] > 2 * SAMPLES
    assert all(1.0 <= g["gain"] for g in recorded["goodput"] if "gain" in g)


def test_on_one_ranks_shard_under_torchrun_the_batch_stays_fixed_with_a_warning(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # the ranks would tune on different data
    with pytest.warns(RuntimeWarning, match="not a shard"):
        run = train(clock, 2, sharded=True)
    assert [size for _, size, _ in run.batches] == [M0, M0] and run.passes == [1, 1]


def test_an_unknown_lr_rule_is_refused_with_the_known_ones(clock: FakeClock) -> None:
    with pytest.raises(gq.RunnerError, match="lr_scaling") as refused:
        gq.State(model=nn.Linear(2, 1), lr_scaling="cubic")
    assert "adascale" in (refused.value.hint or "")


def test_the_local_batch_stays_under_the_memory_bound_learned_from_peaks(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, per_sample, fits = 1000, 100, 40  # peak bytes = base + per_sample x local batch
    received = [M0]
    monkeypatch.setattr(
        gpuq.runner.loop, "_cuda_memory", lambda: (base, base + per_sample * received[-1])
    )
    capacity = base + per_sample * fits  # as 90% of a device's memory would be
    monkeypatch.setattr(gpuq.runner.tuning, "_device_memory", lambda optimizer: capacity)
    model = nn.Linear(8, 1)
    nn.init.zeros_(model.weight)
    opt = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    gq.State(model=model, optimizer=opt, lr_scaling="adascale")
    loader = gq.AdaptiveDataLoader(
        noisy_regression(), batch_size=M0, max_batch_size=256, gradient_accumulation=True
    )
    assert loader.adaptive and loader.tuner is not None
    assert loader.tuner.capacity == base + per_sample * fits
    configs = []
    for _ in gq.epochs(5):
        for x, y in loader:
            received.append(len(x))
            clock.work(len(x))
            (model(x) - y).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step()
        configs.append((loader.batch_size, loader.accumulation_steps))
    assert max(received) <= fits
    assert any(local * (accum + 1) > fits for local, accum in configs)  # accumulation goes on
    assert loader.tuner.profile.peaks[M0] == base + per_sample * M0


@pytest.mark.gpu
def test_on_cuda_the_tuner_learns_peaks_and_the_device_memory(clock: FakeClock) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = nn.Linear(8, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    gq.State(model=model, optimizer=opt, lr_scaling="adascale")
    loader = gq.AdaptiveDataLoader(noisy_regression(), batch_size=M0, max_batch_size=256)
    for _ in gq.epochs(3):
        for x, y in loader:
            clock.work(len(x))
            (model(x.cuda()) - y.cuda()).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step()
    tuner = loader.tuner
    assert tuner is not None and tuner.capacity is not None
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0.8 * total < tuner.capacity < total
    assert tuner.profile.peaks and all(peak > 0 for peak in tuner.profile.peaks.values())


def test_a_measured_step_takes_its_batch_as_two_halves_at_the_same_weights(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BatchTuner, "decision_due", lambda self: False)  # kept at M0
    received: list[int] = []
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.002, momentum=0.9)
    gq.State(model=model, optimizer=opt, lr_scaling="adascale")
    loader = gq.AdaptiveDataLoader(noisy_regression(), batch_size=M0, max_batch_size=256)
    for _ in gq.epochs(1):
        for x, y in loader:
            received.append(len(x))
            clock.work(len(x))
            (model(x) - y).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step()
    tuner = loader.tuner
    assert tuner is not None and tuner.gns.average.estimator == "unbiased"
    halves = [i for i, size in enumerate(received) if size == M0 // 2]
    assert halves and all(received[i + 1] == M0 // 2 for i in halves[::2])
    assert sum(received) == SAMPLES and tuner.steps == SAMPLES // M0
    assert tuner.gns.average.updates == len(halves) // 2
    assert "8,1" in tuner.profile.times  # a split step is timed as two micro-batches of 8


@pytest.mark.parametrize(
    ("batch", "size", "halves"),
    [
        (torch.arange(4), 4, (torch.arange(2), torch.arange(2, 4))),
        ((torch.zeros(4, 2), [torch.ones(4)]), 4, ((torch.zeros(2, 2), [torch.ones(2)]),) * 2),
        ({"x": torch.zeros(4, 3)}, 4, ({"x": torch.zeros(2, 3)},) * 2),
        (torch.arange(5), 5, (torch.arange(2), torch.arange(2, 5))),
    ],
    ids=["tensor", "nested", "dict", "odd"],
)
def test_a_collated_batch_splits_into_two_halves(batch: Any, size: int, halves: Any) -> None:
    assert str(split_in_halves(batch, size)) == str(halves)


@pytest.mark.parametrize(
    ("batch", "size"),
    [(torch.zeros(1, 2), 1), (torch.zeros(4), 6), ((torch.zeros(4), "text"), 4), ([], 4)],
    ids=["one-sample", "other-size", "not-a-tensor", "empty"],
)
def test_a_batch_that_cannot_be_halved_is_left_whole(batch: Any, size: int) -> None:
    assert split_in_halves(batch, size) is None
