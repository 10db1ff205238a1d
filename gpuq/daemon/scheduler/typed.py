"""A job's model on each GPU type, for a view whose nodes have several (Sia, live).

A gpuq.runner job reports the throughput model it fitted where it runs;
the daemon keeps the newest fit per GPU type (`record`: the model and the
most GPUs it was measured on there). A policy that knows types reads a
job's model on every type of the view (`JobView.per_type`): its own fit on
each type it ran on, and on the others its fit scaled by the types' prior
single-GPU speeds (`gpuq.gputypes.relative_speed`; a type without a prior
gets no model), as Sia bootstraps across types (`gpuq.typemodels`). The
gradient statistics and batch limits are the job's, whatever the type.
`gpu_type` is the type the job holds now, or else the one it was measured
on most widely. Views of one GPU type are left as they are. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuq.gputypes import relative_speed
from gpuq.policies.interface import ClusterState, JobView, TypeModel

TypeFits = dict[str, tuple[tuple[float, ...], int]]
"""A job's newest fit on each GPU type: the 7 terms of `PerfParams`, and the most GPUs."""


def record(fits: TypeFits, sample: Mapping[str, Any]) -> bool:
    """Keep a runner sample's model as its type's newest fit; True if it is a new one.

    A sample without a model, or taken on GPUs of several types, says
    nothing of one type and is ignored.
    """
    perf, kind = sample.get("perf_params"), sample.get("gpu_type")
    if not perf or len(perf) != 7 or not isinstance(kind, str) or not kind or "," in kind:
        return False
    replicas = max(int(sample.get("replicas") or 0), int(sample.get("gpus") or 0), 1)
    terms = tuple(float(v) for v in perf)
    before = fits.get(kind)
    widest = max(replicas, before[1]) if before is not None else replicas
    fits[kind] = (terms, widest)
    return before is None or before[0] != terms


def typed_view(cluster: ClusterState, fits: Mapping[int, TypeFits]) -> ClusterState:
    """`cluster` with each reporting job's model per type, where its nodes have several."""
    types = {node.gpu_type for node in cluster.nodes if node.gpu_type}
    if len(types) < 2:
        return cluster
    node_type = [node.gpu_type for node in cluster.nodes]
    speeds = {kind: speed for kind in sorted(types) if (speed := relative_speed(kind))}
    jobs = []
    for job in cluster.jobs:
        known = fits.get(job.id)
        if job.goodput is None or not known:
            jobs.append(job)
            continue
        jobs.append(_with_types(job, known, speeds, types, node_type))
    return dataclasses.replace(cluster, jobs=tuple(jobs))


def _with_types(
    job: JobView,
    known: TypeFits,
    speeds: Mapping[str, float],
    types: set[str],
    node_type: list[str],
) -> JobView:
    from gpuq.goodput import GoodputFunction, PerfParams  # numpy: only for jobs with a model
    from gpuq.typemodels import Fitted, bootstrap

    assert job.goodput is not None
    fitted = {kind: Fitted(PerfParams(*terms), most) for kind, (terms, most) in known.items()}
    models = bootstrap(fitted, speeds)
    grad, init = job.goodput.grad, job.goodput.init_batch_size
    per_type = {
        kind: TypeModel(GoodputFunction(perf, grad, init), job.local_bsz_bounds, measured)
        for kind, (perf, measured) in models.items()
        if kind in types
    }
    held = [kind for kind, count in zip(node_type, job.allocation, strict=False) if count]
    current = held[0] if held else max(known, key=lambda kind: known[kind][1])
    return dataclasses.replace(job, per_type=per_type, gpu_type=current)
