"""A policy's memory survives a daemon restart (gpuq/daemon/scheduler/memory.py).

Pollux (and gpuq's policy, built on it) remember their last population and
random generator: saved, sent through JSON and restored into a fresh policy,
they decide from then on exactly as the policy that never stopped. The
daemon keeps that memory in its store after each decision and gives it back
at start; memory it cannot read is dropped, never fatal.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon import lifecycle
from gpuq.daemon.scheduler import tick
from gpuq.daemon.server import Server
from gpuq.daemon.store import NewJob
from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.models import JobSpec, JobState
from gpuq.policies import registry
from gpuq.policies.interface import ClusterState, JobView, NodeView, Remembers
from tests.daemon_harness import DaemonHarness

PERF = PerfParams(0.1, 0.01, 0.5, 0.05, 0.05, 0.01, 1.0)
MODEL = GoodputFunction(PERF, GradParams(sqr=1.0, var=10.0), init_batch_size=64)


def states(count: int) -> list[ClusterState]:
    """A sequence of instants: jobs arrive, run on what the previous decision gave."""
    nodes = (NodeView("n0", 4), NodeView("n1", 4))
    result = []
    for step in range(count):
        jobs = tuple(
            JobView(
                id=i,
                submit_time=10.0 * i,
                gpus_requested=1,
                batch_size=64,
                init_batch_size=64,
                max_batch_size=1024,
                adaptive=True,
                max_gpus=8,
                goodput=MODEL,
                allocation=(1, 0) if i % 2 and i < step else (),
            )
            for i in range(1, 2 + step)
        )
        result.append(ClusterState(nodes=nodes, jobs=jobs))
    return result


@pytest.mark.parametrize("spec", ["pollux:population=12:generations=6", "gpuq", "gandiva"])
def test_a_restored_policy_decides_as_the_one_that_never_stopped(spec: str) -> None:
    steady = registry.get_policy(spec, seed=3)
    restarted = registry.get_policy(spec, seed=3)
    assert isinstance(steady, Remembers) and isinstance(restarted, Remembers)
    timeline = states(6)
    for now, state in enumerate(timeline[:3]):
        assert steady.decide(state, 60.0 * now) == restarted.decide(state, 60.0 * now)
    saved = json.loads(json.dumps(restarted.save()))
    restarted = registry.get_policy(spec, seed=99)  # a new process: nothing in memory
    assert isinstance(restarted, Remembers)
    restarted.restore(saved)
    for now, state in enumerate(timeline[3:], start=3):
        assert steady.decide(state, 60.0 * now) == restarted.decide(state, 60.0 * now)


@pytest.mark.parametrize(
    "saved",
    [{}, {"version": 2}, {"version": 1, "rng": "x"}, {"version": 1, "rng": None, "previous": {}}],
)
@pytest.mark.parametrize("name", ["pollux", "gandiva"])
def test_memory_that_is_not_a_saved_policy_is_refused(name: str, saved: dict[str, Any]) -> None:
    policy = registry.get_policy(name)
    assert isinstance(policy, Remembers)
    with pytest.raises(ValueError, match=name):
        policy.restore(saved)


def test_every_policy_that_remembers_says_so_and_live_ones_can_be_saved() -> None:
    for name in registry.POLICY_NAMES:
        policy = registry.get_policy(name)
        if isinstance(policy, Remembers):
            assert policy.capabilities.remembers, name
        if name in registry.LIVE_POLICY_NAMES and policy.capabilities.remembers:
            assert isinstance(policy, Remembers), f"{name} runs live but cannot be saved"


SPEC = "pollux:population=8:generations=4"


async def one_pass(harness: DaemonHarness, jobs: int) -> tuple[str | None, dict[str, Any]]:
    """Start a daemon in-process, schedule `jobs` one-GPU jobs once; its kept memory."""
    server = Server(harness.config)
    await server.startup()
    try:
        state = server.state
        assert state is not None
        spec = JobSpec(command=("true",), cwd=str(harness.root), env=dict(os.environ), gpus=1)
        new, _ = state.store.insert_jobs(
            [NewJob(spec, JobState.QUEUED, "submitted")] * jobs, time.time(), None
        )
        state.active.update({job.id: job for job in new})
        await tick.schedule_pass(state)
        policy = state.policy
        assert isinstance(policy, Remembers)
        return state.store.policy_state(SPEC), policy.save()
    finally:
        await server.shutdown()


async def restored(harness: DaemonHarness) -> tuple[str | None, dict[str, Any]]:
    """Start a daemon in-process; what its policy took up."""
    server = Server(harness.config)
    await server.startup()
    try:
        state = server.state
        assert state is not None and isinstance(state.policy, Remembers)
        return state.policy_saved, state.policy.save()
    finally:
        await server.shutdown()


@pytest.fixture
def pollux_live(monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs are not started: what is tested here is the policy's memory, not its scheduling."""
    monkeypatch.setattr(lifecycle, "start", lambda *args: None)


def test_the_daemon_keeps_the_policys_memory_and_gives_it_back_after_a_restart(
    tmp_path: Path, pollux_live: None
) -> None:
    harness = DaemonHarness(tmp_path, extra_toml=f'[scheduler]\npolicy = "{SPEC}"\n')
    kept, memory = asyncio.run(one_pass(harness, jobs=3))
    assert kept is not None and json.loads(kept) == memory
    assert memory["previous"]["job_ids"]  # it searched over the jobs
    taken_up, memory_after = asyncio.run(restored(harness))
    assert taken_up == kept
    assert memory_after == memory


def test_memory_it_cannot_read_is_dropped_and_the_daemon_starts(
    tmp_path: Path, pollux_live: None, caplog: pytest.LogCaptureFixture
) -> None:
    harness = DaemonHarness(tmp_path, extra_toml=f'[scheduler]\npolicy = "{SPEC}"\n')
    asyncio.run(one_pass(harness, jobs=1))
    server = Server(harness.config)

    async def damage() -> None:
        await server.startup()
        assert server.state is not None
        server.state.store.save_policy_state(SPEC, '{"version": 7}', time.time())
        await server.shutdown()

    asyncio.run(damage())
    taken_up, memory = asyncio.run(restored(harness))
    assert taken_up is None
    assert "previous" not in memory
    assert "its saved memory is dropped" in caplog.text
