"""Workloads: the bundled Pollux and Sia traces, CSV files, and the paper's generator.

A workload is a tuple of `WorkloadJob`s sorted by submission time. The CSV
format is the artifacts': `name,time,application,num_replicas,batch_size`,
read by the header's names, with an optional `user` column (the job's
owner, for fair share: `gpuq.sim.fair`), written only where a job has one.

Users. `assign_users` gives each job of a workload an owner drawn at random
with the given weights (seeded), and `copies_for_users` makes each user
submit its own copies of every job at the same instant (user `heavy` with
10 copies submits exactly ten times the work of user `light` with 1, the
same mix of jobs): the workloads of the fair-share benchmark and tests.

Bundled traces (`BUNDLED_WORKLOADS`): the Pollux artifact's `workload-1` ...
`workload-4` (160 jobs over 8 hours) and `workload-0.5-1` ...
`workload-0.5-4` (0.5x load, 80 jobs); the Sia artifact's `philly-1` ...
`philly-4`, drawn from the Philly trace like Pollux's (no NCF jobs), and
`saturn-1` ... `saturn-5`, drawn from the Helios "Saturn" cluster (mostly
cifar10), 160 jobs over 8 hours each. Their `num_replicas` and `batch_size`
are the TunedJobs request, which adaptive policies override.

`generate_workload` follows the Pollux artifact's recipe (`simulator/
workload.py`, described in `notes/ones_pollux.md` 3.4) for a 64-GPU cluster:

1. Philly jobs with `duration >= 60 s` and `gpu_time < 1000 GPU-hours`;
2. timestamps shifted back `start_hour` (2) hours, keeping those whose hour
   of day is below `hours` (8): a time-of-day window pooled over all days;
3. `num_jobs` rows sampled without replacement; a job is submitted at the
   shifted time of day (`hour * 3600 + minute * 60 + second`), so arrivals
   follow the trace's daily shape, not a Poisson process;
4. the application follows the job's GPU-time: under 1 GPU-hour cifar10 or
   ncf (even odds), 1-10 deepspeech2, half of which become bert (drawn from
   a separate stream, so the rest of the workload does not change), 10-100
   yolov3, above imagenet;
5. `variant="tuned"` (TunedJobs): GPU count and batch size drawn uniformly
   from `tuned_configurations`, the counts 1, 2, 4, ..., 48 (packed
   `gpus_per_node` per node) whose best measured batch size trains in under
   12 hours at 50-80% of linear scaling over one GPU (see below when none
   qualifies); `variant="realistic"`: the trace's GPU count (for the 10+
   GPU-hour classes, the count of a random trace job of the same class that
   ran at most a day, as the artifact does) and batch size M0 x GPUs.

Where no GPU count meets the TunedJobs rule (the artifact then uses one
GPU), the largest count still above 50% scaling is used instead; this
changes nothing on 64 GPUs and avoids week-long one-GPU jobs in a lab.

The artifact draws with Python's `random` and pandas; this uses a seeded
numpy `Generator`, so workloads match the recipe and its statistics, not the
artifact's files row for row.

Lab variant. `lab_workload(seed)` is the recipe for one server of
`LAB_GPUS` (8) GPUs at `LAB_LOAD` (1.5x, 30 jobs), whatever cluster it then
runs on: a lab's day of submissions, the same jobs for `gpuq sim` and
`gpuq replay` (named `lab:SEED` there).

Load and lab scale. `load` multiplies the job count (the artifact's 0.5x
workloads have 80 jobs). For a cluster of `G` GPUs the job count is scaled
by `G / 64`, and a trace job's GPU-time is scaled by `G / 64` before it is
classified, so the 1/10/100 GPU-hour class boundaries become `64/G` times
larger on the trace. A lab's jobs are thus proportionally smaller: in a
4-GPU lab an ImageNet job (hundreds of GPU-hours, days of the whole lab)
needs a trace job above 1600 GPU-hours and never appears, while the
arrival pattern and the mix of small jobs stay. GPU counts are capped at
`G`, and at the largest batch's worth of M0-sized shares in the realistic
variant (`max_batch_size // init_batch_size`).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from gpuq.errors import UsageError
from gpuq.sim.apps import APPLICATION_NAMES, Application, get_application
from gpuq.workloads import BUNDLED_WORKLOADS as BUNDLED_WORKLOADS  # re-exported

REFERENCE_GPUS = 64
"""Cluster size the Pollux recipe was written for (16 nodes x 4 GPUs)."""

LAB_GPUS = 8
"""GPUs of the generator's lab variant: one server (`lab_workload`)."""
LAB_LOAD = 1.5
"""Load of the lab variant: 30 jobs on its 8 GPUs over the 8-hour window."""
MAX_LOAD = 100.0
"""The largest load a generator takes: 100 times the recipe's jobs (16,000 on 64 GPUs)."""

TUNED_REPLICAS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48)
"""GPU counts the TunedJobs rule considers (the artifact's list)."""


_BUNDLED_FOLDERS = {
    "workload": ("pollux", "workloads"),
    "workload-0.5": ("pollux", "workloads-0.5"),
    "philly": ("sia", "workloads", "philly"),
    "saturn": ("sia", "workloads", "saturn"),
}

_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job of a workload: when it arrives, what it trains, and its user configuration."""

    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int
    user: str = ""
    """The job's owner (empty: none; a workload whose jobs have owners runs with fair share)."""


def _parse(text: str, source: str) -> tuple[WorkloadJob, ...]:
    reader = csv.DictReader(io.StringIO(text))
    try:
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise UsageError(
                f"{source}: missing column(s) {', '.join(missing)}",
                hint=f"a workload CSV has the columns {','.join(_COLUMNS)}",
            )
        jobs = [_job(row, source, line) for line, row in enumerate(reader, start=2)]
    except csv.Error as error:
        raise UsageError(f"{source}, line {reader.line_num}: not CSV: {error}") from None
    if not jobs:
        raise UsageError(
            f"{source} has no jobs, only its header",
            hint="add a line per job: name,time,application,num_replicas,batch_size",
        )
    return tuple(sorted(jobs, key=lambda job: job.time))


def _job(row: dict[str, str | None], source: str, line: int) -> WorkloadJob:
    """One row as a job, or UsageError naming the line and the field."""
    where = f"{source}, line {line}"
    fields = {}
    for column in _COLUMNS:
        value = row.get(column)
        if value is None or not value.strip():
            raise UsageError(f"{where}: no {column}", hint=f"each line gives {','.join(_COLUMNS)}")
        fields[column] = value.strip()
    try:
        time = float(fields["time"])
    except ValueError:
        time = math.nan
    if not math.isfinite(time):
        raise UsageError(
            f"{where}: time {fields['time']!r} is not a number of seconds",
            hint="time is the job's arrival in seconds from the start, such as 0 or 1800",
        )
    counts = {}
    for column in ("num_replicas", "batch_size"):
        try:
            counts[column] = int(fields[column])
        except ValueError:
            raise UsageError(
                f"{where}: {column} {fields[column]!r} is not a whole number"
            ) from None
    job = WorkloadJob(
        name=fields["name"],
        time=time,
        application=fields["application"],
        num_replicas=counts["num_replicas"],
        batch_size=counts["batch_size"],
        user=(row.get("user") or "").strip(),
    )
    if job.application not in APPLICATION_NAMES:
        known = ", ".join(APPLICATION_NAMES)
        raise UsageError(
            f"{where}: unknown application {job.application!r}",
            hint=f"known applications: {known}",
        )
    if job.num_replicas < 1 or job.batch_size < 1 or job.time < 0:
        raise UsageError(f"{where}: needs time >= 0, GPUs >= 1, batch >= 1")
    return job


def load_workload(path: str | Path) -> tuple[WorkloadJob, ...]:
    """Read a workload CSV (`name,time,application,num_replicas,batch_size`)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a spreadsheet's BOM is no column
    except OSError as error:
        raise UsageError(f"cannot read workload {path}: {error.strerror}") from None
    except UnicodeDecodeError as error:
        raise UsageError(
            f"workload {path} is not UTF-8 text (byte {error.start})",
            hint="a workload is a CSV file: name,time,application,num_replicas,batch_size",
        ) from None
    return _parse(text, str(path))


def bundled_workload(name: str) -> tuple[WorkloadJob, ...]:
    """One of the artifacts' workloads by name (see `BUNDLED_WORKLOADS`)."""
    if name not in BUNDLED_WORKLOADS:
        raise UsageError(
            f"no bundled workload {name!r}", hint=f"known: {', '.join(BUNDLED_WORKLOADS)}"
        )
    kind, _, number = name.rpartition("-")
    folder = resources.files("gpuq.sim").joinpath("data", *_BUNDLED_FOLDERS[kind])
    data = folder.joinpath(f"workload-{number}.csv")
    return _parse(data.read_text(encoding="utf-8"), name)


def write_workload(jobs: tuple[WorkloadJob, ...]) -> str:
    """The CSV text of a workload, in the format `load_workload` reads."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    users = any(job.user for job in jobs)
    writer.writerow((*_COLUMNS, "user") if users else _COLUMNS)
    for job in jobs:
        time = int(job.time) if float(job.time).is_integer() else job.time
        row = (job.name, time, job.application, job.num_replicas, job.batch_size)
        writer.writerow((*row, job.user) if users else row)
    return out.getvalue()


def assign_users(
    jobs: tuple[WorkloadJob, ...], weights: Mapping[str, float], seed: int = 0
) -> tuple[WorkloadJob, ...]:
    """The workload with each job's owner drawn from `weights` (relative odds), seeded."""
    names = sorted(weights)
    odds = np.array([max(float(weights[name]), 0.0) for name in names])
    if not names or odds.sum() <= 0:
        raise UsageError("assign_users needs at least one user with a positive weight")
    rng = np.random.default_rng(seed)
    drawn = rng.choice(len(names), size=len(jobs), p=odds / odds.sum())
    return tuple(
        replace(job, user=names[int(index)]) for job, index in zip(jobs, drawn, strict=True)
    )


def copies_for_users(
    jobs: tuple[WorkloadJob, ...], copies: Mapping[str, int]
) -> tuple[WorkloadJob, ...]:
    """Each user submits `copies[user]` copies of every job, at its time (module docstring).

    Copies are named `NAME-USER-K`; the result is sorted by time, users in
    name order within an instant.
    """
    if any(count < 0 for count in copies.values()) or not any(copies.values()):
        raise UsageError("copies_for_users needs counts of 0 or more, one of them positive")
    made = [
        replace(job, name=f"{job.name}-{user}-{k}", user=user)
        for job in jobs
        for user in sorted(copies)
        for k in range(copies[user])
    ]
    return tuple(sorted(made, key=lambda job: job.time))


# ---- the TunedJobs rule -------------------------------------------------------------


def packed_placement(num_replicas: int, gpus_per_node: int) -> tuple[int, ...]:
    """`num_replicas` GPUs on as few nodes as possible: full nodes, then the rest."""
    full, rest = divmod(num_replicas, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def config_jct(app: Application, placement: tuple[int, ...], batch_size: int) -> float | None:
    """The TunedJobs rule's JCT estimate at a measured batch size (None if it cannot run).

    Iterations to completion at `batch_size` times the step time, with
    accumulation when the per-GPU share exceeds the upper bound.
    """
    replicas = sum(placement)
    local = math.ceil(batch_size / replicas - 1e-8)
    if local < app.local_bsz_bounds[0]:
        return None
    accum = math.ceil(local / app.local_bsz_bounds[1] - 1e-8) - 1
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    step, sync = app.step_time(placement, atomic)
    return app.total_iterations(batch_size) * (step + accum * (step - sync))


@cache
def tuned_configurations(
    application: str,
    cluster_gpus: int = REFERENCE_GPUS,
    gpus_per_node: int = 4,
    low: float = 0.5,
    high: float = 0.8,
) -> tuple[tuple[int, int, float], ...]:
    """The TunedJobs choices `(num_replicas, batch_size, jct)` for an application.

    A GPU count qualifies if its best measured batch size trains in under 12
    hours at a scaling efficiency `jct(1) / (jct(K) * K)` strictly between
    `low` and `high`. With none (small clusters, or NCF, which scales badly),
    the largest count whose scaling efficiency is above `low`, or one GPU: on
    64 GPUs this gives the artifact's choices, and in a lab it gives ImageNet
    every GPU it can use well rather than one GPU for days.
    """
    app = get_application(application)
    chosen, fallback = [], []
    base: tuple[int, float] | None = None
    for replicas in TUNED_REPLICAS:
        if replicas > cluster_gpus or replicas * app.local_bsz_bounds[0] > app.max_batch_size:
            break
        placement = packed_placement(replicas, gpus_per_node)
        options = [(config_jct(app, placement, b), b) for b in app.batch_sizes]
        valid = [(jct, batch) for jct, batch in options if jct is not None]
        if not valid:
            continue
        jct, batch = min(valid)
        if base is None:
            base = (batch, jct)
            fallback = [(replicas, batch, jct)]
            continue
        scaling = base[1] / (jct * replicas)
        if jct < 12 * _HOUR and low < scaling < high:
            chosen.append((replicas, batch, jct))
        elif scaling > low:
            fallback = [(replicas, batch, jct)]
    return tuple(chosen or fallback)


# ---- the generator ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Trace:
    """Philly jobs after the duration and GPU-time filter."""

    hour: NDArray[np.int64]  # hour of day of submission
    second_of_hour: NDArray[np.int64]
    duration: NDArray[np.float64]
    num_gpus: NDArray[np.int64]
    gpu_time: NDArray[np.float64]


@cache
def _philly() -> _Trace:
    data = resources.files("gpuq.sim").joinpath("data", "pollux", "philly.csv")
    hour, second, duration, gpus, gpu_time = [], [], [], [], []
    for row in csv.DictReader(io.StringIO(data.read_text(encoding="utf-8"))):
        length, used = float(row["duration"]), float(row["gpu_time"])
        if length < 60 or used >= 1000 * _HOUR:
            continue
        clock = row["timestamp"][11:19]  # "YYYY-MM-DD HH:MM:SS"
        hour.append(int(clock[0:2]))
        second.append(int(clock[3:5]) * 60 + int(clock[6:8]))
        duration.append(length)
        gpus.append(int(row["num_gpus"]))
        gpu_time.append(used)
    return _Trace(
        np.array(hour, dtype=np.int64),
        np.array(second, dtype=np.int64),
        np.array(duration),
        np.array(gpus, dtype=np.int64),
        np.array(gpu_time),
    )


def _size_class(gpu_hours: NDArray[np.float64]) -> NDArray[np.int64]:
    """0: small (< 1 GPU-h), 1: medium (< 10), 2: large (< 100), 3: extra large."""
    return np.searchsorted(np.array([1.0, 10.0, 100.0]), gpu_hours, side="right").astype(np.int64)


def generate_workload(
    seed: int,
    num_jobs: int = 160,
    hours: int = 8,
    variant: Literal["tuned", "realistic"] = "tuned",
    load: float = 1.0,
    cluster_gpus: int = REFERENCE_GPUS,
    gpus_per_node: int = 4,
    start_hour: int = 2,
) -> tuple[WorkloadJob, ...]:
    """A workload drawn from the Philly trace by the Pollux recipe (module docstring).

    `num_jobs` is the count for a 64-GPU cluster at load 1; the result has
    `round(num_jobs * load * cluster_gpus / 64)` jobs (at least one).
    Deterministic for a given seed and arguments.
    """
    if variant not in ("tuned", "realistic"):
        raise UsageError(f"unknown workload variant {variant!r}; known: tuned, realistic")
    if not 1 <= hours <= 24 or cluster_gpus < 1 or gpus_per_node < 1 or not 0 < load <= MAX_LOAD:
        raise UsageError(
            f"need 1 <= hours <= 24, cluster_gpus >= 1, gpus_per_node >= 1, "
            f"0 < load <= {MAX_LOAD:g}"
        )
    if seed < 0:
        raise UsageError(f"the seed must be 0 or more, got {seed}")
    scale = cluster_gpus / REFERENCE_GPUS
    count = max(1, round(num_jobs * load * scale))
    main, bert_stream, gpu_stream = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    trace = _philly()
    shifted = (trace.hour - start_hour) % 24
    window = np.flatnonzero(shifted < hours)
    classes = _size_class(trace.gpu_time[window] * scale / _HOUR)
    rows = main.choice(window.size, size=count, replace=count > window.size)

    def tuned(application: str, stream: np.random.Generator) -> tuple[int, int]:
        options = tuned_configurations(application, cluster_gpus, gpus_per_node)
        replicas, batch, _ = options[int(stream.integers(len(options)))]
        return replicas, batch

    records: list[tuple[float, int, str, int, int]] = []
    for order, row in enumerate(rows):
        index, size = window[row], int(classes[row])
        if size == 0:
            application = ("cifar10", "ncf")[int(main.integers(2))]
        elif size == 1:
            application = "deepspeech2"
        else:
            application = ("yolov3", "imagenet")[size - 2]
        if variant == "tuned":
            replicas, batch = tuned(application, main)
        if application == "deepspeech2" and bert_stream.integers(2):
            application = "bert"  # drawn aside so that the other jobs do not change
            if variant == "tuned":
                replicas, batch = tuned(application, bert_stream)
        if variant == "realistic":
            gpus = int(trace.num_gpus[index])
            if size >= 2:  # the artifact redraws large jobs' GPU counts from day-long jobs
                same = window[(classes == size) & (trace.duration[window] <= 24 * _HOUR)]
                if same.size:
                    gpus = int(trace.num_gpus[same[int(gpu_stream.integers(same.size))]])
            app = get_application(application)
            replicas = max(1, min(gpus, cluster_gpus, app.max_batch_size // app.init_batch_size))
            batch = app.init_batch_size * replicas
        time = float(shifted[index] * 3600 + trace.second_of_hour[index])
        records.append((time, order, application, replicas, batch))
    records.sort()
    return tuple(
        WorkloadJob(f"{application}-{i}", time, application, replicas, batch)
        for i, (time, _, application, replicas, batch) in enumerate(records)
    )


def lab_workload(
    seed: int,
    variant: Literal["tuned", "realistic"] = "tuned",
    load: float = LAB_LOAD,
) -> tuple[WorkloadJob, ...]:
    """The generator's lab variant: one server of `LAB_GPUS` GPUs (module docstring)."""
    return generate_workload(
        seed, variant=variant, load=load, cluster_gpus=LAB_GPUS, gpus_per_node=LAB_GPUS
    )
