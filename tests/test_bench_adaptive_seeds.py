"""bench/bench_adaptive.py's repeats: each one a training trajectory of its own."""

from __future__ import annotations

import math

import pytest

from bench.adaptive_runs import train
from bench.adaptive_tasks import TASKS

pytestmark = [pytest.mark.torch]


def short_run(seed: int) -> list[float]:
    """The MLP at M0 for 512 samples, validated every 128: its validation losses."""
    task = TASKS["mlp"]
    held_out = task.make_data(256, 99)
    run = train(
        task,
        task.make_data(1_024, 0),
        (held_out.x, held_out.y),
        batch=task.init_batch,
        target=-math.inf,
        eval_every=128,
        max_samples=512,
        seed=seed,
    )
    assert run.seed == seed
    return run.losses


def test_a_seed_fixes_the_trajectory_and_another_seed_gives_another() -> None:
    # The initial weights and the order of the data both follow the seed: the same seed
    # trains the same way (M0 runs no tuner, so nothing depends on timing), another does not.
    first = short_run(0)
    assert short_run(0) == first
    assert short_run(1) != first
