"""Run an elastic policy inside the daemon: `ElasticAdapter(policy).decide(view, now)`.

The daemon speaks `gpuq.policies.base` (GPU UUIDs, memory shares, one plan of
jobs to start); the papers' policies speak `gpuq.policies.interface` (nodes,
GPU counts per node). `ElasticAdapter` wraps an elastic policy into the
daemon's `Policy` protocol:

Nodes
    The view's GPUs are grouped by `GpuState.node`, in order of first
    appearance. A node offers the elastic policy its GPUs that whole-GPU
    jobs may use: those held by a running whole-GPU job, and the free ones
    whose foreign memory is within `foreign_tolerance`. GPUs held by shared
    or exclusive-share jobs, and GPUs blocked by other users' processes, are
    left out.

Jobs
    Only whole-GPU jobs (`gpu_mem` None, at least one GPU, exclusive or not)
    go to the elastic policy. A pending one becomes a `JobView` with its
    priority, submit time and `gpus_requested`, and `max_gpus` equal to that
    count since the daemon cannot resize a job. A running one carries its
    allocation per node, `run_time` since its start and `attained_service`
    as GPUs x run time; `RunningJob` has no submit time or priority, so its
    start time stands for the submit time and its priority is 0. Nothing is
    known of their throughput or remaining work (`goodput` and
    `remaining_iterations` are None), so model-based policies fall back to
    their documented defaults. A request the hardware can never hold waits
    with the reason the `fifo` policy gives.

Starting jobs
    Pending jobs are taken in the daemon's queue order (priority, submit
    time, id). One starts when the policy gives it exactly its requested
    GPU count and every node of its allocation has that many GPUs free now;
    the GPUs are the node's free ones in view order. A pending job offered a
    different count waits ("offered 2 of 4 GPUs"); one whose GPUs are still
    held by a running job waits for them.

Running jobs
    The daemon cannot yet preempt, shrink, grow or move a running job. A
    running job whose allocation the policy would change keeps its GPUs,
    and the plan reports what the policy wanted as that job's waiting
    reason ("policy tiresias would preempt this job; not supported yet").
    The daemon shows waiting reasons only for queued jobs, so this is
    visible to debugging tools and tests until resizing exists.

Shared and CPU-only jobs
    Jobs with `gpu_mem` (shared GPUs, including exclusive ones with a memory
    request) and CPU-only jobs are placed by the `fifo` policy
    (`gpuq.policies.fifo.FifoBackfill`) exactly as without the adapter,
    after the elastic policy's starts, which it sees as running jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from gpuq.policies.base import ClusterView, JobRequest, Placement, Plan, RunningJob
from gpuq.policies.fifo import FifoBackfill, queue_order
from gpuq.policies.interface import ClusterState, Decision, ElasticPolicy, JobView, NodeView
from gpuq.policies.placement import Capacity, Hardware, Hold


class _Layout:
    """Which GPUs (view indices) each node offers whole-GPU jobs, and who holds them."""

    def __init__(self, view: ClusterView) -> None:
        self.names: list[str] = []
        node_of: dict[str, int] = {}
        for gpu in view.gpus:
            if gpu.node not in node_of:
                node_of[gpu.node] = len(self.names)
                self.names.append(gpu.node)
        index = {gpu.uuid: i for i, gpu in enumerate(view.gpus)}
        self.owner: dict[int, int] = {}
        blocked: set[int] = set()
        for job in view.running:
            gpus = [index[uuid] for uuid in job.gpu_uuids if uuid in index]
            if job.gpu_mem is None:
                self.owner.update((i, job.id) for i in gpus)
            else:
                blocked.update(gpus)
        self.node = [node_of[gpu.node] for gpu in view.gpus]
        self.usable = [
            i
            for i, gpu in enumerate(view.gpus)
            if i not in blocked
            and (i in self.owner or gpu.memory_foreign <= view.foreign_tolerance)
        ]

    def nodes(self) -> tuple[NodeView, ...]:
        """One NodeView per node with its usable GPU count."""
        counts = [0] * len(self.names)
        for i in self.usable:
            counts[self.node[i]] += 1
        return tuple(NodeView(name, count) for name, count in zip(self.names, counts, strict=True))

    def allocation(self, gpus: Sequence[int]) -> tuple[int, ...]:
        """GPUs per node of a set of view indices."""
        counts = [0] * len(self.names)
        for i in gpus:
            counts[self.node[i]] += 1
        return tuple(counts)

    def free_by_node(self) -> list[list[int]]:
        """Usable GPUs no job holds, per node, in view order."""
        free: list[list[int]] = [[] for _ in self.names]
        for i in self.usable:
            if i not in self.owner:
                free[self.node[i]].append(i)
        return free


def _running_views(view: ClusterView, layout: _Layout, now: float) -> list[JobView]:
    index = {gpu.uuid: i for i, gpu in enumerate(view.gpus)}
    jobs = []
    for job in view.running:
        if job.gpu_mem is not None:
            continue
        gpus = [index[uuid] for uuid in job.gpu_uuids if uuid in index]
        if not gpus:
            continue
        run_time = max(now - job.start_time, 0.0)
        jobs.append(
            JobView(
                id=job.id,
                submit_time=job.start_time,
                gpus_requested=len(gpus),
                max_gpus=len(gpus),
                allocation=layout.allocation(gpus),
                attained_service=run_time * len(gpus),
                run_time=run_time,
                max_profiled_gpus=len(gpus),
            )
        )
    return jobs


def _describe_change(policy: str, old: tuple[int, ...], new: tuple[int, ...]) -> str:
    if sum(new) == 0:
        action = "preempt this job"
    elif sum(new) < sum(old):
        action = f"shrink this job to {sum(new)} GPUs"
    elif sum(new) > sum(old):
        action = f"grow this job to {sum(new)} GPUs"
    else:
        action = "move this job to other nodes"
    return f"policy {policy} would {action}; the daemon cannot do that yet"


class ElasticAdapter:
    """An elastic policy behind the daemon's `Policy` protocol (module docstring)."""

    def __init__(self, policy: ElasticPolicy) -> None:
        self.policy = policy
        self.name = policy.name
        self.fallback = FifoBackfill()

    def decide(self, view: ClusterView, now: float) -> Plan:
        """Start the whole-GPU jobs the elastic policy allocates, then the shared ones."""
        layout = _Layout(view)
        hardware = Hardware(view)
        waiting: dict[int, str] = {}
        whole: list[JobRequest] = []
        others: list[JobRequest] = []
        for request in view.pending:
            if request.gpu_mem is not None or request.gpus <= 0:
                others.append(request)
                continue
            never = hardware.impossible_reason(request.gpus, None)
            if never is not None:
                waiting[request.id] = never
            else:
                whole.append(request)
        running = _running_views(view, layout, now)
        pending = [
            JobView(
                id=request.id,
                submit_time=request.submit_time,
                gpus_requested=request.gpus,
                max_gpus=request.gpus,
                priority=request.priority,
            )
            for request in whole
        ]
        state = ClusterState(
            nodes=layout.nodes(),
            jobs=tuple(sorted([*running, *pending], key=lambda job: job.id)),
        )
        decision = self.policy.decide(state, now)
        for job in running:
            wanted = tuple(decision.allocations.get(job.id, ()))
            if (wanted or (0,) * len(job.allocation)) != job.allocation:
                waiting[job.id] = _describe_change(self.name, job.allocation, wanted)
        starts = self._starts(view, layout, whole, decision, waiting)
        shared_plan = self._place_others(view, others, starts, now)
        waiting.update(shared_plan.waiting)
        return Plan(start=(*starts, *shared_plan.start), waiting=waiting)

    def _starts(
        self,
        view: ClusterView,
        layout: _Layout,
        whole: list[JobRequest],
        decision: Decision,
        waiting: dict[int, str],
    ) -> list[Placement]:
        free = layout.free_by_node()
        capacity = Capacity.from_view(view)
        starts: list[Placement] = []
        for request in queue_order(tuple(whole)):
            allocation = tuple(decision.allocations.get(request.id, ()))
            offered = sum(allocation)
            if offered == 0:
                reason = capacity.summary().wait_reason(request.gpus, None, request.exclusive)
                waiting[request.id] = reason
                continue
            if offered != request.gpus or len(allocation) != len(free):
                waiting[request.id] = f"policy {self.name} offered {offered} of {request.gpus} GPUs"
                continue
            if any(count > len(node) for count, node in zip(allocation, free, strict=True)):
                waiting[request.id] = "waiting for GPUs the policy expects running jobs to release"
                continue
            gpus: list[int] = []
            for count, node in zip(allocation, free, strict=True):
                gpus.extend(node[:count])
                del node[:count]
            gpus.sort()
            capacity.hold(Hold(request.id, tuple(gpus), None, request.exclusive))
            starts.append(Placement(request.id, tuple(view.gpus[i].uuid for i in gpus)))
        return starts

    def _place_others(
        self, view: ClusterView, others: list[JobRequest], starts: list[Placement], now: float
    ) -> Plan:
        if not others:
            return Plan()
        exclusive = {request.id: request.exclusive for request in view.pending}
        limits = {request.id: request.time_limit for request in view.pending}
        started = tuple(
            RunningJob(
                id=placement.job_id,
                gpu_uuids=placement.gpu_uuids,
                exclusive=exclusive[placement.job_id],
                start_time=now,
                time_limit=limits[placement.job_id],
            )
            for placement in starts
        )
        return self.fallback.decide(
            replace(view, pending=tuple(others), running=(*view.running, *started)), now
        )
