"""The six Pollux applications: step times per GPU type and gradient statistics.

Each `Application` wraps one task of the Pollux paper (Table 1, with the
artifact's batch-size limits and epoch counts) on one GPU type, read from
one of two table sets (`TABLES`):

`pollux`
    The Pollux artifact's tables (`data/pollux/NOTICE.md`), measured on 16
    nodes x 4 NVIDIA T4; the only type is `T4`.
`sia`
    The Sia artifact's tables (`data/sia/NOTICE.md`), one per type of
    `GPU_TYPES["sia"]`: `T4` (the artifact's `aws` suffix; the Pollux files
    again, 4 GPUs per node, measured up to 16 nodes), `RTX2080Ti` (`rtx`, 8
    per node, 3 nodes), `A100` (`dgx-ext`, DGX-A100, 8 per node, 2 nodes) and
    `RTX6000` (`quad`, Quadro RTX 6000, 4 GPUs in 1 node), with Sia's
    settings below.

Step time for a placement
    A placement is the number of GPUs the job holds on each node it uses,
    e.g. `(4, 4, 2)`. As in the artifact it is normalized by dropping zeros
    and taking the lexicographically smallest rotation. If that placement was
    measured, step and sync times are interpolated linearly over the per-GPU
    batch size; otherwise they are interpolated linearly over
    `(num_nodes, num_replicas, local_bsz)` on the Delaunay triangulation of
    every measurement of the type, `placements` and `scalability` rows, as
    the artifact does with scipy's `LinearNDInterpolator`, with the node
    count capped at the most nodes measured for the type
    (`max_measured_nodes`). Rows at the same point are averaged: placements
    with equal counts as in the artifact, and also a `scalability` row that
    repeats a placement's point (some Sia tables do; scipy keeps one of them,
    whichever qhull picks). Choices the artifact leaves open (it fails
    outside the data):

    - below the smallest measured per-GPU batch, the compute part of the step
      stays at its value there (small batches are latency-bound); above the
      largest it grows in proportion to the batch (the GPU is saturated);
      the sync part stays at the end value;
    - a `(nodes, replicas, local_bsz)` point outside the measured hull (or
      any unmeasured placement where the measurements span one node only)
      uses the measured `(nodes, replicas)` group nearest in log scale, with
      the rule above for the batch;
    - a node holding more of the job's GPUs than the type's measured node
      size (`node_gpus`: 4 or 8) counts as several nodes of that size
      (pessimistic for servers with NVLink).

Per-GPU batch bounds
    `local_bsz_bounds` are the smallest and largest per-GPU batch in the
    type's `placements` table, except for the artifacts' caps: YOLOv3 at 8 in
    the pollux tables (although 16 was measured), DeepSpeech2 on RTX2080Ti at
    57 in the sia tables (80 was measured).

Gradient statistics
    `grad_params(epoch, batch_size)` reads `grad_sqr`/`grad_var` of that
    epoch, interpolated linearly between the two nearest measured batch sizes
    and clamped to the smallest and largest. Progress is counted in
    scale-invariant iterations of size M0; epoch `e` ends when progress
    reaches the smallest `progress` value of row `e` over all batch sizes
    (`epoch_progress`), and a job completes after `max_epochs` epochs. Both
    table sets share these tables (the Sia artifact's are Pollux's): the
    statistics do not depend on the GPU type.

Sia's settings
    `restart_delay`: the seconds Sia's simulator charges on every start,
    resize or move of a job (cifar10 50, deepspeech2 25, bert 120, yolov3 80,
    imagenet 250, ncf 15); None in the pollux tables, where the simulator's
    flat penalty applies. `slowdown`: the factor dividing a job's simulated
    goodput, which Sia calibrated against its physical runs (cifar10 1.8,
    ncf 1.5, others 1.2); 1.0 in the pollux tables.

Special case kept from the artifact in both sets: NCF runs at batch 32768 on
one GPU even under Pollux (`fixed_batch_size`, `max_replicas`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from gpuq.errors import UsageError
from gpuq.goodput import GradParams, adascale_gain
from gpuq.sim.interpolate import Curve, Triangulation

FloatArray = NDArray[np.float64]

MEASURED_GPUS_PER_NODE = 4
"""GPUs per node in the T4 measurements (AWS g4dn.12xlarge, 4x T4)."""

MAX_MEASURED_NODES = 16
"""Largest node count in the T4 measurements; more nodes are looked up as 16."""

APPLICATION_NAMES = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")

TABLES = ("pollux", "sia")
"""The two table sets: the Pollux artifact's and the Sia artifact's (module docstring)."""

GPU_TYPES: Mapping[str, tuple[str, ...]] = {
    "pollux": ("T4",),
    "sia": ("T4", "RTX2080Ti", "A100", "RTX6000"),
}
"""The GPU types each table set measured."""


class ProfileSample(NamedTuple):
    """One step-time measurement, as the job's agent records it."""

    num_nodes: int
    num_replicas: int
    local_bsz: int
    accum_step_time: float
    optim_step_time: float


class BatchConfig(NamedTuple):
    """How a job runs one optimizer step: per-GPU batch and extra accumulation steps."""

    atomic_bsz: int
    accum_steps: int

    def total(self, num_replicas: int) -> int:
        """The total batch size this config gives on `num_replicas` GPUs."""
        return num_replicas * self.atomic_bsz * (self.accum_steps + 1)


def normalize_placement(
    placement: Sequence[int], node_gpus: int = MEASURED_GPUS_PER_NODE
) -> tuple[int, ...]:
    """The measured-table key of a placement: no zeros, <= `node_gpus` a node, smallest rotation."""
    parts: list[int] = []
    for count in placement:
        while count > node_gpus:
            parts.append(node_gpus)
            count -= node_gpus
        if count > 0:
            parts.append(count)
    if not parts:
        return ()
    return min(tuple(parts[i:] + parts[:i]) for i in range(len(parts)))


@dataclass(frozen=True, slots=True)
class Validation:
    """Per-epoch tables at every measured batch size (rows: batch sizes)."""

    batch_sizes: tuple[int, ...]
    progress: FloatArray
    iteration: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray


@dataclass(frozen=True, eq=False)
class Application:
    """One Pollux task on one GPU type, with its measured tables (module docstring)."""

    name: str
    init_batch_size: int
    max_batch_size: int
    local_bsz_bounds: tuple[int, int]
    max_epochs: int
    optimizer: str
    lr_scaler: str
    placements: dict[tuple[int, ...], Curve] = field(repr=False)
    validation: Validation = field(repr=False)
    _points: FloatArray = field(repr=False)
    _values: FloatArray = field(repr=False)
    max_replicas: int | None = None
    fixed_batch_size: int | None = None
    gpu_type: str = "T4"
    node_gpus: int = MEASURED_GPUS_PER_NODE
    """GPUs per node in this type's measurements."""
    max_measured_nodes: int = MAX_MEASURED_NODES
    """Most nodes in this type's measurements; more nodes are looked up as this many."""
    restart_delay: float | None = None
    """Seconds Sia's simulator charges per start, resize or move; None: the flat penalty."""
    slowdown: float = 1.0
    """Factor dividing the simulated goodput (Sia's calibration; 1.0 for Pollux)."""
    _cache: dict[object, object] = field(default_factory=dict, repr=False)

    # ---- throughput -------------------------------------------------------------

    def step_time(self, placement: Sequence[int], local_bsz: float) -> tuple[float, float]:
        """Seconds per step and the part spent in gradient sync, at `local_bsz` per GPU."""
        key = (normalize_placement(placement, self.node_gpus), local_bsz)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._lookup(key[0], local_bsz)
            self._cache[key] = hit
        return hit  # type: ignore[return-value]

    def _lookup(self, placement: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        if not placement:
            raise ValueError("a placement needs at least one GPU")
        curve = self.placements.get(placement)
        if curve is not None:
            return curve.at(local_bsz)
        nodes = min(len(placement), self.max_measured_nodes)
        replicas = sum(placement)
        found = self._triangulation().at((nodes, replicas, local_bsz))
        if found is not None:
            step, sync = found
            return step, min(sync, step)
        return self._nearest_group(nodes, replicas).at(local_bsz)

    def _triangulation(self) -> Triangulation:
        triangulation = self._cache.get("triangulation")
        if triangulation is None:
            triangulation = Triangulation(self._points, self._values)
            self._cache["triangulation"] = triangulation
        return triangulation  # type: ignore[return-value]

    def _nearest_group(self, nodes: int, replicas: int) -> Curve:
        groups = np.unique(self._points[:, :2], axis=0)
        distance = np.log(groups[:, 0] / nodes) ** 2 + np.log(groups[:, 1] / replicas) ** 2
        best = groups[int(np.argmin(distance))]
        rows = (self._points[:, 0] == best[0]) & (self._points[:, 1] == best[1])
        order = np.argsort(self._points[rows, 2])
        return Curve(
            self._points[rows, 2][order],
            self._values[rows, 0][order],
            self._values[rows, 1][order],
        )

    def profile_sample(self, placement: Sequence[int], atomic_bsz: int) -> ProfileSample:
        """What the job's agent measures at this placement (compute and full step time)."""
        key = normalize_placement(placement, self.node_gpus)
        step, sync = self.step_time(key, atomic_bsz)
        return ProfileSample(len(key), sum(key), atomic_bsz, step - sync, step)

    def single_gpu_throughput(self) -> float:
        """Samples per second on one GPU at the largest per-GPU batch measured there.

        Sia projects a job's throughput from one GPU type to another by the
        ratio of these (`notes/sia.md` section 2).
        """
        curve = self.placements[(1,)]
        return float(curve.local_bsz[-1]) / float(curve.step_time[-1])

    def measured_samples(self) -> tuple[FloatArray, ...]:
        """Every measured placement as arrays `(nodes, replicas, local_bsz, accum, optim)`.

        `accum` is the compute part of a step (T_grad), `optim` the whole
        step: the inputs of `gpuq.goodput.fit_perf_params`.
        """
        rows = [
            (len(placement), sum(placement), bsz, step - sync, step)
            for placement, curve in sorted(self.placements.items())
            for bsz, step, sync in zip(
                curve.local_bsz, curve.step_time, curve.sync_time, strict=True
            )
        ]
        table = np.array(rows, dtype=np.float64)
        return tuple(table[:, i] for i in range(5))

    def fixed_batch_config(self, num_replicas: int, batch_size: int) -> BatchConfig:
        """Per-GPU batch and accumulation for a fixed total batch (the artifact's rule).

        Accumulate when the per-GPU share exceeds the upper bound, at least one
        accumulation step on a single GPU above M0 (the agent needs two
        micro-batches to estimate gradient noise), and never above the
        task's maximum total batch (a larger request is clamped to it first).
        """
        if num_replicas < 1:
            raise ValueError("num_replicas must be at least 1")
        batch_size = min(batch_size, self.max_batch_size)
        local = math.ceil(batch_size / num_replicas - 1e-8)
        accum = max(math.ceil(local / self.local_bsz_bounds[1] - 1e-8) - 1, 0)
        if num_replicas == 1 and batch_size > self.init_batch_size:
            accum = max(accum, 1)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, self.max_batch_size // (num_replicas * (accum + 1)))
        return BatchConfig(max(atomic, 1), accum)

    # ---- statistical efficiency and progress -------------------------------------

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Total batch sizes whose training was measured (the first is M0)."""
        return self.validation.batch_sizes

    @property
    def epoch_progress(self) -> tuple[float, ...]:
        """Progress (M0-sized iterations) at the start of each epoch; last entry: done."""
        hit = self._cache.get("epoch_progress")
        if hit is None:
            rows = self.validation.progress[:, : self.max_epochs].min(axis=0)
            hit = (0.0, *(float(v) for v in rows))
            self._cache["epoch_progress"] = hit
        return hit  # type: ignore[return-value]

    @property
    def completion_progress(self) -> float:
        """Progress at which the job completes (end of epoch `max_epochs`)."""
        return self.epoch_progress[-1]

    def _weights(self, batch_size: float) -> tuple[int, int, float]:
        sizes = self.validation.batch_sizes
        if batch_size <= sizes[0]:
            return 0, 0, 0.0
        if batch_size >= sizes[-1]:
            last = len(sizes) - 1
            return last, last, 0.0
        upper = int(np.searchsorted(sizes, batch_size))
        lower = upper - 1 if sizes[upper] != batch_size else upper
        if lower == upper:
            return lower, upper, 0.0
        return lower, upper, (batch_size - sizes[lower]) / (sizes[upper] - sizes[lower])

    def _table_at(self, table: FloatArray, batch_size: float, row: int) -> float:
        lower, upper, weight = self._weights(batch_size)
        row = min(row, table.shape[1] - 1)
        return float((1.0 - weight) * table[lower, row] + weight * table[upper, row])

    def grad_params(self, epoch: int, batch_size: float) -> GradParams:
        """True gradient statistics during `epoch` at total batch `batch_size`."""
        key = ("grad", epoch, batch_size)
        hit = self._cache.get(key)
        if hit is None:
            hit = GradParams(
                sqr=self._table_at(self.validation.grad_sqr, batch_size, epoch),
                var=self._table_at(self.validation.grad_var, batch_size, epoch),
            )
            self._cache[key] = hit
        return hit  # type: ignore[return-value]

    def gain(self, epoch: int, batch_size: int) -> float:
        """Progress per step during `epoch` at total batch `batch_size` (the AdaScale gain)."""
        key = ("gain", epoch, batch_size)
        hit = self._cache.get(key)
        if hit is None:
            grad = self.grad_params(epoch, batch_size)
            hit = adascale_gain(grad, self.init_batch_size, batch_size)
            self._cache[key] = hit
        return hit  # type: ignore[return-value]

    def iterations(self, batch_size: float, epoch: int) -> float:
        """Iterations at `batch_size` after completing epoch `epoch` (0-based; -1 gives 0)."""
        return self._iteration_marks(batch_size)[epoch + 1]

    def _iteration_marks(self, batch_size: float) -> tuple[float, ...]:
        key = ("iterations", batch_size)
        hit = self._cache.get(key)
        if hit is None:
            epochs = range(self.max_epochs)
            hit = (0.0, *(self._table_at(self.validation.iteration, batch_size, e) for e in epochs))
            self._cache[key] = hit
        return hit  # type: ignore[return-value]

    def total_iterations(self, batch_size: float) -> float:
        """Iterations at `batch_size` from the start to completion."""
        return self._iteration_marks(batch_size)[-1]

    def remaining_iterations(self, batch_size: float, progress: float) -> float:
        """Iterations at `batch_size` still needed from `progress` (the oracle).

        Within an epoch, iterations are interpolated in proportion to progress.
        """
        bounds = self.epoch_progress
        epoch = bisect.bisect_right(bounds, progress) - 1
        if epoch >= self.max_epochs:
            return 0.0
        epoch = max(epoch, 0)
        marks = self._iteration_marks(batch_size)
        span = bounds[epoch + 1] - bounds[epoch]
        fraction = min(max((progress - bounds[epoch]) / span, 0.0), 1.0) if span > 0 else 0.0
        done = marks[epoch] + fraction * (marks[epoch + 1] - marks[epoch])
        return max(marks[-1] - done, 0.0)


# ---- loading ---------------------------------------------------------------------


def get_application(name: str, gpu_type: str = "T4", tables: str = "pollux") -> Application:
    """The application `name` on `gpu_type` in the `tables` set, loaded once and cached."""
    if tables not in TABLES:
        raise UsageError(f"unknown tables {tables!r}; known: {', '.join(TABLES)}")
    if name not in APPLICATION_NAMES:
        known = ", ".join(APPLICATION_NAMES)
        raise UsageError(f"unknown application {name!r}; known: {known}")
    if gpu_type not in GPU_TYPES[tables]:
        known = ", ".join(GPU_TYPES[tables])
        raise UsageError(f"no GPU type {gpu_type!r} in the {tables} tables; known: {known}")
    from gpuq.sim.tables import load  # here: the tables import this module

    return load(name, gpu_type, tables)


class _Applications(Mapping[str, Application]):
    """Every application by name, each loaded on first access."""

    def __getitem__(self, name: str) -> Application:
        if name not in APPLICATION_NAMES:
            raise KeyError(name)
        return get_application(name)

    def __iter__(self) -> Iterator[str]:
        return iter(APPLICATION_NAMES)

    def __len__(self) -> int:
        return len(APPLICATION_NAMES)


APPLICATIONS: Mapping[str, Application] = _Applications()
"""The six applications by name; each is loaded on first access and cached."""
