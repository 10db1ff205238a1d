"""The runner's gradient-noise estimate against a brute-force one, on four kinds of model.

Each model of bench/adaptive_tasks.py (an MLP with SGD, a CNN with momentum,
a transformer language model with embeddings and AdamW, an LSTM with Adam)
trains for a while, then one epoch through `gq.AdaptiveDataLoader` at a fixed
batch (its tuner kept from deciding), where the runner measures its noise as
it would in a real job (the
average is made a plain mean, so it weighs every measurement alike). The
brute-force estimate draws many independent batches at eight points of that
epoch, computes each gradient directly, preconditioned as the optimizer does
(Adam's floored second moment, see `gpuq.runner.gns`), and takes
tr(Sigma) and |G|^2 from their sample covariance and mean.

Both must agree within 25% on tr(Sigma) / M0 and on the noise scale
tr(Sigma) / |G|^2, which is what statistical efficiency depends on.
The batch of each model is chosen near its noise scale: |G|^2 from batches
much smaller than the noise scale is so noisy that a few hundred
measurements would not pin it within 25% (its relative error grows as
noise scale / batch). The brute force averages over eight points because
momentum makes |G|^2 swing from step to step. Seeds are fixed.

Before the preconditioner was floored, the transformer's estimate was off
by a factor of about 1e4 (rows of its embedding that Adam had not yet seen
were divided by eps); before measured steps were split in two halves at
the same weights, the CNN's and the LSTM's noise scales were about twice
too large (two consecutive steps' gradients differ by more than their noise
once the first has moved the weights).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import gpuq.runner as gq
import gpuq.runner.tuning
from bench.adaptive_tasks import TASKS, Batch, Samples, Task, keep
from gpuq.goodput import GradParams
from gpuq.runner.gns import preconditioner
from gpuq.runner.noise import NoiseAverage

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SNAPSHOTS = 8


@dataclasses.dataclass(frozen=True)
class Case:
    """How one model is validated: batch, training before, steps measured, brute-force draws."""

    batch: int
    warm_steps: int
    steps: int
    draws: int


CASES = {
    "mlp": Case(batch=512, warm_steps=10, steps=256, draws=1600),
    "cnn": Case(batch=256, warm_steps=20, steps=256, draws=800),
    "transformer": Case(batch=64, warm_steps=100, steps=512, draws=640),
    "lstm": Case(batch=256, warm_steps=50, steps=256, draws=480),
}


class StepClock:
    """Seconds that pass per sample trained on, so measurements are paced alike on any machine."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[StepClock]:
    fake = StepClock()
    monkeypatch.setattr(gpuq.runner.tuning, "step_clock", fake)
    # One epoch at a fixed batch: the tuner measures but never decides (it could switch
    # between any two steps).
    monkeypatch.setattr(gpuq.runner.tuning.BatchTuner, "decision_due", lambda self: False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gq.init(environ={}).close()
    yield fake
    gq.init(environ={}).close()
    torch.set_num_threads(threads)


def draw(data: Samples, batch: int, generator: torch.Generator) -> Batch:
    """A batch of samples drawn independently, with replacement."""
    return data.__getitems__(torch.randint(0, len(data), (batch,), generator=generator).tolist())


def brute_force(
    task: Task, model: nn.Module, optimizer: torch.optim.Optimizer, data: Samples, draws: int
) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)): from `draws` gradients of independent batches, computed one by one."""
    params = list(model.parameters())
    generator = torch.Generator().manual_seed(draws)
    gradients = []
    for _ in range(draws):
        model.zero_grad(set_to_none=True)
        torch.autograd.backward(task.loss(model, draw(data, task.init_batch, generator)))
        gradients.append(torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]))
    model.zero_grad(set_to_none=True)
    stacked = torch.stack(gradients).double()
    divisor = preconditioner(optimizer, params)
    if divisor is not None:
        stacked = stacked / divisor.double()
    batch_trace = float(stacked.var(dim=0).sum())  # tr(Sigma) / batch
    sqr = float(stacked.mean(dim=0).square().sum()) - batch_trace / draws
    return sqr, batch_trace * task.init_batch


def both_estimates(name: str, clock: StepClock) -> tuple[GradParams, GradParams]:
    """The runner's estimate over one epoch and the brute force's, both as (|G|^2, tr(Sigma))."""
    case = CASES[name]
    task = dataclasses.replace(
        TASKS[name], init_batch=case.batch, max_batch=max(TASKS[name].max_batch, 2 * case.batch)
    )
    torch.manual_seed(0)
    data = task.make_data(case.batch * case.steps, 0)
    model, generator = task.make_model(), torch.Generator().manual_seed(1)
    optimizer = task.optimizer(model)
    for _ in range(case.warm_steps):
        torch.autograd.backward(task.loss(model, draw(data, case.batch, generator)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    job = gq.init(environ={})
    gq.State(model=model, optimizer=optimizer, lr_scaling=task.lr_scaling)
    loader = gq.AdaptiveDataLoader(
        data, batch_size=task.init_batch, max_batch_size=task.max_batch, collate_fn=keep
    )
    assert loader.adaptive and loader.tuner is not None
    gns = loader.tuner.gns
    gns.average = NoiseAverage(smoothing=1 - 1e-12)  # a plain mean of the measurements
    marks = {case.steps * (2 * i + 1) // (2 * SNAPSHOTS) + i % 2 for i in range(SNAPSHOTS)}
    snapshots = []
    for _ in gq.epochs(1):
        for batch in loader:
            clock.now += 1e-4 * len(batch[0])
            torch.autograd.backward(task.loss(model, batch))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            gq.step()
            if gns.steps in marks and not gns.accumulated:
                marks.discard(gns.steps)
                snapshots.append(copy.deepcopy((model, optimizer)))
    job.close()
    measured = gns.estimate()
    assert measured is not None and gns.average.estimator == "unbiased"
    assert gns.average.updates >= case.steps // 4
    brute = [brute_force(task, *shot, data, case.draws // SNAPSHOTS) for shot in snapshots]
    sqr = sum(b[0] for b in brute) / len(brute)
    trace = sum(b[1] for b in brute) / len(brute)
    return measured, GradParams(sqr, trace / task.init_batch)


@pytest.mark.parametrize("name", list(CASES))
def test_the_noise_estimate_agrees_with_brute_force_within_a_quarter(
    name: str, clock: StepClock
) -> None:
    measured, brute = both_estimates(name, clock)
    assert measured.sqr > 0 and brute.sqr > 0
    assert measured.var == pytest.approx(brute.var, rel=0.25)
    noise_scale, brute_noise_scale = measured.var / measured.sqr, brute.var / brute.sqr
    assert noise_scale == pytest.approx(brute_noise_scale, rel=0.25)
