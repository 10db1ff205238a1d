"""The phases of a migration, read from the job's events (`gpuq.daemon.history.migrations`).

The events are those the daemon writes for `gpuq migrate` (see
tests/test_remote_migrate.py for the real thing); each phase is the time
between two of them, the save time is the runner's own measure, and the
first step ends at the new attempt's first metrics sample.
"""

from __future__ import annotations

import pytest

from gpuq.cli.render import migration_line
from gpuq.daemon.history import migrations
from gpuq.models import JobEvent, JobState

Q, S, R, SP = JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING


def trail(*steps: tuple[float, JobState, str]) -> list[JobEvent]:
    return [JobEvent(7, when, state, reason) for when, state, reason in steps]


MIGRATED = trail(
    (0.0, Q, "submitted"),
    (1.0, S, "starting on GPU-a"),
    (1.5, R, "started"),
    (10.0, SP, "migrating to gpu2, as asked (checkpoint requested)"),
    (
        10.5,
        Q,
        "migrating to gpu2, as asked: checkpoint saved at step 40 (12.0M in 0.10s); "
        "queued to restart from it",
    ),
    (10.6, S, "starting on gpu2: GPU-b; its checkpoint is copied from head first"),
    (11.4, S, "checkpoint copied from head to gpu2: 12.0M in 0.80s (15.0M/s), verified"),
    (11.6, R, "started"),
)


def test_each_phase_is_timed_from_the_events_and_the_first_sample() -> None:
    [move] = migrations(MIGRATED, [9.0, 12.9, 13.5])
    assert (move.source, move.target, move.requested) == ("head", "gpu2", 10.0)
    assert move.drain == pytest.approx(0.4)  # 0.5 s until saved, 0.1 s of it saving
    assert move.save == pytest.approx(0.1)
    assert move.copy == pytest.approx(0.8)
    assert move.start == pytest.approx(0.2)
    assert move.first_step == pytest.approx(1.3)


def test_a_migration_still_under_way_has_only_its_phases_so_far() -> None:
    [move] = migrations(MIGRATED[:6], [])
    assert move.save == pytest.approx(0.1)
    assert move.copy is None and move.start is None and move.first_step is None
    assert migration_line(move.to_dict()).endswith(
        "? -> gpu2: drain 0.40s, save 0.10s, copy -, start -, restore + first step -"
    )


def test_a_cancelled_migration_has_no_phases() -> None:
    cancelled = [*MIGRATED[:4], JobEvent(7, 11.0, JobState.CANCELLED, "cancelled by user")]
    [move] = migrations(cancelled, [])
    assert move.drain is None and move.save is None and move.copy is None


def test_a_job_never_migrated_has_none() -> None:
    assert migrations(MIGRATED[:3], [2.0]) == []
