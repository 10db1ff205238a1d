"""What the store keeps for the control channel: metrics samples and suspends.

Samples are kept per job, oldest first, thinned past a cap so that a long
job keeps its whole history at a resolution that falls with age. Suspends
are recorded per attempt, before they are acted on, with their mode and
when they completed. Upgrading a database of the first schema, which has
neither, is tested in test_migrations.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.daemon.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A fresh store in a temporary file."""
    opened = Store.open(tmp_path / "gpuq.db")
    yield opened
    opened.close()


def add(store: Store, job_id: int, *steps: int, keep: int = 2000) -> None:
    """Store one sample per step, at time 1000 + step."""
    for step in steps:
        store.add_sample(job_id, 1, {"time": 1000.0 + step, "step": step}, keep=keep)


def test_samples_come_back_oldest_first_per_job(store: Store) -> None:
    add(store, 1, 3, 1, 2)
    add(store, 2, 9)
    assert [s["step"] for s in store.samples(1)] == [1, 2, 3]
    assert store.latest_sample(1) == {"time": 1003.0, "step": 3}
    assert store.latest_sample(3) is None


def test_since_and_limit_select_the_newest_samples(store: Store) -> None:
    add(store, 1, *range(10))
    assert [s["step"] for s in store.samples(1, since=1006.0)] == [7, 8, 9]
    assert [s["step"] for s in store.samples(1, limit=2)] == [8, 9]
    assert store.samples(1, limit=0) == []


@pytest.mark.parametrize("keep", [4, 10, 101])
def test_past_the_cap_the_oldest_samples_are_thinned(store: Store, keep: int) -> None:
    add(store, 1, *range(5 * keep), keep=keep)
    steps = [s["step"] for s in store.samples(1)]
    assert len(steps) <= keep
    assert steps[-1] == 5 * keep - 1  # the newest is always kept
    assert steps[0] < keep  # and something from the beginning survives
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False)]
    assert gaps == sorted(gaps, reverse=True)  # coarser the older


def test_a_suspend_is_recorded_per_attempt_and_completed(store: Store) -> None:
    assert store.suspend_of(1, 1) is None
    store.record_suspend(1, 1, "checkpoint", 100.0)
    record = store.suspend_of(1, 1)
    assert record is not None
    assert (record.mode, record.requested, record.completed) == ("checkpoint", 100.0, None)
    store.complete_suspend(1, 1, 105.0)
    assert store.checkpoint_restarts(1, before_attempt=2) == 1
    assert store.checkpoint_restarts(1, before_attempt=1) == 0
    store.record_suspend(1, 1, "park", 110.0)  # a later suspend of the same attempt
    record = store.suspend_of(1, 1)
    assert record is not None
    assert (record.mode, record.completed) == ("park", None)
