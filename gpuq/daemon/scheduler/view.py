"""The view: the policy's `ClusterState` of this server, built from the daemon's state.

Its GPUs with their foreign memory, its ready GPU jobs (with learned memory
for `--gpu-mem auto`) and its running jobs with their GPUs and reservations.
A job runs on at least the GPUs it asked for (`min_gpus`); an adaptive job
(`--gpus MIN-MAX`) may use up to MAX, any other exactly its count.
Every job carries its run time over all attempts and its attained service
(run time x GPUs asked), the measure of least-attained-service policies,
and its restarts (attempts after the first: each resize, move or resume
from a checkpoint is one, which Pollux's REALLOC_FACTOR charges); a
running job is `preemptible` when the scheduler may take its GPUs (a
checkpointing runner), which the caller decides. What a job's gpuq.runner
last reported (`measured`) adds its model: the fitted throughput model
with its gradient noise and batch limits as a `GoodputFunction` (numpy is
imported only then), its batch size, epoch, memory peak and the most GPUs
it was measured on (each sample is stored with the GPUs the job held).
CPU-only jobs never reach the policy. Pure: unit-tested without a daemon.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gpuq.daemon.state import GpuSnapshot
from gpuq.models import Job, JobState
from gpuq.policies.interface import ClusterState, GpuView, JobView, NodeView


def build_state(
    ready: list[Job],
    active: list[Job],
    gpus: GpuSnapshot,
    memory_margin: float,
    foreign_tolerance: int,
    learned_memory: Callable[[Job], int | None],
    now: float = 0.0,
    preemptible: Callable[[Job], bool] = lambda job: False,
    measured: Mapping[int, Mapping[str, Any]] | None = None,
    profiled: Mapping[int, int] | None = None,
) -> ClusterState:
    """The policy's state of this server: its GPUs, and its ready and running GPU jobs."""
    nodes: dict[str, int] = {}
    for device in gpus.devices:
        nodes[device.node] = nodes.get(device.node, 0) + 1
    node_of = {uuid: list(nodes).index(g.node) for g in gpus.devices for uuid in (g.uuid,)}

    def allocation(uuids: tuple[str, ...]) -> tuple[int, ...]:
        counts = [0] * len(nodes)
        for uuid in uuids:
            if uuid in node_of:
                counts[node_of[uuid]] += 1
        return tuple(counts)

    views: list[JobView] = []
    for job in ready:
        spec = job.spec
        gpu_mem = spec.gpu_mem
        if spec.gpu_mem_auto:
            gpu_mem = learned_memory(job)  # None: no history, so it profiles on a whole GPU
        views.append(
            JobView(
                id=job.id,
                submit_time=job.submit_time,
                gpus_requested=spec.gpus,
                adaptive=spec.gpus_max is not None,
                max_gpus=spec.gpus_max or spec.gpus,
                min_gpus=spec.gpus,
                priority=spec.priority,
                name=spec.name,
                gpu_mem=gpu_mem,
                exclusive=spec.exclusive,
                time_limit=spec.time_limit,
                run_time=job.run_time(now),
                attained_service=job.run_time(now) * spec.gpus,
                num_restarts=max(0, job.attempts - 1),
            )
        )
    for job in active:
        if job.state.is_active and job.gpu_uuids:
            views.append(
                JobView(
                    id=job.id,
                    submit_time=job.submit_time,
                    gpus_requested=job.spec.gpus,
                    adaptive=job.spec.gpus_max is not None,
                    max_gpus=job.spec.gpus_max or job.spec.gpus,
                    min_gpus=job.spec.gpus,
                    priority=job.spec.priority,
                    name=job.spec.name,
                    allocation=allocation(job.gpu_uuids),
                    gpu_mem=job.gpu_mem_reserved,
                    exclusive=job.spec.exclusive,
                    time_limit=job.spec.time_limit,
                    gpu_uuids=job.gpu_uuids,
                    start_time=job.start_time or job.submit_time,
                    run_time=job.run_time(now),
                    attained_service=job.run_time(now) * job.spec.gpus,
                    num_restarts=max(0, job.attempts - 1),
                    preemptible=preemptible(job),
                    suspended=job.state is JobState.SUSPENDED,
                )
            )
    if measured:
        explored = profiled or {}
        views = [
            with_measurements(view, measured.get(view.id), explored.get(view.id, 0))
            for view in views
        ]
    views.sort(key=lambda view: view.id)
    return ClusterState(
        nodes=tuple(NodeView(name, count) for name, count in nodes.items()),
        jobs=tuple(views),
        gpus=tuple(
            GpuView(
                uuid=g.uuid,
                node=g.node,
                memory_total=g.memory_total,
                memory_foreign=gpus.foreign_memory.get(g.uuid, 0),
                link_group=g.link_group,
                index=g.index,
            )
            for g in gpus.devices
        ),
        memory_margin=memory_margin,
        foreign_tolerance=foreign_tolerance,
    )


def with_measurements(
    view: JobView, sample: Mapping[str, Any] | None, profiled: int = 0
) -> JobView:
    """`view` with what its runner last reported (module docstring); as it is without.

    `profiled` is the most GPUs the job held while it reported, over all its
    attempts: what Pollux's exploration counts as measured.
    """
    if not sample:
        return view
    changes: dict[str, Any] = {"epoch": int(sample.get("epoch") or 0)}
    if sample.get("batch_size"):
        changes["batch_size"] = int(sample["batch_size"])
    if sample.get("memory_peak_bytes"):
        changes["memory_peak"] = int(sample["memory_peak_bytes"])
    replicas = int(sample.get("replicas") or 0)
    changes["max_profiled_gpus"] = max(view.max_profiled_gpus, profiled, replicas)
    limits, perf = sample.get("batch_limits"), sample.get("perf_params")
    if limits and len(limits) == 4:
        init, largest, low, high = (int(v) for v in limits)
        changes.update(init_batch_size=init, max_batch_size=largest, local_bsz_bounds=(low, high))
        sqr, var = sample.get("grad_sqr"), sample.get("grad_var")
        if perf and len(perf) == 7 and sqr is not None and var is not None:
            from gpuq.goodput import GoodputFunction, GradParams, PerfParams

            model = PerfParams(*(float(v) for v in perf))
            grad = GradParams(float(sqr), float(var) / init)  # the sample's tr(Sigma), per M0
            changes["goodput"] = GoodputFunction(model, grad, init)
    return replace(view, **changes)


def new_model(previous: Mapping[str, Any], sample: Mapping[str, Any]) -> bool:
    """True if `sample` brings a fitted model its job's `previous` sample did not have.

    The daemon decides again at once for a policy that allocates by goodput,
    as the simulator's next decision sees each job's newest fit.
    """
    model = sample.get("perf_params")
    return bool(model) and model != previous.get("perf_params")
