"""The view: the policy's `ClusterState` of this server, built from the daemon's state.

Its GPUs with their foreign memory, its ready GPU jobs (with learned memory
for `--gpu-mem auto`) and its running jobs with their GPUs and reservations.
A running job is a memory share when it asked for memory (`--gpu-mem`),
with the memory reserved for it. A job runs on at least the GPUs it asked
for (`min_gpus`); an adaptive job (`--gpus MIN-MAX`) may use up to MAX,
any other exactly its count.
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
In lab mode (`users`) each view names the job's owner (`JobView.user`),
for fair share (`gpuq.daemon.scheduler.usage`).
A job's placement constraint becomes its `nodes` (`nodes_of`: the nodes
it may use, `gpuq.daemon.scheduler.constraints`); a running job may also
keep the nodes it holds (a reload may have changed the labels since it
started). CPU-only jobs never reach the policy. Pure: unit-tested without
a daemon.

GPU types (`gpuq.gputypes`): the view's nodes are the servers, except that
a server with GPUs of several types is one node per type, `SERVER/TYPE`
(`view_nodes`), so that a job's `--gpu-type` is a node constraint like any
other: its `nodes` are then the view's nodes of its servers with GPUs of
its types, and every policy keeps to them without knowing of types.

A queue of a thousand jobs is rebuilt at every pass on the daemon's event
loop, so a `ViewCache` keeps each waiting job's view while nothing it is
made of changed (the same frozen `Job`, runner sample, learned memory and
profiled count): only running jobs, whose run time moves with the clock,
and changed ones are built again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuq.models import GpuInfo, Job, JobSpec, JobState
from gpuq.policies.interface import ClusterState, GpuView, JobView, NodeView

if TYPE_CHECKING:  # the daemon's state holds a ViewCache
    from gpuq.daemon.state import GpuSnapshot


@dataclass(slots=True)
class ViewCache:
    """Waiting jobs' views from the previous pass, with what each was built from."""

    views: dict[int, tuple[Job, object, int, int | None, frozenset[str] | None, JobView]] = field(
        default_factory=dict
    )
    fields: dict[int, tuple[object, int, dict[str, Any]]] = field(default_factory=dict)
    """Running jobs' `measurements`, kept while the same sample is their newest."""

    def measured(
        self, job_id: int, sample: Mapping[str, Any] | None, profiled: int
    ) -> dict[str, Any]:
        """`measurements(sample, profiled)`, made once per sample."""
        kept = self.fields.get(job_id)
        if kept is not None and kept[0] is sample and kept[1] == profiled:
            return kept[2]
        made = measurements(sample, profiled)
        self.fields[job_id] = (sample, profiled, made)
        return made

    def get(
        self,
        job: Job,
        sample: object,
        profiled: int,
        gpu_mem: int | None,
        nodes: frozenset[str] | None,
    ) -> JobView | None:
        """The job's view if it was built from these very objects and figures."""
        kept = self.views.get(job.id)
        if kept is None or kept[0] is not job or kept[1] is not sample:
            return None
        same = kept[2] == profiled and kept[3] == gpu_mem and kept[4] == nodes
        return kept[5] if same else None


def view_nodes(devices: Iterable[GpuInfo]) -> dict[str, tuple[str, str]]:
    """Each GPU's node in the view (by UUID): its name, and its (server, type).

    A server whose GPUs are all of one type is one node, named as the
    server; one with several types is a node per type, `SERVER/TYPE`.
    """
    types: dict[str, set[str]] = {}
    for gpu in devices:
        types.setdefault(gpu.node, set()).add(gpu.type)
    return {
        gpu.uuid: (gpu.node if len(types[gpu.node]) == 1 else f"{gpu.node}/{gpu.type}", gpu.type)
        for gpu in devices
    }


def _translate(
    allowed: frozenset[str] | None,
    gpu_types: tuple[str, ...],
    kinds: Mapping[str, tuple[str, str]],
    split: bool,
) -> frozenset[str] | None:
    """A job's servers (`allowed`, None: any) and GPU types as the view's nodes (`kinds`).

    Unchanged where no server is split and the job asks for no type.
    """
    if not gpu_types and (allowed is None or not split):
        return allowed
    wanted = {name.lower() for name in gpu_types}
    return frozenset(
        node
        for node, (server, kind) in kinds.items()
        if (allowed is None or server in allowed) and (not wanted or kind.lower() in wanted)
    )


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
    cache: ViewCache | None = None,
    nodes_of: Callable[[JobSpec], frozenset[str] | None] = lambda spec: None,
    users: bool = False,
) -> ClusterState:
    """The policy's state of this server: its GPUs, and its ready and running GPU jobs.

    With a `cache`, a waiting job's view is reused while its inputs are the
    same objects (module docstring), and the cache then holds this pass's.
    With `users` (lab mode), each job's view names its owner (`JobView.user`).
    """
    named = view_nodes(gpus.devices)
    kinds = {name: (g.node, kind) for g in gpus.devices for name, kind in (named[g.uuid],)}
    split = any(name != server for name, (server, _) in kinds.items())
    nodes: dict[str, int] = {}
    node_types: dict[str, str] = {}
    for device in gpus.devices:
        name, kind = named[device.uuid]
        nodes[name] = nodes.get(name, 0) + 1
        node_types[name] = kind
    order = {name: i for i, name in enumerate(nodes)}
    node_of = {g.uuid: order[named[g.uuid][0]] for g in gpus.devices}

    def nodes_for(spec: JobSpec) -> frozenset[str] | None:
        return _translate(nodes_of(spec), spec.gpu_types, kinds, split)

    def allocation(uuids: tuple[str, ...]) -> tuple[int, ...]:
        counts = [0] * len(nodes)
        for uuid in uuids:
            if uuid in node_of:
                counts[node_of[uuid]] += 1
        return tuple(counts)

    samples = measured or {}
    explored = profiled or {}

    def reported(job_id: int) -> dict[str, Any]:
        sample, seen = samples.get(job_id), explored.get(job_id, 0)
        return measurements(sample, seen) if cache is None else cache.measured(job_id, sample, seen)

    views: list[JobView] = []
    kept: dict[int, tuple[Job, object, int, int | None, frozenset[str] | None, JobView]] = {}
    for job in ready:
        spec = job.spec
        gpu_mem = spec.gpu_mem
        if spec.gpu_mem_auto:
            gpu_mem = learned_memory(job)  # None: no history, so it profiles on a whole GPU
        sample, seen = samples.get(job.id), explored.get(job.id, 0)
        allowed = nodes_for(spec)
        timeless = job.running_since is None  # its run time does not move with `now`
        if cache is not None and timeless:
            view = cache.get(job, sample, seen, gpu_mem, allowed)
            if view is not None:
                views.append(view)
                kept[job.id] = (job, sample, seen, gpu_mem, allowed, view)
                continue
        view = JobView(
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
            nodes=allowed,
            spread=spec.node_count,
            user=spec.user if users else "",
            **measurements(sample, seen),
        )
        views.append(view)
        if timeless:
            kept[job.id] = (job, sample, seen, gpu_mem, allowed, view)
    running: set[int] = set()
    gpu_node = {uuid: name for uuid, (name, _) in named.items()}
    for job in active:
        if job.state.is_active and job.gpu_uuids:
            allowed = nodes_for(job.spec)
            if allowed is not None:  # it keeps the nodes it holds, whatever the labels now
                allowed |= {gpu_node[uuid] for uuid in job.gpu_uuids if uuid in gpu_node}
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
                    gpu_mem=_share(job),
                    exclusive=job.spec.exclusive,
                    time_limit=job.spec.time_limit,
                    gpu_uuids=job.gpu_uuids,
                    start_time=job.start_time or job.submit_time,
                    run_time=job.run_time(now),
                    attained_service=job.run_time(now) * job.spec.gpus,
                    num_restarts=max(0, job.attempts - 1),
                    preemptible=preemptible(job),
                    suspended=job.state is JobState.SUSPENDED,
                    nodes=allowed,
                    spread=job.spec.node_count,
                    user=job.spec.user if users else "",
                    **reported(job.id),
                )
            )
            running.add(job.id)
    if cache is not None:
        cache.views = kept
        cache.fields = {j: made for j, made in cache.fields.items() if j in running}
    views.sort(key=lambda view: view.id)
    return ClusterState(
        nodes=tuple(NodeView(name, count, node_types[name]) for name, count in nodes.items()),
        jobs=tuple(views),
        gpus=tuple(
            GpuView(
                uuid=g.uuid,
                node=named[g.uuid][0],
                server="" if named[g.uuid][0] == g.node else g.node,
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


def _share(job: Job) -> int | None:
    """A running job's memory share: its reservation, if it asked for memory rather than GPUs.

    A whole-GPU job started with a reservation on another job's GPU (a
    packed guest, `gpuq.daemon.scheduler.packing`) is still a whole-GPU job.
    """
    asked = job.spec.gpu_mem is not None or job.spec.gpu_mem_auto
    return job.gpu_mem_reserved if asked else None


def measurements(sample: Mapping[str, Any] | None, profiled: int = 0) -> dict[str, Any]:
    """The `JobView` fields its runner's last report gives (module docstring); none without.

    `profiled` is the most GPUs the job held while it reported, over all its
    attempts: what Pollux's exploration counts as measured.
    """
    if not sample:
        return {}
    changes: dict[str, Any] = {"epoch": int(sample.get("epoch") or 0)}
    if sample.get("batch_size"):
        changes["batch_size"] = int(sample["batch_size"])
    if sample.get("memory_peak_bytes"):
        changes["memory_peak"] = int(sample["memory_peak_bytes"])
    replicas = int(sample.get("replicas") or 0)
    changes["max_profiled_gpus"] = max(profiled, replicas)
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
    return changes


def new_model(previous: Mapping[str, Any], sample: Mapping[str, Any]) -> bool:
    """True if `sample` brings a fitted model its job's `previous` sample did not have.

    The daemon decides again at once for a policy that allocates by goodput,
    as the simulator's next decision sees each job's newest fit.
    """
    model = sample.get("perf_params")
    return bool(model) and model != previous.get("perf_params")
