"""The gradient noise scale: estimators on gradients of known statistics, and the hooks.

Synthetic gradients: each sample's gradient is G + noise with noise ~ N(0,
diag(sigma^2)), so a micro-batch of m samples has mean G and covariance
diag(sigma^2) / m; the truth is |G|^2 and tr(Sigma) / M0 = sum(sigma^2) / M0.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

import gpuq.runner as gq
from gpuq.goodput import GradParams
from gpuq.runner.gns import (
    MEASURE_EVERY,
    MEASURE_SHARE,
    GradientNoiseScale,
    measure_interval,
    preconditioner,
)
from gpuq.runner.noise import NoiseAverage, noise_stats, pair_stats

pytestmark = [pytest.mark.torch]

DIM, M0 = 64, 32
RNG = np.random.default_rng(7)
MEAN = RNG.normal(0.0, 0.6, DIM)
SIGMA = RNG.uniform(0.5, 2.0, DIM)
TRUE_SQR = float(MEAN @ MEAN)
TRUE_VAR = float(SIGMA @ SIGMA) / M0


def micro_batch_gradients(draws: int, count: int, micro: int, seed: int) -> np.ndarray:
    """`draws` x `count` micro-batch gradients of `micro` samples each."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, 1.0, (draws, count, DIM)) * SIGMA / np.sqrt(micro)
    return np.asarray(MEAN + noise)


def mean_estimates(gradients: np.ndarray, micro: int) -> tuple[float, float]:
    """The mean over draws of the unbiased (|G|^2, tr(Sigma) / M0) estimates."""
    count = gradients.shape[1]
    local = np.mean(np.sum(gradients**2, axis=2), axis=1)
    total = np.sum(np.mean(gradients, axis=1) ** 2, axis=1)
    stats = [noise_stats(lo, to, count, micro, M0) for lo, to in zip(local, total, strict=True)]
    sqr, var = np.mean(np.asarray(stats), axis=0)
    return float(sqr), float(var)


@pytest.mark.parametrize(
    ("replicas", "accum_steps", "micro"),
    [(1, 1, 16), (1, 3, 32), (4, 1, 16), (8, 0, 64)],
    ids=["accumulation", "more-accumulation", "replicas-and-accumulation", "replicas"],
)
def test_the_unbiased_estimator_is_within_two_percent_over_many_draws(
    replicas: int, accum_steps: int, micro: int
) -> None:
    gradients = micro_batch_gradients(20_000, replicas * (accum_steps + 1), micro, seed=replicas)
    sqr, var = mean_estimates(gradients, micro)
    assert sqr == pytest.approx(TRUE_SQR, rel=0.02)
    assert var == pytest.approx(TRUE_VAR, rel=0.02)


def test_the_differenced_estimator_is_within_two_percent_at_fixed_weights() -> None:
    # Two consecutive steps' gradients at the same weights are two independent micro-batches.
    gradients = micro_batch_gradients(20_000, 2, M0, seed=11)
    sqr, var = mean_estimates(gradients, M0)
    assert sqr == pytest.approx(TRUE_SQR, rel=0.02)
    assert var == pytest.approx(TRUE_VAR, rel=0.02)


def test_two_micro_batches_of_different_sizes_give_unbiased_statistics_too() -> None:
    rng = np.random.default_rng(13)
    first, second = 7, 9  # an odd batch of 16 cut in two
    estimates = []
    for _ in range(20_000):
        g1 = MEAN + rng.normal(0.0, 1.0, DIM) * SIGMA / np.sqrt(first)
        g2 = MEAN + rng.normal(0.0, 1.0, DIM) * SIGMA / np.sqrt(second)
        total = float(np.sum((first * g1 + second * g2) ** 2))
        estimates.append(pair_stats(float(g1 @ g1), float(g2 @ g2), total, first, second, M0))
    sqr, var = np.mean(np.asarray(estimates), axis=0)
    assert sqr == pytest.approx(TRUE_SQR, rel=0.02)
    assert var == pytest.approx(TRUE_VAR, rel=0.02)
    g1, g2 = MEAN + 0.1, MEAN - 0.2  # equal sizes: the same as noise_stats
    local, total = float(g1 @ g1 + g2 @ g2) / 2, float(np.sum(((g1 + g2) / 2) ** 2))
    both = pair_stats(float(g1 @ g1), float(g2 @ g2), total * 64**2, 32, 32, M0)
    assert both == pytest.approx(noise_stats(local, total, 2, 32, M0))


def test_noise_stats_needs_two_micro_batches() -> None:
    with pytest.raises(ValueError, match="two micro-batches"):
        noise_stats(1.0, 1.0, 1, 32, 32)


def test_the_average_is_bias_corrected_and_restarts_when_the_estimator_changes() -> None:
    average = NoiseAverage()
    assert average.params() is None
    average.update(4.0, 2.0, 1.0, "differenced")
    assert average.params() == GradParams(4.0, 2.0)  # one estimate: itself, not 0.1% of it
    average.update(8.0, 6.0, 1.0, "differenced")
    first = average.params()
    assert first is not None and 4.0 < first.sqr < 8.0
    average.update(1.0, 1.0, 2.0, "unbiased")
    assert average.params() == GradParams(1.0, 1.0)


def test_negative_estimates_are_clamped_at_zero_and_non_finite_ones_ignored() -> None:
    average = NoiseAverage()
    average.update(-3.0, 1.0, 1.0, "unbiased")
    average.update(float("nan"), 1.0, 1.0, "unbiased")
    assert average.params() == GradParams(0.0, 1.0)
    assert average.updates == 1


class Linear(nn.Module):
    """loss = mean over samples of w . x: its gradient is the mean of the samples, whatever w."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(DIM, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight).mean()


def synthetic_samples(count: int, generator: torch.Generator) -> torch.Tensor:
    noise = torch.randn(count, DIM, generator=generator, dtype=torch.float64)
    return torch.from_numpy(MEAN) + noise * torch.from_numpy(SIGMA)


def train(gns: GradientNoiseScale, model: Linear, steps: int, micro: int, accum: int) -> None:
    generator = torch.Generator().manual_seed(5)
    for _ in range(steps):
        for position in range(accum + 1):
            model(synthetic_samples(micro, generator)).backward()
            gns.micro_batch(micro, last=position == accum)
            gns.optimizer.step()
            gns.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize(("micro", "accum"), [(16, 1), (8, 3), (32, 0)])
def test_the_hooks_measure_synthetic_gradients_within_two_percent(micro: int, accum: int) -> None:
    model = Linear()
    gns = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), M0, every=1)
    gns.average = NoiseAverage(smoothing=1 - 1e-9)  # a plain mean of every step's estimate
    train(gns, model, 3000 // (accum + 1), micro, accum)
    estimate = gns.estimate()
    assert estimate is not None
    assert gns.average.estimator == ("unbiased" if accum else "differenced")
    assert estimate.sqr == pytest.approx(TRUE_SQR, rel=0.02)
    assert estimate.var == pytest.approx(TRUE_VAR, rel=0.02)


def test_accumulated_micro_batches_make_one_step_on_their_mean_gradient() -> None:
    torch.manual_seed(0)
    model, twin = nn.Linear(8, 3), nn.Linear(8, 3)
    twin.load_state_dict(model.state_dict())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    gns = GradientNoiseScale(optimizer, 4)
    first, second = torch.randn(4, 8), torch.randn(4, 8)
    before = [p.detach().clone() for p in model.parameters()]
    model(first).square().mean().backward()
    gns.micro_batch(4, last=False)
    optimizer.step()
    assert gns.accumulated
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    optimizer.zero_grad(set_to_none=True)
    model(second).square().mean().backward()
    gns.micro_batch(4, last=True)
    optimizer.step()
    assert (gns.accumulated, gns.step_samples) == (False, 8)
    reference = torch.optim.SGD(twin.parameters(), lr=0.5, momentum=0.9)
    twin(torch.cat([first, second])).square().mean().backward()
    reference.step()
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_without_accumulation_the_gradients_the_optimizer_sees_are_untouched() -> None:
    torch.manual_seed(1)
    model = nn.Linear(8, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gns = GradientNoiseScale(optimizer, 4)
    seen: list[torch.Tensor] = []
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.extend(
            p.grad.clone() for p in model.parameters() if p.grad is not None
        )
    )
    model(torch.randn(4, 8)).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    gns.micro_batch(4, last=True)
    optimizer.step()
    assert all(torch.equal(a, b) for a, b in zip(grads, seen, strict=True))


def adam_after(steps: int) -> tuple[nn.Linear, torch.optim.Adam]:
    torch.manual_seed(2)
    model = nn.Linear(6, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.99), eps=1e-6)
    for _ in range(steps):
        model(torch.randn(5, 6)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def test_adam_preconditions_with_its_second_moment_floored_at_each_tensors_mean() -> None:
    model, optimizer = adam_after(4)
    params = list(model.parameters())
    assert preconditioner(optimizer, params) is None
    model, optimizer = adam_after(7)
    params = list(model.parameters())
    moments = [optimizer.state[p]["exp_avg_sq"].reshape(-1) / (1 - 0.99**7) for p in params]
    expected = torch.cat([m.clamp(min=float(m.mean())).sqrt() + 1e-6 for m in moments])
    assert any(bool((m < m.mean()).any()) for m in moments)  # the floor is exercised
    torch.testing.assert_close(preconditioner(optimizer, params), expected)
    assert preconditioner(torch.optim.SGD(params, lr=0.1), params) is None


def test_embedding_rows_adam_never_updated_cannot_swamp_the_statistics() -> None:
    # Row 0 is in every batch; row 1 first appears now: its second moment is 0.
    embedding = nn.Embedding(2, 4)
    optimizer = torch.optim.Adam(embedding.parameters(), lr=1e-3)
    for _ in range(6):
        embedding(torch.zeros(3, dtype=torch.long)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    embedding(torch.tensor([0, 1])).sum().backward()
    pinv = preconditioner(optimizer, [embedding.weight])
    grad = embedding.weight.grad
    assert grad is not None
    conditioned = (grad.reshape(-1) / pinv).view(2, 4)
    # Unfloored, row 1 would be divided by eps (1e-8). Floored, it weighs at most as much
    # as an average coordinate of the table: here half of row 0, whose moment is twice the mean.
    assert float(conditioned[1].abs().max()) <= float(conditioned[0].abs().max()) * 2**0.5 + 1e-6
    idle, late = nn.Linear(2, 2), nn.Linear(2, 2)  # gradients always 0; none until now
    adam = torch.optim.Adam([*embedding.parameters(), *idle.parameters()], lr=1e-3)
    adam.add_param_group({"params": list(late.parameters())})
    for _ in range(6):
        loss = embedding(torch.zeros(3, dtype=torch.long)).sum() + 0 * idle(torch.ones(2)).sum()
        loss.backward()
        adam.step()
        adam.zero_grad(set_to_none=True)
    divisors = preconditioner(adam, [embedding.weight, *idle.parameters(), *late.parameters()])
    assert divisors is not None and torch.isfinite(divisors[:8]).all()
    assert torch.isinf(divisors[8:]).all()  # no second moment to trust: left out


def test_the_statistics_of_an_adam_step_are_those_of_the_preconditioned_gradients() -> None:
    model, optimizer = adam_after(6)
    gns = GradientNoiseScale(optimizer, 5)
    pinv = preconditioner(optimizer, list(model.parameters()))
    grads = []
    for position, x in enumerate([torch.randn(5, 6), torch.randn(5, 6)]):
        model(x).square().mean().backward()
        flat = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
        grads.append(torch.cat(flat) / pinv)
        gns.micro_batch(5, last=position == 1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    local = float((grads[0] @ grads[0] + grads[1] @ grads[1]) / 2)
    total = float(((grads[0] + grads[1]) / 2).square().sum())
    sqr, var = noise_stats(local, total, 2, 5, 5)
    estimate = gns.estimate()
    assert estimate is not None
    assert (estimate.sqr, estimate.var) == pytest.approx((max(sqr, 0.0), max(var, 0.0)), rel=1e-5)


def test_a_step_the_loader_did_not_announce_is_left_alone() -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gns = GradientNoiseScale(optimizer, 4)
    before = model.weight.detach().clone()
    model(torch.randn(4, 4)).sum().backward()
    optimizer.step()
    assert gns.step_samples == 0 and gns.estimate() is None
    assert not torch.equal(before, model.weight)


def test_state_dict_carries_the_gradients_held_between_steps() -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gns = GradientNoiseScale(optimizer, 4)
    model(torch.randn(4, 4)).sum().backward()
    gns.micro_batch(4, last=False)
    optimizer.step()
    state = gns.state_dict()
    assert state["sizes"] == [4] and state["stash"] is not None
    copy = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), 4)
    copy.load_state_dict(state)
    assert torch.equal(copy.state_dict()["stash"], state["stash"])
    assert copy.state_dict()["average"] == state["average"]


@pytest.fixture(autouse=True)
def _no_job_left_open() -> Iterator[None]:
    gq.init(environ={}).close()
    yield
    gq.init(environ={}).close()


def test_one_step_in_every_few_is_measured_from_two_consecutive_gradients() -> None:
    model = Linear()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[torch.Tensor] = []
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.extend(
            p.grad.clone() for p in model.parameters() if p.grad is not None
        )
    )
    gns = GradientNoiseScale(optimizer, M0, every=4)
    train(gns, model, 5, M0, 0)
    assert gns.average.updates == 1  # step 0 has no predecessor: step 1 pairs with it at once
    local = float(seen[0] @ seen[0] + seen[1] @ seen[1]) / 2
    total = float(((seen[0] + seen[1]) / 2).square().sum())
    expected = noise_stats(local, total, 2, M0, M0)
    estimate = gns.estimate()
    assert estimate is not None
    assert (estimate.sqr, estimate.var) == pytest.approx(tuple(max(v, 0.0) for v in expected))
    train(gns, model, 35, M0, 0)
    # Steps 1, 6, 10, 15, ..., 37: 4 and 5 steps apart in turn, so not always the same parity.
    assert gns.average.updates == 9
    accumulating = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), M0, every=4)
    train(accumulating, model, 40, M0 // 2, 1)
    assert accumulating.average.updates == 9 and accumulating.steps == 40  # 0, 5, 9, ..., 36


def test_a_new_batch_size_is_measured_at_its_second_step_not_after_the_interval() -> None:
    model = Linear()
    gns = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), M0, every=32)
    train(gns, model, 10, M0, 0)
    assert gns.average.updates == 1  # steps 0 and 1
    train(gns, model, 2, 2 * M0, 0)  # steps 10 and 11, twice the samples: pair at once
    assert gns.average.updates == 2


@pytest.mark.parametrize(
    ("measure_ms", "step_ms", "every"),
    [(0.1, 0.3, 17), (0.1, 0.001, 32), (2.0, 24.0, 5), (2.0, 200.0, 1), (0.0, 0.3, 1)],
    ids=["short-step", "tiny-step", "transformer", "long-step", "free"],
)
def test_the_cadence_keeps_measurements_under_their_share_of_the_step_time(
    measure_ms: float, step_ms: float, every: int
) -> None:
    assert measure_interval(measure_ms, step_ms) == every
    if 1 < every < MEASURE_EVERY:
        assert measure_ms / every <= MEASURE_SHARE * step_ms < measure_ms / (every - 1)


def test_pace_sets_the_interval_from_the_time_the_measurements_took() -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 0.001  # every reading 1 ms later: a measurement takes 1 ms
        return now[0]

    model = Linear()
    gns = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), M0, clock=clock)
    train(gns, model, 2, M0, 0)
    assert gns.measurements == 1 and gns.measure_seconds == pytest.approx(0.002)
    gns.pace(step_seconds=0.010)  # 2 ms against 10 ms steps: one step in 10 keeps it at 2%
    assert gns.every == 10 and gns.measurements == 0


def test_by_default_one_step_in_thirty_two_is_measured() -> None:
    model = nn.Linear(100, 10)
    assert GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), 4).every == 32
    with pytest.raises(ValueError, match="every"):
        GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), 4, every=0)


def test_the_first_measurements_come_every_other_step_until_the_warmup_is_done() -> None:
    model = Linear()
    warm = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), M0, every=16, warmup=4)
    cold = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), M0, every=16)
    train(warm, model, 8, M0 // 2, 1)
    train(cold, model, 8, M0 // 2, 1)
    assert warm.average.updates >= 4 and cold.average.updates == 1
    train(warm, model, 40, M0 // 2, 1)  # then one step in about 16
    assert 4 + 2 <= warm.average.updates <= 4 + 3


def test_a_whole_step_among_split_ones_waits_rather_than_restart_the_average() -> None:
    model = Linear()
    gns = GradientNoiseScale(torch.optim.SGD(model.parameters(), lr=0.1), M0, every=1)
    train(gns, model, 10, M0 // 2, 1)  # measured from two micro-batches
    updates = gns.average.updates
    assert gns.average.estimator == "unbiased" and updates >= 3
    train(gns, model, 3, M0, 0)  # steps left whole, one or two of them due: none measured
    assert (gns.average.estimator, gns.average.updates) == ("unbiased", updates)
    train(gns, model, 2, M0 // 2, 1)
    assert gns.average.updates > updates  # the same average goes on
    train(gns, model, 20, M0, 0)  # split steps stopped for good: steps are paired again
    estimator: str | None = gns.average.estimator  # (mypy kept the narrowing above)
    assert estimator == "differenced"


def test_decisions_see_grad_sqr_as_measured_unless_it_is_within_its_error_of_zero() -> None:
    resolved = NoiseAverage()
    for sqr in [1.0, 1.1, 0.9, 1.0, 1.05, 0.95]:
        resolved.update(sqr, 5.0, 1.0, "unbiased")
    assert resolved.cautious() == resolved.params()
    unresolved = NoiseAverage()  # small-batch estimates of |G|^2: mostly noise around 0
    for sqr in [3.0, -2.9, 2.5, -2.6, 2.8, -2.7]:
        unresolved.update(sqr, 5.0, 1.0, "unbiased")
    measured, cautious = unresolved.params(), unresolved.cautious()
    assert measured is not None and cautious is not None
    assert measured.sqr < 0.1 and cautious.var == measured.var
    assert cautious.sqr > 0.5  # about one standard error: a finite noise scale
