"""A scheduler pass never holds the event loop for long, however many jobs it starts.

Starts are made in slices of `START_BUDGET_SECONDS`, with a yield between
slices, so a client's request is served while 5,000 released jobs start;
a large decision runs in a worker thread. Each start is made slow on
purpose here (a sleep), and a second task counts how often it gets the loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
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


def test_a_large_decision_runs_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = DaemonHarness(tmp_path)
    monkeypatch.setattr(tick, "THREAD_DECIDE_JOBS", 10)
    monkeypatch.setattr(tick, "START_BUDGET_SECONDS", 10.0)
    # GPU jobs: CPU-only ones never reach the policy.
    _, _, threads = asyncio.run(pass_with_ticker(harness, 11, monkeypatch, gpus=1))
    assert threads and threading.main_thread().name not in threads
