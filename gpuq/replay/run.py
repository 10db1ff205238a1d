"""Replay a workload on a live daemon and measure it as the simulator does.

Each job of the workload becomes a trace job (`gpuq.replay.tracejob`) with
the workload's batch size, submitted when its arrival time comes (divided
by the speedup), named after the workload's job, and asking for GPUs as the
simulator's job would (`submission`): where the daemon's policy runs
adaptive jobs (`Capabilities.adaptive_jobs`) and the application adapts
(`gpuq.sim.jobs.agent_terms`), an adaptive job (`--gpus 1-MAX`, MAX the
simulator's `gpu_limit` on the daemon's GPUs) whose trace job runs as
Pollux's agent does; otherwise the workload's GPU count (capped at the
daemon's GPUs). The replay then waits until every job it submitted has
ended, and builds a `gpuq.sim.metrics.SimResult` from the daemon's records,
with every time multiplied back by the speedup: submission and end times
give the JCT, each attempt's run time x its GPUs the GPU time, attempts
after the first the restarts, and the jobs' overlap the contention behind
finish-time fairness. A job that fails or is cancelled makes the replay
fail with its reason: its numbers would mean nothing.

Ctrl-C raises `ReplayInterrupted`, which names the jobs submitted so far:
they keep running.

Times here are wall-clock, read as the daemon reads them; only `replay`
sleeps, and it takes the clock and the sleep as arguments so tests can
drive it.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuq.errors import GpuqError, UsageError
from gpuq.sim.apps import get_application
from gpuq.sim.jobs import agent_terms, gpu_limit
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
    fork_server: str = ""
    """The socket of a `gpuq.replay.forkserver` to start trace jobs through ("": none)."""

    def check(self) -> None:
        """Refuse settings that cannot be replayed, with a hint."""
        if not (self.speedup > 0 and math.isfinite(self.speedup)):
            raise UsageError(
                f"--speedup must be a positive number, got {self.speedup:g}",
                hint="60 (the default) replays a simulated minute in a second",
            )
        if not (self.restart_penalty >= 0 and math.isfinite(self.restart_penalty)):
            raise UsageError(
                f"--restart-penalty must be a number of seconds, 0 or more, "
                f"got {self.restart_penalty:g}",
                hint="30 simulated seconds by default, as in gpuq sim",
            )
        if not (self.tick > 0 and math.isfinite(self.tick)):
            raise UsageError(f"--tick must be a positive number, got {self.tick:g}")


@dataclass(frozen=True, slots=True)
class ReplayProgress:
    """Where a replay is: jobs submitted and ended so far, of how many."""

    submitted: int
    ended: int
    total: int


class ReplayInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a replay: the ids of the jobs it had submitted, which keep running."""

    def __init__(self, ids: Sequence[int]) -> None:
        super().__init__()
        self.ids = tuple(ids)


@dataclass(frozen=True, slots=True)
class Submission:
    """How a workload job is submitted: GPUs asked for, and whether it adapts (module docstring)."""

    gpus: int
    gpus_max: int | None
    policy_adaptive: bool


def submission(job: WorkloadJob, policy_adaptive: bool, total_gpus: int) -> Submission:
    """The simulator's terms for `job` under a policy on `total_gpus` GPUs, as a submission."""
    app = get_application(job.application)
    adaptive, batch = agent_terms(app, job.batch_size, policy_adaptive)
    requested = min(job.num_replicas, total_gpus)
    if adaptive:
        return Submission(1, gpu_limit(app, True, batch, requested, total_gpus), True)
    return Submission(requested, None, policy_adaptive)


def trace_command(
    job: WorkloadJob, settings: ReplaySettings, policy_adaptive: bool = False
) -> list[str]:
    """The command line of the trace job that plays `job` (adaptive where the policy is).

    Through the fork server's launcher when the settings name one.
    """
    arguments = [
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
        *(["--adaptive"] if policy_adaptive else []),
    ]
    if settings.fork_server:
        from gpuq.replay.forkserver import launcher_command

        return launcher_command(settings.python, settings.fork_server, arguments)
    return [settings.python, "-m", "gpuq.replay.tracejob", *arguments]


def submit_spec(
    job: WorkloadJob, settings: ReplaySettings, terms: Submission | None = None
) -> dict[str, Any]:
    """The submission of `job`'s trace job (one thread of torch: jobs share the machine).

    Without `terms`, a rigid job with the workload's GPU count.
    """
    terms = terms or Submission(job.num_replicas, None, False)
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUQ_")}
    env["OMP_NUM_THREADS"] = "1"
    spec: dict[str, Any] = {
        "command": trace_command(job, settings, terms.policy_adaptive),
        "cwd": settings.cwd or os.getcwd(),
        "env": env,
        "gpus": terms.gpus,
        "name": job.name,
    }
    if terms.gpus_max is not None:
        spec["gpus_max"] = terms.gpus_max
    return spec


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
    status = client.call("status")
    policy, gpus = str(status.get("policy", "")), int(status.get("gpus", 0))
    adaptive = policy_runs_adaptive(policy)
    terms = [submission(job, adaptive, max(gpus, 1)) for job in order]
    start = clock()
    ids: list[int] = []
    ended: dict[int, dict[str, Any]] = {}
    next_poll = start
    try:
        while len(ended) < len(order):
            now = clock()
            while len(ids) < len(order) and start + order[len(ids)].time / settings.speedup <= now:
                spec = submit_spec(order[len(ids)], settings, terms[len(ids)])
                ids.append(int(client.call("submit", spec=spec)["ids"][0]))
                if progress is not None:
                    progress(ReplayProgress(len(ids), len(ended), len(order)))
            if ids and now >= next_poll:
                ended.update(_ended(client, [i for i in ids if i not in ended]))
                next_poll = now + POLL_SECONDS
                if progress is not None:
                    progress(ReplayProgress(len(ids), len(ended), len(order)))
            waits = [next_poll - now]
            if len(ids) < len(order):
                waits.append(start + order[len(ids)].time / settings.speedup - now)
            sleep(max(0.0, min(waits)))
        jobs = [ended[i] | {"gpu_seconds": _gpu_seconds(client, i)} for i in ids]
    except KeyboardInterrupt:
        raise ReplayInterrupted(ids) from None
    return measure(policy, gpus, order, jobs, start, settings)


def policy_runs_adaptive(name: str) -> bool:
    """True if the daemon's policy `name` runs adaptive jobs (False for one unknown here)."""
    from gpuq.policies.registry import get_policy

    try:
        return get_policy(name).capabilities.adaptive_jobs
    except UsageError:
        return False


def _gpu_seconds(client: Caller, job_id: int) -> float:
    """GPU-seconds a job held over its attempts: each attempt's run time x its GPUs."""
    shown = client.call("show", id=job_id)
    starts = [e for e in shown.get("events", ()) if e.get("state") == "starting"]
    total = 0.0
    for event, attempt in zip(starts, shown.get("attempts", ()), strict=False):
        gpus = started_on(str(event.get("reason", "")))
        total += float(attempt.get("run_time") or 0.0) * gpus
    return total


def started_on(reason: str) -> int:
    """The GPUs a start's reason names: "starting on GPU-a, GPU-b: why (note); ..." -> 2.

    The daemon's start reason lists the GPUs (or "CPU"), then what the policy
    said, after ": ", which may hold commas of its own; a replay's jobs run on
    this server, so no server's name comes first.
    """
    listed = reason.removeprefix("starting on ")
    if listed == reason:
        return 0
    for end in (": ", " (", "; "):
        listed = listed.partition(end)[0]
    return 0 if listed in ("", "CPU") else len(listed.split(", "))


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
                gpu_time=_gpu_time(job, spec) * speedup,
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


def _gpu_time(job: dict[str, Any], spec: WorkloadJob) -> float:
    """GPU-seconds from the attempts (`gpu_seconds`), else run time x the workload's GPUs."""
    measured = job.get("gpu_seconds")
    if measured is not None:
        return float(measured)
    return float(job["run_time"]) * spec.num_replicas


def _average_overlap(spans: Sequence[tuple[float, float]], index: int) -> float:
    """Jobs active on average (this one included) over job `index`'s lifetime."""
    begin, end = spans[index]
    if end <= begin:
        return 1.0
    covered = sum(max(0.0, min(end, e) - max(begin, b)) for b, e in spans)
    return covered / (end - begin)
