"""Loading the measured tables behind `gpuq.sim.apps.Application` (bundled CSV files).

Step-time tables per GPU type (`placements`, `scalability`: the Pollux
artifact's for T4, the Sia artifact's for the others) and the per-epoch
gradient statistics (`validation-B`, the same on every type), read by
column name, with each application's settings: Pollux's Table 1 optimizer
and learning-rate rule, the artifact's epoch counts and special cases, and
Sia's per-model restart delays, calibration and batch caps.
`gpuq.sim.apps` documents what the tables mean and how they are used.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import NamedTuple

import numpy as np

from gpuq.sim.apps import Application, Validation
from gpuq.sim.interpolate import Curve


class _Settings(NamedTuple):
    """Table 1 optimizer and LR rule, the artifact's epoch count, special cases, Sia's settings."""

    max_epochs: int
    optimizer: str
    lr_scaler: str
    restart_delay: float
    slowdown: float
    max_local: int | None = None  # the Pollux artifact's cap on the per-GPU batch
    max_replicas: int | None = None
    fixed_batch_size: int | None = None


_SETTINGS = {
    "bert": _Settings(2, "adamw", "sqrt", 120.0, 1.2),
    "cifar10": _Settings(100, "sgd", "adascale", 50.0, 1.8),
    "deepspeech2": _Settings(80, "sgd", "adascale", 25.0, 1.2),
    "imagenet": _Settings(90, "sgd", "adascale", 250.0, 1.2),
    "ncf": _Settings(10, "adam", "sqrt", 15.0, 1.5, max_replicas=1, fixed_batch_size=32768),
    "yolov3": _Settings(50, "sgd", "adascale", 80.0, 1.2, max_local=8),
}


class _GpuType(NamedTuple):
    """Where a GPU type's tables are and the cluster they were measured on."""

    suffix: str  # the Sia artifact's file suffix; "aws" files are the Pollux ones
    node_gpus: int
    max_nodes: int


_GPU_TYPE_TABLES = {
    "T4": _GpuType("aws", 4, 16),
    "RTX2080Ti": _GpuType("rtx", 8, 3),
    "A100": _GpuType("dgx-ext", 8, 2),
    "RTX6000": _GpuType("quad", 4, 1),
}

_SIA_MAX_LOCAL = {("deepspeech2", "RTX2080Ti"): 57}
"""Sia's caps on the per-GPU batch below the measured largest."""


def _read_columns(path: tuple[str, ...], columns: Sequence[str]) -> list[tuple[str, ...]]:
    """The rows of a bundled CSV file as the named columns, in that order (by header)."""
    data = resources.files("gpuq.sim").joinpath("data", *path)
    reader = csv.DictReader(io.StringIO(data.read_text(encoding="utf-8")))
    missing = [c for c in columns if c not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"{'/'.join(path)} lacks the column(s) {', '.join(missing)}")
    return [tuple(row[c] for c in columns) for row in reader]


def _step_tables(name: str, gpu_type: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The data paths of an application's `placements` and `scalability` tables for a type."""
    suffix = _GPU_TYPE_TABLES[gpu_type].suffix
    if suffix == "aws":
        return ("pollux", name, "placements.csv"), ("pollux", name, "scalability.csv")
    return (
        ("sia", name, f"placements-{suffix}.csv"),
        ("sia", name, f"scalability-{suffix}.csv"),
    )


@cache
def load(name: str, gpu_type: str, tables: str) -> Application:
    """Application `name` on `gpu_type` from the `tables` set (checked by the caller)."""
    placements_path, scalability_path = _step_tables(name, gpu_type)
    measured: dict[tuple[int, ...], list[tuple[float, float, float]]] = {}
    for row in _read_columns(placements_path, ("placement", "local_bsz", "step_time", "sync_time")):
        key = tuple(int(digit) for digit in row[0])
        bsz, step, sync = (float(value) for value in row[1:])
        measured.setdefault(key, []).append((bsz, step, sync))
    curves = {}
    groups: dict[tuple[float, float, float], list[tuple[float, float]]] = {}
    for key, samples in measured.items():
        data = np.array(sorted(samples))
        curves[key] = Curve(data[:, 0], data[:, 1], data[:, 2])
        for bsz, step, sync in samples:
            groups.setdefault((len(key), sum(key), bsz), []).append((step, sync))
    # Rows at the same point are averaged; placement points first, then the
    # scalability rows in file order (the order the triangulation sees).
    points = {point: groups[point] for point in sorted(groups)}
    scalability = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
    for row in _read_columns(scalability_path, scalability):
        nodes, replicas, bsz, step, sync = (float(value) for value in row)
        points.setdefault((nodes, replicas, bsz), []).append((step, sync))
    values = [np.mean(samples, axis=0) for samples in points.values()]

    folder = resources.files("gpuq.sim").joinpath("data", "pollux", name)
    sizes = sorted(
        int(entry.name[len("validation-") : -len(".csv")])
        for entry in folder.iterdir()
        if entry.name.startswith("validation-")
    )
    columns = ("progress", "iteration", "grad_sqr", "grad_var")
    validation_tables = [
        np.array(_read_columns(("pollux", name, f"validation-{size}.csv"), columns), dtype=float)
        for size in sizes
    ]
    epochs = min(len(table) for table in validation_tables)
    stacked = np.stack([table[:epochs] for table in validation_tables])
    validation = Validation(
        tuple(sizes), stacked[:, :, 0], stacked[:, :, 1], stacked[:, :, 2], stacked[:, :, 3]
    )

    settings = _SETTINGS[name]
    measured_local = [int(b) for curve in curves.values() for b in curve.local_bsz]
    if tables == "pollux":
        max_local = settings.max_local or max(measured_local)
    else:
        max_local = _SIA_MAX_LOCAL.get((name, gpu_type), max(measured_local))
    gpu = _GPU_TYPE_TABLES[gpu_type]
    sia = tables == "sia"
    return Application(
        name=name,
        init_batch_size=sizes[0],
        max_batch_size=sizes[-1],
        local_bsz_bounds=(min(measured_local), max_local),
        max_epochs=settings.max_epochs,
        optimizer=settings.optimizer,
        lr_scaler=settings.lr_scaler,
        placements=curves,
        validation=validation,
        _points=np.array(list(points), dtype=float),
        _values=np.array(values, dtype=float),
        max_replicas=settings.max_replicas,
        fixed_batch_size=settings.fixed_batch_size,
        gpu_type=gpu_type,
        node_gpus=gpu.node_gpus,
        max_measured_nodes=gpu.max_nodes,
        restart_delay=settings.restart_delay if sia else None,
        slowdown=settings.slowdown if sia else 1.0,
    )


__all__ = ["load"]
