"""Replay a workload on a live daemon and measure it as the simulator does.

Each job of the workload becomes a trace job (`gpuq.replay.tracejob`) with
the workload's GPU count and batch size, submitted when its arrival time
comes (divided by the speedup), named after the workload's job. The replay
then waits until every job it submitted has ended, and builds a
`gpuq.sim.metrics.SimResult` from the daemon's records, with every time
multiplied back by the speedup: submission and end times give the JCT,
run time x GPUs the GPU time, attempts after the first the restarts, and
the jobs' overlap the contention behind finish-time fairness. A job that
fails or is cancelled makes the replay fail with its reason: its numbers
would mean nothing.

Times here are wall-clock, read as the daemon reads them; only `replay`
sleeps, and it takes the clock and the sleep as arguments so tests can
drive it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuq.errors import GpuqError, UsageError
from gpuq.sim.apps import get_application
from gpuq.sim.metrics import JobRecord, SimResult, isolated_jct
from gpuq.sim.workload import WorkloadJob

POLL_SECONDS = 0.5
"""How often the replay asks the daemon which jobs have ended."""


class Caller(Protocol):
    """What the replay needs of a client: one request at a time (`gpuq.client.Client`)."""

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a request and return its result."""
        ...


@dataclass(frozen=True, slots=True)
class ReplaySettings:
    """How to replay: time compression, the simulator's restart penalty, the trace jobs' tick."""

    speedup: float = 60.0
    restart_penalty: float = 30.0
    tick: float = 0.1
    python: str = sys.executable
    cwd: str = ""

    def check(self) -> None:
        """Refuse settings that cannot be replayed, with a hint."""
        if not self.speedup > 0:
            raise UsageError(f"--speedup must be positive, got {self.speedup:g}")
        if self.restart_penalty < 0:
            raise UsageError(f"--restart-penalty must be >= 0, got {self.restart_penalty:g}")
        if not self.tick > 0:
            raise UsageError(f"--tick must be positive, got {self.tick:g}")


@dataclass(frozen=True, slots=True)
class ReplayProgress:
    """Where a replay is: jobs submitted and ended so far, of how many."""

    submitted: int
    ended: int
    total: int


def trace_command(job: WorkloadJob, settings: ReplaySettings) -> list[str]:
    """The command line of the trace job that plays `job`."""
    return [
        settings.python,
        "-m",
        "gpuq.replay.tracejob",
        "--app",
        job.application,
        "--batch-size",
        str(job.batch_size),
        "--replicas",
        str(job.num_replicas),
        "--speedup",
        f"{settings.speedup:g}",
        "--restart-penalty",
        f"{settings.restart_penalty:g}",
        "--tick",
        f"{settings.tick:g}",
    ]


def submit_spec(job: WorkloadJob, settings: ReplaySettings) -> dict[str, Any]:
    """The submission of `job`'s trace job (one thread of torch: jobs share the machine)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUQ_")}
    env["OMP_NUM_THREADS"] = "1"
    return {
        "command": trace_command(job, settings),
        "cwd": settings.cwd or os.getcwd(),
        "env": env,
        "gpus": job.num_replicas,
        "name": job.name,
    }


def replay(
    client: Caller,
    workload: Sequence[WorkloadJob],
    settings: ReplaySettings,
    progress: Callable[[ReplayProgress], None] | None = None,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> SimResult:
    """Submit `workload` at its arrival times, wait for every job, and measure (docstring)."""
    settings.check()
    for name in sorted({job.application for job in workload}):
        get_application(name)  # an unknown application fails before anything is submitted
    order = sorted(workload, key=lambda job: (job.time, job.name))
    start = clock()
    ids: list[int] = []
    ended: dict[int, dict[str, Any]] = {}
    next_poll = start
    while len(ended) < len(order):
        now = clock()
        while len(ids) < len(order) and start + order[len(ids)].time / settings.speedup <= now:
            spec = submit_spec(order[len(ids)], settings)
            ids.append(int(client.call("submit", spec=spec)["ids"][0]))
        if ids and now >= next_poll:
            ended.update(_ended(client, [i for i in ids if i not in ended]))
            next_poll = now + POLL_SECONDS
            if progress is not None:
                progress(ReplayProgress(len(ids), len(ended), len(order)))
        waits = [next_poll - now]
        if len(ids) < len(order):
            waits.append(start + order[len(ids)].time / settings.speedup - now)
        sleep(max(0.0, min(waits)))
    status = client.call("status")
    policy, gpus = str(status.get("policy", "")), int(status.get("gpus", 0))
    return measure(policy, gpus, order, [ended[i] for i in ids], start, settings)


def _ended(client: Caller, ids: list[int]) -> dict[int, dict[str, Any]]:
    """The jobs among `ids` that have ended; a failed or cancelled one is an error."""
    if not ids:
        return {}
    jobs: list[dict[str, Any]] = client.call("list", ids=ids)["jobs"]
    done = {}
    for job in jobs:
        if job["state"] == "succeeded":
            done[int(job["id"])] = job
        elif job["state"] in ("failed", "cancelled", "lost"):
            raise GpuqError(
                f"replayed job {job['id']} ({job['name']}) {job['state']}: {job['reason']}",
                hint=f"gpuq logs {job['id']} shows its output",
            )
    return done


def measure(
    policy: str,
    total_gpus: int,
    workload: Sequence[WorkloadJob],
    jobs: Sequence[dict[str, Any]],
    start: float,
    settings: ReplaySettings,
) -> SimResult:
    """The simulator's result for jobs that ran live (`jobs[i]` played `workload[i]`).

    The daemon is one server of `total_gpus` GPUs: a job's isolated run, the
    measure of its fairness, is placed on it.
    """
    speedup = settings.speedup
    spans = [
        ((job["submit_time"] - start) * speedup, (job["end_time"] - start) * speedup)
        for job in jobs
    ]
    records = []
    for index, (spec, job) in enumerate(zip(workload, jobs, strict=True)):
        submit, finish = spans[index]
        contention = _average_overlap(spans, index)
        records.append(
            JobRecord(
                name=spec.name,
                application=spec.application,
                submit=submit,
                start=((job["first_start_time"] or job["submit_time"]) - start) * speedup,
                finish=finish,
                gpu_time=float(job["run_time"]) * speedup * spec.num_replicas,
                restarts=max(0, int(job["attempts"]) - 1),
                isolated_jct=isolated_jct(
                    get_application(spec.application),
                    spec.num_replicas,
                    spec.batch_size,
                    total_gpus,
                    total_gpus,
                    contention,
                    settings.restart_penalty,
                ),
            )
        )
    restarts = sum(record.restarts for record in records)
    return SimResult(policy, tuple(records), total_gpus, restarts, ())


def _average_overlap(spans: Sequence[tuple[float, float]], index: int) -> float:
    """Jobs active on average (this one included) over job `index`'s lifetime."""
    begin, end = spans[index]
    if end <= begin:
        return 1.0
    covered = sum(max(0.0, min(end, e) - max(begin, b)) for b, e in spans)
    return covered / (end - begin)
