"""A job the scheduler is checkpointing off its GPUs is still the policy's to size.

When one decision resizes two jobs at once (one shrinks so that the other
grows), the first to save its checkpoint is queued and triggers the next
decision while the other still checkpoints. Shown to the policy as a job it
may not preempt, the one still checkpointing kept its GPUs in that decision,
the first restarted on what was left (its old size), and the same two
resizes were asked again at every decision. The view shows such a job as
preemptible; a job suspended by its user, or parked for a turn, is not.

An in-process daemon on two fake GPUs with its real store; jobs are rows
moved through their states by `DaemonState.transition`, with no process
behind them, and the policy's decision is captured instead of made.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from gpuq.daemon import suspend
from gpuq.daemon.scheduler import tick
from gpuq.daemon.server import Server
from gpuq.daemon.state import DaemonState
from gpuq.daemon.store import NewJob
from gpuq.models import Job, JobSpec, JobState
from gpuq.policies.interface import ClusterState
from tests.daemon_harness import DaemonHarness


def running(state: DaemonState, uuid: str) -> Job:
    """A job that runs its first attempt on `uuid` (a row: no process)."""
    spec = JobSpec(command=("true",), cwd="/", env=dict(os.environ), gpus=1)
    (job,), _ = state.store.insert_jobs([NewJob(spec, JobState.QUEUED, "submitted")], 0.0, None)
    state.active[job.id] = job
    return state.transition(job, JobState.RUNNING, "started", gpu_uuids=(uuid,), attempts=1)


def suspending(state: DaemonState, job: Job, mode: str, purpose: str) -> Job:
    """`job` asked to suspend in `mode` by `purpose` ("policy", "user", "slice")."""
    state.store.record_suspend(job.id, job.attempts, mode, time.time(), purpose, "why")
    return state.transition(job, JobState.SUSPENDING, f"suspend requested ({mode} mode)")


def shown_to_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Whether the policy sees each kind of job as preemptible, in one scheduling pass."""
    seen: list[ClusterState] = []

    async def capture(_: DaemonState, cluster: ClusterState, now: float) -> str:
        seen.append(cluster)
        return "captured"

    monkeypatch.setattr(tick, "decide", capture)
    harness = DaemonHarness(tmp_path)
    names: dict[int, str] = {}

    async def run() -> None:
        server = Server(harness.config)
        await server.startup()
        try:
            state = server.state
            assert state is not None
            first, second = (gpu.uuid for gpu in state.gpus.devices)
            resized = suspending(state, running(state, first), "checkpoint", "policy")
            by_user = suspending(state, running(state, second), "checkpoint", "user")
            names.update({resized.id: "preempted by the scheduler", by_user.id: "by its user"})
            assert suspend.preempting(state, resized)
            assert not suspend.preempting(state, by_user)
            await tick.schedule_pass(state)
        finally:
            await server.shutdown()

    asyncio.run(run())
    (cluster,) = seen
    return {names[job.id]: job.preemptible for job in cluster.jobs if job.id in names}


def test_a_job_checkpointing_for_the_scheduler_is_preemptible_to_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert shown_to_policy(tmp_path, monkeypatch) == {
        "preempted by the scheduler": True,
        "by its user": False,
    }


def test_only_a_checkpoint_the_scheduler_asked_for_counts(tmp_path: Path) -> None:
    harness = DaemonHarness(tmp_path)

    async def run() -> None:
        server = Server(harness.config)
        await server.startup()
        try:
            state = server.state
            assert state is not None
            first, second = (gpu.uuid for gpu in state.gpus.devices)
            plain = running(state, first)
            assert not suspend.preempting(state, plain)  # running: can_preempt decides
            parked = suspending(state, running(state, second), "park", "slice")
            assert not suspend.preempting(state, parked)  # a turn: it keeps its GPUs
        finally:
            await server.shutdown()

    asyncio.run(run())
