"""The view: the policy's `ClusterState` of this server, built from the daemon's state.

Its GPUs with their foreign memory, its ready GPU jobs (with learned memory
for `--gpu-mem auto`) and its running jobs with their GPUs and reservations.
A job runs on at least the GPUs it asked for (`min_gpus`); an adaptive job
(`--gpus MIN-MAX`) may use up to MAX, any other exactly its count.
Every job carries its run time over all attempts and its attained service
(run time x GPUs asked), the measure of least-attained-service policies; a
running job is `preemptible` when the scheduler may take its GPUs (a
checkpointing runner), which the caller decides. CPU-only jobs never reach
the policy. Pure: unit-tested without a daemon.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuq.daemon.state import GpuSnapshot
from gpuq.models import Job
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
                    preemptible=preemptible(job),
                )
            )
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
            )
            for g in gpus.devices
        ),
        memory_margin=memory_margin,
        foreign_tolerance=foreign_tolerance,
    )
