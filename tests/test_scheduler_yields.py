"""A scheduler pass never holds the event loop for long, however many jobs it starts.

Starts are made in slices of `START_BUDGET_SECONDS`, with a yield between
slices, so a client's request is served while 5,000 released jobs start;
every decision runs in a worker thread, and one that misses its deadline is
not waited for. Each start is made slow on purpose here (a sleep), and a
second task counts how often it gets the loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon import lifecycle
from gpuq.daemon.scheduler import tick
from gpuq.daemon.server import Server
from gpuq.daemon.store import NewJob
from gpuq.models import Job, JobSpec, JobState
from tests.daemon_harness import DaemonHarness

SLOW_START = 0.005
"""Seconds each start takes here: a few of them exceed the pass's budget."""


async def pass_with_ticker(
    harness: DaemonHarness, jobs: int, monkeypatch: pytest.MonkeyPatch, gpus: int = 0
) -> tuple[int, int, set[str]]:
    """Run one pass over `jobs` ready jobs of `gpus` GPUs: (starts made, ticks, decide threads)."""
    started: list[int] = []
    threads: set[str] = set()

    def slow_start(state: Any, job: Job, placement: Any) -> None:
        time.sleep(SLOW_START)
        started.append(job.id)

    server = Server(harness.config)
    await server.startup()
    try:
        state = server.state
        assert state is not None
        real_decide = state.policy.decide

        def decide(view: Any, now: float) -> Any:
            threads.add(threading.current_thread().name)
            return real_decide(view, now)

        monkeypatch.setattr(state.policy, "decide", decide)
        monkeypatch.setattr(lifecycle, "start", slow_start)
        spec = JobSpec(command=("true",), cwd=str(harness.root), env=dict(os.environ), gpus=gpus)
        new, _ = state.store.insert_jobs(
            [NewJob(spec, JobState.QUEUED, "submitted")] * jobs, time.time(), None
        )
        state.active.update({job.id: job for job in new})
        ticks = 0
        done = False

        async def ticker() -> None:
            nonlocal ticks
            while not done:
                await asyncio.sleep(0)
                ticks += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        ticks = 0
        await tick.schedule_pass(state)
        done = True
        await task
        return len(started), ticks, threads
    finally:
        await server.shutdown()


def test_starting_many_jobs_yields_the_loop_between_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = DaemonHarness(tmp_path)
    jobs = 60
    started, ticks, _ = asyncio.run(pass_with_ticker(harness, jobs, monkeypatch))
    assert started == jobs
    per_slice = int(tick.START_BUDGET_SECONDS / SLOW_START) + 1
    assert ticks >= jobs // per_slice - 1, "the loop ran other work between slices"


def test_the_decision_runs_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = DaemonHarness(tmp_path)
    monkeypatch.setattr(tick, "START_BUDGET_SECONDS", 10.0)
    # GPU jobs: CPU-only ones never reach the policy.
    _, _, threads = asyncio.run(pass_with_ticker(harness, 11, monkeypatch, gpus=1))
    assert threads and threading.main_thread().name not in threads


def test_a_decision_past_its_deadline_is_not_waited_for_and_not_acted_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = DaemonHarness(tmp_path)
    monkeypatch.setattr(tick, "DECIDE_DEADLINE", 0.05)
    release = threading.Event()

    async def scenario() -> None:
        server = Server(harness.config)
        await server.startup()
        try:
            state = server.state
            assert state is not None
            real_decide = state.policy.decide

            def slow_decide(view: Any, now: float) -> Any:
                release.wait(30)
                return real_decide(view, now)

            monkeypatch.setattr(state.policy, "decide", slow_decide)
            spec = JobSpec(command=("true",), cwd=str(harness.root), env=dict(os.environ), gpus=1)
            [job], _ = state.store.insert_jobs(
                [NewJob(spec, JobState.QUEUED, "submitted")], time.time(), None
            )
            state.active[job.id] = job
            monkeypatch.setattr(lifecycle, "start", lambda *args: pytest.fail("acted on"))

            assert await tick.schedule_pass(state) == []
            assert "did not decide within 0.05s" in state.waiting_reasons[job.id]
            assert await tick.schedule_pass(state) == []
            assert "still deciding" in state.waiting_reasons[job.id]

            monkeypatch.undo()
            started: list[int] = []
            monkeypatch.setattr(lifecycle, "start", lambda s, j, p: started.append(j.id))
            release.set()
            in_flight = state.decision_in_flight
            assert in_flight is not None
            await in_flight
            await tick.schedule_pass(state)
            assert started == [job.id]  # once the late one is back, passes decide again
        finally:
            release.set()
            await server.shutdown()

    asyncio.run(scenario())


def test_an_idle_scheduler_does_not_decide_again_and_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job that waits (it needs more GPUs than exist) must not make the
    # scheduler loop: a pass runs when something changed, or every 5 s.
    harness = DaemonHarness(tmp_path)

    async def scenario() -> int:
        server = Server(harness.config)
        await server.startup()
        try:
            state = server.state
            assert state is not None
            real_decide = state.policy.decide
            calls = 0

            def counting_decide(view: Any, now: float) -> Any:
                nonlocal calls
                calls += 1
                return real_decide(view, now)

            monkeypatch.setattr(state.policy, "decide", counting_decide)
            spec = JobSpec(command=("true",), cwd=str(harness.root), env=dict(os.environ), gpus=2)
            [job], _ = state.store.insert_jobs(
                [NewJob(spec, JobState.QUEUED, "submitted")], time.time(), None
            )
            state.active[job.id] = job
            state.gpus = replace(state.gpus, devices=state.gpus.devices[:1])
            loop = asyncio.create_task(server._schedule_forever(state))
            await asyncio.sleep(1.0)
            loop.cancel()
            return calls
        finally:
            await server.shutdown()

    assert 1 <= asyncio.run(scenario()) <= 2
