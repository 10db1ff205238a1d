"""`gandiva` run live: jobs take turns on the GPUs it over-subscribes.

Four fake GPUs and six single-GPU jobs: Gandiva places all six at once,
over-subscribing the server, and the daemon's slicer shares the GPUs in
quanta of one second. A gpuq.runner job waits its turn parked on its GPU (or
checkpointed, to take another GPU), a plain job with known memory stopped;
each says whose turn it is. No GPU ever has two jobs computing on it at once;
runner jobs end bit for bit as runs never interrupted, six real PyTorch ones
on four GPUs all progressing in the same stretch of time. Six trace jobs
over a window of 30 quanta (6 s each) share the GPUs near 4/6 each and lose
under 3% of their throughput to switching, measured from the daemon's
records as bench/bench_timeslice.py measures it over a long window.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.bench_timeslice import (
    DEFAULT_QUANTUM,
    GPUS,
    JOBS,
    LOSS_TARGET,
    SHARE,
    fake_gpus,
    gandiva_config,
    have_reported,
    job_records,
    reported_after,
    window_shares,
)
from gpuq.daemon.scheduler.slicer import REBALANCE_QUANTA
from gpuq.replay.run import ReplaySettings, submit_spec, trace_command
from gpuq.sim.workload import WorkloadJob
from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.test_control_runner import JOB, job_env, same_state

FOUR_GPUS = '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 4\n'
TWO_GPUS = FOUR_GPUS.replace("count = 4", "count = 2")
GANDIVA = '[scheduler]\npolicy = "gandiva:quantum=1"\ninterval = 0.5\n'

STARTED = re.compile(r"starting on ([^\s:,]+)")


def events(daemon: DaemonHarness, job_id: int) -> list[dict[str, Any]]:
    """The job's event log, oldest first."""
    return list(daemon.call("show", id=job_id)["events"])


def computing_spans(log: list[dict[str, Any]]) -> Iterator[tuple[str, float, float]]:
    """(GPU, from, to) for every stretch the job was running, from its event log."""
    gpu = ""
    since: float | None = None
    for event in log:
        started = STARTED.search(event["reason"])
        if started:
            gpu = started.group(1)
        if event["state"] == "running" and since is None:
            since = float(event["time"])
        elif event["state"] != "running" and since is not None:
            yield gpu, since, float(event["time"])
            since = None


def assert_one_job_computes_per_gpu(daemon: DaemonHarness, ids: list[int]) -> None:
    spans = sorted(
        (gpu, start, end, job_id)
        for job_id in ids
        for gpu, start, end in computing_spans(events(daemon, job_id))
    )
    for (gpu, _, end, job_a), (other, start, _, job_b) in zip(spans, spans[1:], strict=False):
        if gpu == other:
            assert start >= end, f"jobs {job_a} and {job_b} computed on {gpu} at once"


def wait_all(daemon: DaemonHarness, ids: list[int], timeout: float) -> list[dict[str, Any]]:
    ended = ("succeeded", "failed", "cancelled", "lost")
    wait_for(
        lambda: all(daemon.job(i)["state"] in ended for i in ids),
        timeout=timeout,
        interval=0.2,
        what="every job to end",
    )
    return [daemon.job(i) for i in ids]


pytestmark = [pytest.mark.torch]


def test_six_trace_jobs_take_turns_on_four_gpus(tmp_path: Path) -> None:
    settings = ReplaySettings(speedup=150)  # 27 s of computing each: longer than Python starts
    command = trace_command(WorkloadJob("t", 0.0, "cifar10", 1, 128), settings)
    with running_daemon(tmp_path, gpus_toml=FOUR_GPUS, extra_toml=GANDIVA) as daemon:
        ids = [daemon.submit(command, gpus=1, env=job_env()) for _ in range(6)]
        jobs = wait_all(daemon, ids, timeout=240)
        assert [job["state"] for job in jobs] == ["succeeded"] * 6
        logs = {job_id: [e["reason"] for e in events(daemon, job_id)] for job_id in ids}
        turns = [r for reasons in logs.values() for r in reasons if "quantum ended" in r]
        assert any(re.search(r"quantum ended, job \d+'s turn", r) for r in turns)
        assert any("park" in r for r in turns), turns
        for job_id in ids:  # everyone waited at least once, and computed again after
            assert any("time-sliced" in r or "quantum ended" in r for r in logs[job_id])
        assert_one_job_computes_per_gpu(daemon, ids)


SHARE_SPEEDUP = 10.0
"""Trace jobs' time compression in the share test: gandiva's 60 s quantum is 6 s real."""
SHARE_WINDOW_QUANTA = 30


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_six_trace_jobs_share_four_gpus_in_turns_and_lose_little_to_switching(
    tmp_path: Path,
) -> None:
    """Over a window of 30 quanta, measured as `bench.bench_timeslice` does.

    The switching loss (all six jobs' progress against four GPUs computing
    at solo speed) stays under the issue's 3%; moves cost a sixth of a
    quantum here (a 10 s restart penalty), so it measures the switching
    itself. Each job's GPU share is near 4/6: a job may fall up to
    `REBALANCE_QUANTA` quanta behind before it moves, and turns last a
    quantum or more, so over 30 quanta a share lies within (4 + 3) quanta
    / 30 of 4/6; without moves pins would hold two jobs at a whole GPU and
    four at half of one. The issue's 5% needs a long window
    (bench/bench_timeslice.py, 200 quanta).
    """
    quantum = DEFAULT_QUANTUM / SHARE_SPEEDUP
    settings = ReplaySettings(speedup=SHARE_SPEEDUP, restart_penalty=10.0, cwd=str(tmp_path))
    penalty = settings.restart_penalty / SHARE_SPEEDUP
    spec = submit_spec(WorkloadJob("slice", 0.0, "imagenet", 1, 200), settings)
    config = gandiva_config(quantum)
    with running_daemon(tmp_path, gpus_toml=fake_gpus(GPUS), extra_toml=config) as daemon:
        ids = [int(daemon.call("submit", spec=spec)["ids"][0]) for _ in range(JOBS)]
        wait_for(lambda: have_reported(daemon, ids), 240, 0.5, "all six jobs to report")
        start = time.time() + 3 * quantum
        end = start + SHARE_WINDOW_QUANTA * quantum
        wait_for(lambda: time.time() >= end, end - time.time() + 10, 1.0, "the window's end")
        reported_after(daemon, ids, end)
        logs, samples = job_records(daemon, ids)
    window = window_shares(logs, samples, start, end, 1 / settings.tick, penalty)
    assert window.loss < LOSS_TARGET, window
    tolerance = (REBALANCE_QUANTA + 3) / SHARE_WINDOW_QUANTA
    for job in window.jobs:
        assert abs(job.gpu_share - SHARE) <= tolerance, window
    reasons = [event["reason"] for log in logs.values() for event in log]
    assert any(re.search(r"quantum ended, job \d+'s turn; it moves: owed", r) for r in reasons)


def test_runner_jobs_waiting_their_turn_end_bit_for_bit(tmp_path: Path) -> None:
    args = ["--epochs", "3", "--step-delay", "0.02"]
    alone = tmp_path / "alone.pt"
    subprocess.run(
        [sys.executable, str(JOB), *args, "--out", str(alone)], check=True, env=job_env()
    )
    with running_daemon(tmp_path, gpus_toml=TWO_GPUS, extra_toml=GANDIVA) as daemon:
        outs = [tmp_path / f"job{i}.pt" for i in range(3)]
        ids = [
            daemon.submit(
                [sys.executable, str(JOB), *args, "--out", str(out)], gpus=1, env=job_env()
            )
            for out in outs
        ]
        jobs = wait_all(daemon, ids, timeout=240)
        assert [job["state"] for job in jobs] == ["succeeded"] * 3
        reasons = [e["reason"] for i in ids for e in events(daemon, i)]
        assert any("quantum ended" in r for r in reasons)
        for out in outs:
            same_state(alone, out)
        assert_one_job_computes_per_gpu(daemon, ids)


STEP_AT = re.compile(r"at step (\d+)")


def reported_steps(daemon: DaemonHarness, job_id: int) -> list[tuple[float, int]]:
    """(time, step) the job reported: its metrics samples, and the steps its suspends name."""
    samples = daemon.call("metrics", id=job_id)["samples"]
    points = [(float(s["time"]), int(s["step"])) for s in samples]
    for event in events(daemon, job_id):
        if found := STEP_AT.search(event["reason"]):
            points.append((float(event["time"]), int(found.group(1))))
    return sorted(points)


def first_computed(steps: list[tuple[float, int]]) -> float | None:
    """When the job was first seen to have taken a step, if it was."""
    return next((t for t, step in steps if step > 0), None)


def progressed_after(steps: list[tuple[float, int]], opened: float) -> bool:
    """True if the job was seen to take a step after `opened`."""
    before = max((s for t, s in steps if t <= opened), default=0)
    return any(s > before for t, s in steps if t > opened)


SIX_EPOCHS, SIX_STEPS = 16, 16 * 32
"""The six runner jobs' length: 16 epochs of 512 samples in batches of 16."""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_six_runner_jobs_on_four_gpus_all_progress_together_and_end_bit_for_bit(
    tmp_path: Path,
) -> None:
    """Six real PyTorch runner jobs share four GPUs in turns, not one after another.

    Between the moment the last of them has computed and the moment the first
    ends, all six are active, and each one computes in that window (its step
    count rises); each then ends with the parameters and optimizer state of
    a run never interrupted, bit for bit.

    On a busy machine a job takes longer to start (Python, torch) than these
    take to train, so the first ones could end before the last has started.
    Gates hold the jobs back without stopping their turns (`--gate`: after
    each step a job waits, or takes one more step when asked to suspend):
    none goes past its first step until all six have computed, nor past half
    of its steps until each has computed again after that. Were the jobs run
    one after another, or one never given a turn, the gates would never open.
    """
    args = ["--epochs", str(SIX_EPOCHS), "--step-delay", "0.05"]
    alone = tmp_path / "alone.pt"
    subprocess.run(
        [sys.executable, str(JOB), *args, "--out", str(alone)], check=True, env=job_env()
    )
    all_computed, all_again = tmp_path / "all-computed", tmp_path / "all-computed-again"
    gates = ["--gate", f"1={all_computed}", "--gate", f"{SIX_STEPS // 2}={all_again}"]
    with running_daemon(tmp_path, gpus_toml=FOUR_GPUS, extra_toml=GANDIVA) as daemon:
        outs = [tmp_path / f"job{i}.pt" for i in range(6)]
        ids = [
            daemon.submit(
                [sys.executable, str(JOB), *args, *gates, "--out", str(out)],
                gpus=1,
                env=job_env(),
            )
            for out in outs
        ]

        def when_all_computed() -> float | None:
            first = [first_computed(reported_steps(daemon, i)) for i in ids]
            return None if None in first else max(t for t in first if t is not None)

        opened = wait_for(when_all_computed, 180, 0.5, "all six jobs to have computed")
        all_computed.touch()
        wait_for(
            lambda: all(progressed_after(reported_steps(daemon, i), opened) for i in ids),
            120,
            0.5,
            "every job to compute again once all six had",
        )
        all_again.touch()
        jobs = wait_all(daemon, ids, timeout=240)
        assert [job["state"] for job in jobs] == ["succeeded"] * 6
        steps = {i: reported_steps(daemon, i) for i in ids}
        closed = min(float(job["end_time"]) for job in jobs)
        assert opened < closed, "a job ended before the last one had computed"
        for job_id in ids:
            window = [(t, s) for t, s in steps[job_id] if t < closed]
            assert progressed_after(window, opened), f"job {job_id} made no progress in the window"
        reasons = [e["reason"] for i in ids for e in events(daemon, i)]
        assert any("quantum ended" in r for r in reasons)
        for out in outs:
            same_state(alone, out)
        assert_one_job_computes_per_gpu(daemon, ids)


def test_plain_jobs_are_stopped_for_a_turn_only_when_their_memory_is_known(
    tmp_path: Path,
) -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    with running_daemon(tmp_path, gpus_toml=TWO_GPUS, extra_toml=GANDIVA) as daemon:
        known = [daemon.submit(sleep, gpus=1, gpu_mem=1 << 30) for _ in range(3)]

        def turns_taken() -> bool:
            log = [e["reason"] for i in known for e in events(daemon, i)]
            stopped = [r for r in log if "quantum ended" in r and "suspended (stop mode)" in r]
            return bool(stopped) and any("its turn" in r for r in log if "resumed" in r)

        wait_for(turns_taken, timeout=60, what="a plain job stopped, then resumed, in turns")
        daemon.call("cancel", ids=known)
        for job_id in known:
            daemon.wait_state(job_id, "cancelled", timeout=30)

        unknown = [daemon.submit(sleep, gpus=1) for _ in range(3)]
        waiting = wait_for(
            lambda: next(
                (
                    job
                    for i in unknown
                    if (job := daemon.job(i))["state"] == "queued"
                    and "cannot take turns" in str(job.get("reason"))
                ),
                None,
            ),
            timeout=30,
            what="the third plain job to say why it gets no turn",
        )
        assert "GPU memory unknown" in waiting["reason"]

        def both_others_running() -> list[int]:  # one may still be starting on a busy machine
            running = [i for i in unknown if daemon.job(i)["state"] == "running"]
            return running if len(running) == 2 else []

        running = wait_for(both_others_running, timeout=30, what="the two other plain jobs to run")
        assert all("suspending" not in [e["state"] for e in events(daemon, i)] for i in running)


PARKED_AT = re.compile(r"suspended \(park mode\) at step (\d+)")


def steps_around_restart(log: list[str]) -> tuple[str, int, int | None]:
    """Where a re-adopted job was: the reason before its re-adoption, and parks around it.

    The step of its last park before the restart, and of its first park after
    (None: it parked no more).
    """
    index = next(i for i, r in enumerate(log) if r.startswith("re-adopted"))
    before = [int(m.group(1)) for r in log[:index] if (m := PARKED_AT.search(r))]
    after = [int(m.group(1)) for r in log[index:] if (m := PARKED_AT.search(r))]
    return log[index - 1], before[-1] if before else 0, after[0] if after else None


TURN_TAKERS = ["--epochs", "3", "--step-delay", "0.05"]
"""Runner jobs of about 5 s of training, all of it after their State exists.

Three of them on two GPUs must take turns, whatever the machine's load: each
can park at every step, so the first quantum that ends while one trains parks
it, and a parked job ends only once given its turn back. (A trace job
imports torch while it already runs, so on a busy machine a short one ends
before it can park, and no turn is ever taken.)
"""


@pytest.mark.parametrize("point", ["turn-committed", "resume-committed"])
def test_a_daemon_killed_in_the_middle_of_a_turn_finishes_it(tmp_path: Path, point: str) -> None:
    """Killed between a turn's intent and the job hearing of it, the daemon finishes the turn.

    After the restart the park is carried out, or the job whose resume was cut
    off computes at once; every job ends once, and no GPU ever has two jobs
    computing at once.
    """
    command = [sys.executable, str(JOB), *TURN_TAKERS]
    harness = DaemonHarness(tmp_path, gpus_toml=TWO_GPUS, extra_toml=GANDIVA)
    try:
        first = harness.start(extra_env={"GPUQ_CRASH_POINT": point})
        ids = [harness.submit(command, gpus=1, env=job_env()) for _ in range(3)]
        assert first.wait(timeout=120) == -9
        harness.start()
        jobs = wait_all(harness, ids, timeout=180)
        assert [job["state"] for job in jobs] == ["succeeded"] * 3
        assert [job["attempts"] for job in jobs] == [
            1 + sum("checkpoint saved" in e["reason"] for e in events(harness, i)) for i in ids
        ]
        history = [e["reason"] for i in ids for e in events(harness, i)]
        assert any("re-adopted after daemon restart" in r for r in history)
        assert_one_job_computes_per_gpu(harness, ids)
        if point == "resume-committed":  # the job whose resume was cut off computed at once
            around = [
                steps_around_restart([e["reason"] for e in events(harness, i)])
                for i in ids
                if any(e["reason"].startswith("re-adopted") for e in events(harness, i))
            ]
            cut = [(was, then) for before, was, then in around if before.startswith("resumed")]
            assert len(cut) == 1
            was, then = cut[0]
            assert then is None or then > was, "it stayed parked after the restart"
    finally:
        harness.close()
