"""Moves under way, step by step (see the docstring of gpuq/daemon/scheduler/moves.py).

An in-process daemon on two fake GPUs with its real store; jobs are rows
moved through their states by `DaemonState.transition`, with no process
behind them, and starts are recorded instead of spawned: what is tested is
how each booked move is finished or undone as its job stands, what the
policy is shown meanwhile, and which starts are held back.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuq.daemon import lifecycle
from gpuq.daemon.scheduler import moves
from gpuq.daemon.scheduler.binding import Placement
from gpuq.daemon.server import Server
from gpuq.daemon.state import DaemonState
from gpuq.daemon.store import NewJob
from gpuq.models import Job, JobSpec, JobState
from gpuq.policies.interface import ClusterState, GpuView, JobView, NodeView
from tests.daemon_harness import DaemonHarness

G = 1024**3
REASON = "moved to GPU 1: frees GPU 0 for job 9"

Started = list[tuple[int, Placement, str]]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Started:
    """Every start asked of `lifecycle`, recorded instead of spawned."""
    calls: Started = []

    def record(_: DaemonState, job: Job, placement: Placement, note: str = "") -> None:
        calls.append((job.id, placement, note))

    monkeypatch.setattr(lifecycle, "start", record)
    return calls


def in_daemon(tmp_path: Path, body: Callable[[DaemonState, list[str]], None]) -> None:
    """Run `body(state, GPU UUIDs)` inside a started in-process daemon."""
    harness = DaemonHarness(tmp_path)

    async def run() -> None:
        server = Server(harness.config)
        await server.startup()
        try:
            assert server.state is not None
            body(server.state, [gpu.uuid for gpu in server.state.gpus.devices])
        finally:
            await server.shutdown()

    asyncio.run(run())


def new_job(state: DaemonState, gpu_mem: int | None = 4 * G) -> Job:
    spec = JobSpec(command=("true",), cwd="/", env=dict(os.environ), gpus=1, gpu_mem=gpu_mem)
    (job,), _ = state.store.insert_jobs([NewJob(spec, JobState.QUEUED, "submitted")], 0.0, None)
    state.active[job.id] = job
    return job


def running(state: DaemonState, uuid: str) -> Job:
    """A job that runs its first attempt on `uuid` (a row: no process)."""
    job = new_job(state)
    return state.transition(
        job, JobState.RUNNING, "started", gpu_uuids=(uuid,), gpu_mem_reserved=4 * G, attempts=1
    )


def book(state: DaemonState, job: Job, target: str, requested: float | None = None) -> None:
    entry = moves.Booked(
        job.id, job.attempts, job.gpu_uuids, (target,), 4 * G, REASON, requested or time.time()
    )
    current = moves.load(state)
    current.moves[job.id] = entry
    current.moved_at[job.id] = entry.requested
    moves.save(state, current)


def reasons(state: DaemonState, job_id: int) -> list[str]:
    return [event.reason for event in state.store.events(job_id)]


def test_a_checkpointed_job_restarts_on_its_booked_gpus_with_the_reason(
    tmp_path: Path, started: Started
) -> None:
    def body(state: DaemonState, gpus: list[str]) -> None:
        job = running(state, gpus[0])
        book(state, job, gpus[1])
        job = state.transition(job, JobState.SUSPENDING, f"{REASON} (checkpoint requested)")
        moves.settle(state, gpus)
        assert started == []  # still checkpointing: wait
        state.transition(job, JobState.QUEUED, "queued to restart", gpu_uuids=())
        after = moves.settle(state, gpus)
        assert started == [(job.id, Placement(job.id, (gpus[1],), 4 * G), REASON)]
        assert job.id in after.moves  # until its next attempt runs
        state.transition(state.active[job.id], JobState.RUNNING, "started", attempts=2)
        assert moves.settle(state, gpus).moves == {}
        assert moves.load(state).moved_at == {job.id: pytest.approx(time.time(), abs=60)}

    in_daemon(tmp_path, body)


def test_a_job_still_running_its_booked_attempt_keeps_running_and_the_move_is_undone(
    tmp_path: Path, started: Started
) -> None:
    def body(state: DaemonState, gpus: list[str]) -> None:
        never_asked = running(state, gpus[0])
        book(state, never_asked, gpus[1])
        withdrawn = running(state, gpus[1])
        book(state, withdrawn, gpus[0], requested=time.time() - 10)
        state.store.record_suspend(withdrawn.id, 1, "checkpoint", time.time(), "policy", REASON)
        assert moves.settle(state, gpus).moves == {}
        assert started == []
        assert reasons(state, never_asked.id)[-1] == (
            "the move to GPU 1 is undone: the daemon stopped before asking it to; "
            "it keeps running where it was"
        )
        assert reasons(state, withdrawn.id)[-1].endswith(
            "undone: the job did not checkpoint; it keeps running where it was"
        )
        assert state.active[never_asked.id].state is JobState.RUNNING

    in_daemon(tmp_path, body)


def test_a_move_to_a_gpu_that_is_gone_is_undone_and_the_job_waits_for_the_policy(
    tmp_path: Path, started: Started
) -> None:
    def body(state: DaemonState, gpus: list[str]) -> None:
        job = running(state, gpus[0])
        book(state, job, "GPU-gone")
        state.transition(job, JobState.QUEUED, "queued to restart", gpu_uuids=())
        assert moves.settle(state, []).moves != {}  # no sample yet: no judgement
        assert moves.settle(state, gpus).moves == {}
        assert started == []
        assert reasons(state, job.id)[-1] == (
            "the move is undone: GPU-gone is gone; the job waits for GPUs"
        )

    in_daemon(tmp_path, body)


def test_moves_of_jobs_that_ended_are_forgotten(tmp_path: Path, started: Started) -> None:
    def body(state: DaemonState, gpus: list[str]) -> None:
        job = running(state, gpus[0])
        book(state, job, gpus[1])
        state.transition(job, JobState.CANCELLED, "cancelled by user", end_time=time.time())
        after = moves.settle(state, gpus)
        assert (after.moves, after.moved_at) == ({}, {})

    in_daemon(tmp_path, body)


def test_the_policy_sees_a_moving_job_on_its_new_gpus_and_nothing_starts_on_its_old_ones(
    tmp_path: Path, started: Started
) -> None:
    def body(state: DaemonState, gpus: list[str]) -> None:
        job = running(state, gpus[0])
        book(state, job, gpus[1])
        state.transition(job, JobState.SUSPENDING, f"{REASON} (checkpoint requested)")
        cluster = ClusterState(
            nodes=(NodeView("n", 2),),
            jobs=(JobView(job.id, 0.0, gpu_uuids=(gpus[0],), allocation=(1,), gpu_mem=4 * G),),
            gpus=tuple(GpuView(uuid, "n", 16 * G, index=i) for i, uuid in enumerate(gpus)),
        )
        shown = moves.present(moves.load(state), state, cluster).jobs[0]
        assert (shown.gpu_uuids, shown.allocation, shown.gpu_mem) == ((gpus[1],), (1,), 4 * G)
        assert shown.moved_at is not None
        waiting: dict[int, str] = {}
        starts = [Placement(9, (gpus[0],)), Placement(10, (gpus[1],), G)]
        assert moves.hold_back(state, cluster, {}, starts, waiting) == [starts[1]]
        assert waiting == {9: f"waiting for job {job.id} to checkpoint and move off GPU 0"}


def test_nothing_starts_beside_a_job_the_decision_moves_but_that_did_not_leave(
    tmp_path: Path, started: Started
) -> None:
    def body(state: DaemonState, gpus: list[str]) -> None:
        stays = running(state, gpus[0])  # its move could not begin: no booking, still running
        cluster = ClusterState(
            nodes=(NodeView("n", 2),),
            jobs=(),
            gpus=tuple(GpuView(uuid, "n", 16 * G, index=i) for i, uuid in enumerate(gpus)),
        )
        bindings = {stays.id: (gpus[1],), 9: (gpus[0],)}
        waiting: dict[int, str] = {}
        assert moves.hold_back(state, cluster, bindings, [Placement(9, (gpus[0],))], waiting) == []
        assert waiting == {9: f"waiting for job {stays.id} to checkpoint and move off GPU 0"}
        kept = {stays.id: (gpus[0],)}
        assert moves.hold_back(state, cluster, kept, [Placement(10, (gpus[0],), G)], {}) != []

    in_daemon(tmp_path, body)


def test_a_damaged_book_is_dropped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def body(state: DaemonState, gpus: list[str]) -> None:
        state.store.save_policy_state(moves.BOOK_KEY, '{"version": 1, "moves": [{}]}', 0.0)
        assert moves.load(state).moves == {}
        assert "the book of moves is unreadable" in caplog.text

    in_daemon(tmp_path, body)
