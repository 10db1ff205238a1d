"""Simulation results: per-job records and the summary metrics.

Definitions (where the papers leave a choice, the one made here):

- JCT: finish minus submission; average, median and p99 (numpy's linear
  interpolation between order statistics).
- Makespan: last finish minus first submission.
- GPU utilization: GPU-seconds held by jobs (a time-sliced job counts its
  share; restart delays count, since the GPUs are held) over the cluster's
  GPUs times the makespan.
- Finish-time fairness (Themis, as Pollux uses it): rho = JCT / isolated JCT,
  where the isolated JCT is the job's run time alone at its own request
  (the workload's GPU count, packed, and batch size) on an equal share
  `G / N` of the cluster's `G` GPUs, with `N` the average number of active
  jobs (its own included) over its lifetime. When the share is smaller than
  the request the job is time-sliced, so the run time grows by
  `request / share`; one restart penalty (the start) is added. rho < 1 is
  better than fair. The average and maximum are reported.
- Reallocations: allocation changes after a job's first start (the number
  of restarts the jobs paid, resumptions included).
- Decision time: wall seconds per `decide` call (mean and max).
- Comparing two policies over seeds (`paired_ratio`): runs of the same
  workload with the same seed are paired; the ratio is the geometric mean of
  the per-seed ratios, with a 95% Student t-interval on the mean log-ratio.
  A metric like p99 JCT, set by the two or three longest jobs, moves by a
  percent or more between seeds of one policy, so a difference is only
  called real when the whole interval lies on one side of 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpuq.sim.apps import Application
from gpuq.sim.fair import UserTick
from gpuq.sim.workload import packed_placement


def solo_run_time(
    app: Application, num_replicas: int, batch_size: int, gpus_per_node: int
) -> float:
    """Seconds to train to completion alone at a fixed configuration, without restarts."""
    placement = packed_placement(num_replicas, gpus_per_node)
    config = app.fixed_batch_config(num_replicas, batch_size)
    step, sync = app.step_time(placement, config.atomic_bsz)
    step_time = step + config.accum_steps * (step - sync)
    batch = config.total(num_replicas)
    bounds = app.epoch_progress
    seconds = 0.0
    for epoch in range(app.max_epochs):
        seconds += (bounds[epoch + 1] - bounds[epoch]) * step_time / app.gain(epoch, batch)
    return seconds


def isolated_jct(
    app: Application,
    num_replicas: int,
    batch_size: int,
    gpus_per_node: int,
    total_gpus: int,
    contention: float,
    restart_penalty: float,
) -> float:
    """The denominator of finish-time fairness (see the module docstring)."""
    share = total_gpus / max(contention, 1.0)
    slowdown = max(1.0, num_replicas / share)
    run = solo_run_time(app, num_replicas, batch_size, gpus_per_node)
    return restart_penalty + run * slowdown


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job; times in seconds from the start of the trace."""

    name: str
    application: str
    submit: float
    start: float
    finish: float
    gpu_time: float
    restarts: int
    isolated_jct: float
    user: str = ""

    @property
    def jct(self) -> float:
        """Job completion time: finish minus submission."""
        return self.finish - self.submit

    @property
    def rho(self) -> float:
        """Finish-time fairness: JCT over the isolated, equal-share JCT."""
        return self.jct / self.isolated_jct


@dataclass(frozen=True, slots=True)
class SimResult:
    """The outcome of one simulation: every job, and the summary metrics."""

    policy: str
    jobs: tuple[JobRecord, ...]
    total_gpus: int
    reallocations: int
    decision_times: tuple[float, ...]
    user_ticks: tuple[UserTick, ...] = ()
    """Per tick, each user's GPUs held and jobs waiting (workloads with users only)."""

    def _jcts(self) -> np.ndarray:
        return np.array([job.jct for job in self.jobs], dtype=np.float64)

    @property
    def avg_jct(self) -> float:
        """Average job completion time (seconds)."""
        return float(self._jcts().mean()) if self.jobs else 0.0

    @property
    def median_jct(self) -> float:
        """Median job completion time (seconds)."""
        return float(np.median(self._jcts())) if self.jobs else 0.0

    @property
    def p99_jct(self) -> float:
        """99th percentile of job completion time (seconds)."""
        return float(np.percentile(self._jcts(), 99)) if self.jobs else 0.0

    @property
    def makespan(self) -> float:
        """Last finish minus first submission (seconds)."""
        if not self.jobs:
            return 0.0
        return max(job.finish for job in self.jobs) - min(job.submit for job in self.jobs)

    @property
    def gpu_utilization(self) -> float:
        """GPU-seconds held over GPU-seconds available during the makespan (0-1)."""
        capacity = self.total_gpus * self.makespan
        return sum(job.gpu_time for job in self.jobs) / capacity if capacity > 0 else 0.0

    @property
    def avg_rho(self) -> float:
        """Average finish-time fairness."""
        return float(np.mean([job.rho for job in self.jobs])) if self.jobs else 0.0

    @property
    def max_rho(self) -> float:
        """Worst finish-time fairness."""
        return max((job.rho for job in self.jobs), default=0.0)

    @property
    def decision_time_mean(self) -> float:
        """Average wall seconds per policy decision."""
        return float(np.mean(self.decision_times)) if self.decision_times else 0.0

    @property
    def decision_time_max(self) -> float:
        """Longest policy decision in wall seconds."""
        return max(self.decision_times, default=0.0)

    def summary(self) -> dict[str, float | int | str]:
        """The summary metrics by name (JSON-ready); `avg_jct` is the average JCT."""
        return {
            "policy": self.policy,
            "jobs": len(self.jobs),
            "avg_jct": self.avg_jct,
            "median_jct": self.median_jct,
            "p99_jct": self.p99_jct,
            "makespan": self.makespan,
            "gpu_utilization": self.gpu_utilization,
            "avg_rho": self.avg_rho,
            "max_rho": self.max_rho,
            "reallocations": self.reallocations,
            "decision_time_mean": self.decision_time_mean,
            "decision_time_max": self.decision_time_max,
        }

    def users(self) -> dict[str, dict[str, float | int]]:
        """Per user (where jobs have users; else empty): jobs, average JCT, GPU-time, its share."""
        if not any(job.user for job in self.jobs):
            return {}
        total = sum(job.gpu_time for job in self.jobs)
        figures: dict[str, dict[str, float | int]] = {}
        for user in sorted({job.user for job in self.jobs}):
            mine = [job for job in self.jobs if job.user == user]
            gpu_time = sum(job.gpu_time for job in mine)
            figures[user] = {
                "jobs": len(mine),
                "avg_jct": float(np.mean([job.jct for job in mine])),
                "gpu_time": gpu_time,
                "gpu_share": gpu_time / total if total > 0 else 0.0,
            }
        return figures

    def to_dict(self) -> dict[str, Any]:
        """Summary plus one entry per job (and per user, where jobs have users), for `--json`."""
        jobs = []
        for job in self.jobs:
            record = asdict(job) | {"jct": job.jct, "rho": job.rho}
            if not job.user:
                del record["user"]
            jobs.append(record)
        users = self.users()
        return self.summary() | {"job_records": jobs} | ({"users": users} if users else {})


@dataclass(frozen=True, slots=True)
class PairedRatio:
    """One policy's metric over another's, over runs paired by seed (module docstring)."""

    ratio: float
    """Geometric mean of the per-seed ratios."""
    low: float
    """Lower end of the 95% interval (the ratio itself with a single pair)."""
    high: float
    """Upper end of the 95% interval."""
    pairs: int

    @property
    def verdict(self) -> str:
        """`lower`, `higher`, or `same` when the interval contains 1 (or one pair only)."""
        if self.pairs < 2 or self.low <= 1.0 <= self.high:
            return "same"
        return "lower" if self.high < 1.0 else "higher"


def paired_ratio(ours: Sequence[float], theirs: Sequence[float]) -> PairedRatio:
    """`ours` over `theirs`, element i of each from the same seed; positive values."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError("paired_ratio needs two equally long, non-empty sequences")
    if min(ours) <= 0 or min(theirs) <= 0:
        raise ValueError("paired_ratio needs positive values")
    logs = np.log(np.asarray(ours, dtype=np.float64) / np.asarray(theirs, dtype=np.float64))
    mean = float(logs.mean())
    if len(logs) < 2:
        return PairedRatio(math.exp(mean), math.exp(mean), math.exp(mean), 1)
    from scipy import stats

    half = float(stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs)))
    return PairedRatio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))
