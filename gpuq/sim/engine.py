"""The simulator loop: replay a workload against a policy on a simulated cluster.

Every tick of `interval` seconds, at time `now`:

1. jobs whose submission time is at most `now` join the active set;
2. the policy gets a `ClusterState` with one `JobView` per active job (in
   submission order, ids are workload positions) and returns a `Decision`;
   its wall time is recorded as the decision time;
3. allocations are applied: a job whose allocation changed to a non-empty
   one pays `restart_penalty` seconds without progress (`gpuq.sim.jobs`);
   `Decision.batch_sizes` sets the batch of non-adaptive jobs;
4. every running job advances by `interval` seconds, completing at the
   exact (interpolated) moment its last epoch ends.

Idle ticks before an arrival are skipped. The run ends when every job has
finished; it raises `SimulationError` on a malformed decision, or when no
job arrives or finishes for `stall_limit` seconds (30 days): a policy that
never runs some job, or moves it every tick with a penalty longer than the
tick, would otherwise loop forever.

Sharing, applied in step 4 (choices the papers leave to the simulator):

- Time-slicing: a node whose allocations exceed its GPUs runs its jobs
  round-robin, so each progresses at `gpus / demand` of its rate; a job
  spanning several nodes runs at the smallest share among them. In lab
  mode, jobs of several users on a node take its time by their owners'
  shares, as the daemon's time-slicer gives it (`gpuq.fairshare.turn_shares`). A
  `Decision.packed` group shares the same GPUs at once and counts once in
  the node's demand, with the group's largest allocation there.
- Packing: the tables measure exclusive GPUs only and give no utilization
  profile, so every job is taken to saturate its GPUs: `k` jobs packed
  together each hold `1/k` of the GPUs' time and run `packing_overhead`
  slower than that (Gandiva measured 11-16% losses packing GPU-saturating
  jobs, Table 1), so packing never beats time-slicing here.
- Interference (Pollux 3.7, off by default): a job spanning several nodes
  runs `interference` slower when any node it uses hosts another such job.

`JobView` fields: `gpus_requested` is the workload's GPU count (capped at
the cluster size), `batch_size` the batch a non-adaptive job runs with (its
user's, or the last one a policy set); `adaptive` is what the policy
declares (`capabilities.adaptive_jobs`: Pollux and gpuq) except for NCF,
which the artifact always runs at batch 32768. `max_gpus` is the cluster
size, further capped at `max_batch // min_local` (adaptive) or
`batch // min_local` (fixed batch: the artifact's Optimus cap) and at the
application's limit (NCF: one GPU), but never below the request.
`goodput` is the job's own fitted model, `remaining_iterations` the oracle
at `batch_size`. `gpu_utilization` and `memory_peak` are None: the tables
do not measure them.

GPU types: a `cluster` (`gpuq.sim.cluster`) gives each node a GPU type and
names the tables its jobs run on; without one, the cluster is `nodes` x
`gpus_per_node` T4 GPUs on the Pollux tables. Where the nodes have several
types, each `JobView` also carries the job's model per type (`per_type`:
measured or bootstrapped, `gpuq.sim.jobs`), the type it runs on and its
own restart cost; `goodput` is then the type-unaware model. A job's
restart costs its application's delay where the tables set one (Sia's),
else `restart_penalty`; finish-time fairness's isolated JCT is the mean of
the isolated JCTs on each type, weighted by the type's share of the GPUs.

Users (`gpuq.sim.fair`): where the workload's jobs name users, or a `lab`
is given, each `JobView` carries its user and the state the users' fair
share (`ClusterState.fair`), from the same accounting the daemon keeps in
lab mode: each tick charges every user the GPU-seconds its jobs held
(`JobRecord.gpu_time`'s increments), decayed with the lab's half-life.
`SimResult.user_ticks` records, per tick, each user's GPUs held and jobs
waiting. A workload without users runs exactly as before.

`seed` drives the optional `grad_noise`: the gradient variance the agent
and the policy see is multiplied by lognormal noise of that sigma, drawn
per job and epoch (progress always uses the true value).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuq.errors import GpuqError
from gpuq.fairshare import Fairness, FairShare, turn_shares
from gpuq.policies.interface import ClusterState, Decision, JobView, Policy, TypeModel
from gpuq.sim.apps import Application, get_application
from gpuq.sim.cluster import SimCluster, uniform_cluster
from gpuq.sim.fair import SimLab, UserTick
from gpuq.sim.jobs import FitMemo, SimJob, gpu_limit, noise_factors
from gpuq.sim.metrics import JobRecord, SimResult, isolated_jct
from gpuq.sim.workload import WorkloadJob


class SimulationError(GpuqError):
    """The simulation cannot go on: a malformed decision, or no job can ever run."""

    code = "simulation"


@dataclass(frozen=True, slots=True)
class SimProgress:
    """A snapshot for progress displays, passed to the `run` callback."""

    now: float
    finished: int
    active: int
    total: int


class Simulator:
    """A discrete-time simulation of one policy on one workload (module docstring)."""

    def __init__(
        self,
        policy: Policy,
        workload: Sequence[WorkloadJob],
        nodes: int = 16,
        gpus_per_node: int = 4,
        interval: float = 60.0,
        restart_penalty: float = 30.0,
        interference: float = 0.0,
        seed: int = 0,
        packing_overhead: float = 0.13,
        grad_noise: float = 0.0,
        progress_every: int = 60,
        stall_limit: float = 30 * 86400.0,
        cluster: SimCluster | None = None,
        lab: SimLab | None = None,
    ) -> None:
        if nodes < 1 or gpus_per_node < 1 or interval <= 0 or restart_penalty < 0:
            raise ValueError("need nodes, gpus_per_node >= 1, interval > 0, restart_penalty >= 0")
        if not 0 <= interference < 1 or not 0 <= packing_overhead < 1:
            raise ValueError("interference and packing_overhead must be in [0, 1)")
        self.policy = policy
        self.cluster = cluster if cluster is not None else uniform_cluster(nodes, gpus_per_node)
        self.nodes = self.cluster.nodes
        self.capacity = tuple(node.gpus for node in self.nodes)
        self.node_types = tuple(node.gpu_type for node in self.nodes)
        self.mixed = self.cluster.mixed
        self.interval = float(interval)
        self.restart_penalty = float(restart_penalty)
        self.interference = interference
        self.packing_overhead = packing_overhead
        self.progress_every = max(1, progress_every)
        self.stall_limit = stall_limit
        self.adaptive = policy.capabilities.adaptive_jobs
        rng = np.random.default_rng(seed)
        total = sum(self.capacity)
        ordered = sorted(workload, key=lambda job: job.time)
        fits = FitMemo()
        self.jobs = []
        for i, spec in enumerate(ordered):
            apps = self._applications(spec.application)
            first = next(iter(apps.values()))
            delay = first.restart_delay
            self.jobs.append(
                SimJob(
                    i,
                    spec,
                    first,
                    self.adaptive,
                    self.restart_penalty if delay is None else delay,
                    noise_factors(rng, grad_noise, first.max_epochs),
                    fits,
                    apps,
                )
            )
        self._max_gpus = [
            gpu_limit(job.app, job.adaptive, job.batch_size, job.spec.num_replicas, total)
            for job in self.jobs
        ]
        self._requested = [min(job.spec.num_replicas, total) for job in self.jobs]
        if lab is None and any(job.user for job in workload):
            lab = SimLab()
        self.lab = lab
        self.account: FairShare | None = None if lab is None else lab.accounting()
        self.user_ticks: list[UserTick] = []

    def _applications(self, name: str) -> dict[str, Application]:
        """The application's tables on each GPU type of the cluster, in node order."""
        tables = self.cluster.tables
        return {kind: get_application(name, kind, tables) for kind in self.cluster.gpu_types}

    # ---- the loop ---------------------------------------------------------------------

    def run(self, progress: Callable[[SimProgress], None] | None = None) -> SimResult:
        """Simulate until every job completes (once per `Simulator`).

        `progress` is called every `progress_every` ticks and at the end.
        """
        jobs = self.jobs
        pending = 0  # next job to admit
        active: list[SimJob] = []
        now = 0.0
        ticks = 0
        last_event = 0.0  # the last arrival or completion
        decision_times: list[float] = []
        active_counts: list[int] = []
        reallocations = 0
        while pending < len(jobs) or active:
            if not active and jobs[pending].spec.time > now:  # skip idle ticks
                first = math.ceil(jobs[pending].spec.time / self.interval)
                active_counts.extend([0] * (first - ticks))
                ticks = first
                now = ticks * self.interval
            while pending < len(jobs) and jobs[pending].spec.time <= now:
                active.append(jobs[pending])
                pending += 1
                last_event = now
            active_counts.append(len(active))
            if active:
                state = self._state(active)
                started = time.perf_counter()
                decision = self.policy.decide(state, now)
                decision_times.append(time.perf_counter() - started)
                reallocations += self._apply(decision, active)
                served = [job.attained_service for job in active]
                self._advance(decision, active, now, state.fair)
                if self.account is not None:
                    self._charge(self.account, active, served, now)
                if any(job.finish_time is not None for job in active):
                    last_event = now
                elif now - last_event > self.stall_limit:
                    raise self._stalled(active)
                active = [job for job in active if job.finish_time is None]
            ticks += 1
            now = ticks * self.interval
            if progress is not None and ticks % self.progress_every == 0:
                finished = pending - len(active)
                progress(SimProgress(now, finished, len(active), len(jobs)))
        if progress is not None:
            progress(SimProgress(now, len(jobs), 0, len(jobs)))
        return self._result(decision_times, active_counts, reallocations)

    def _stalled(self, active: list[SimJob]) -> SimulationError:
        """Why no job finished for `stall_limit`: the per-user cap, where jobs ask for more."""
        message = (
            f"policy {self.policy.name!r}: no job finished in "
            f"{self.stall_limit / 86400:g} days, with {len(active)} active"
        )
        cap = 0 if self.lab is None else self.lab.max_gpus
        over = [job for job in active if cap and self._requested[job.id] > cap]
        if over:
            most = max(over, key=lambda job: self._requested[job.id])
            return SimulationError(
                f"{message}; {len(over)} of them {'asks' if len(over) == 1 else 'ask'} for more "
                "GPUs than one user may hold "
                f"(--max-gpus-per-user {cap}), such as {most.spec.name!r} "
                f"({self._requested[most.id]} GPUs)",
                hint=f"raise --max-gpus-per-user to {self._requested[most.id]} or more, "
                "or leave it out",
            )
        return SimulationError(message, hint="check that every job's request fits the cluster")

    def _state(self, active: list[SimJob]) -> ClusterState:
        views = []
        for job in active:
            app = job.app
            views.append(
                JobView(
                    id=job.id,
                    submit_time=job.spec.time,
                    gpus_requested=self._requested[job.id],
                    batch_size=job.batch_size,
                    init_batch_size=app.init_batch_size,
                    max_batch_size=app.max_batch_size,
                    local_bsz_bounds=app.local_bsz_bounds,
                    adaptive=job.adaptive,
                    max_gpus=self._max_gpus[job.id],
                    name=job.spec.name,
                    application=app.name,
                    allocation=job.allocation,
                    attained_service=job.attained_service,
                    run_time=job.run_time,
                    num_restarts=job.num_restarts,
                    max_profiled_gpus=job.max_profiled_gpus,
                    epoch=job.epoch,
                    goodput=job.goodput(),
                    remaining_iterations=job.remaining_iterations(),
                    user=job.spec.user,
                    **self._typed(job),
                )
            )
        fair = None
        if self.lab is not None and self.account is not None:
            fair = self.lab.snapshot(self.account, {job.spec.user for job in active})
        return ClusterState(
            nodes=self.nodes,
            jobs=tuple(views),
            interval=self.interval,
            restart_penalty=self.restart_penalty,
            fair=fair,
        )

    def _charge(
        self, account: FairShare, active: list[SimJob], served: list[float], now: float
    ) -> None:
        """Charge each user the GPU-seconds its jobs held this tick; record the tick."""
        held: dict[str, float] = {}
        waiting: dict[str, int] = {}
        count: dict[str, int] = {}
        for job, before in zip(active, served, strict=True):
            user = job.spec.user
            held[user] = held.get(user, 0.0) + (job.attained_service - before) / self.interval
            count[user] = count.get(user, 0) + 1
            if not job.placement:
                waiting[user] = waiting.get(user, 0) + 1
        account.record_all(held, self.interval, now + self.interval)
        self.user_ticks.append(UserTick(now, held, waiting, count))

    def _typed(self, job: SimJob) -> dict[str, Any]:
        """A job's per-type fields of `JobView`, on a cluster of several GPU types."""
        if not self.mixed:
            return {}
        per_type = {
            kind: TypeModel(job.goodput_on(kind), app.local_bsz_bounds, kind in job.measured_types)
            for kind, app in job.apps.items()
        }
        return {
            "per_type": per_type,
            "gpu_type": job.gpu_type if job.start_time is not None else "",
            "restart_penalty": job.restart_penalty,
        }

    def _apply(self, decision: Decision, active: list[SimJob]) -> int:
        """Apply allocations and batch sizes; the number of restarts it causes."""
        by_id = {job.id: job for job in active}
        width = len(self.nodes)
        for job_id, allocation in decision.allocations.items():
            if job_id not in by_id:
                raise SimulationError(f"policy {self.policy.name!r} allocated unknown job {job_id}")
            if allocation and (len(allocation) != width or min(allocation) < 0):
                raise SimulationError(
                    f"policy {self.policy.name!r} gave job {job_id} a malformed "
                    f"allocation {allocation} for {width} nodes"
                )
        restarts = 0
        for job in active:
            before = job.num_restarts
            allocation = tuple(decision.allocations.get(job.id, ()))
            job.reallocate(allocation if any(allocation) else (), self.node_types)
            restarts += job.num_restarts - before
        for job_id, batch_size in decision.batch_sizes.items():
            if job_id in by_id:
                by_id[job_id].set_batch_size(int(batch_size))
        return restarts

    def _advance(
        self, decision: Decision, active: list[SimJob], now: float, fair: Fairness | None
    ) -> None:
        allocations = {job.id: job.allocation for job in active if job.placement}
        owners = {job.id: job.spec.user for job in active} if fair is not None else None
        factors = sharing(
            self.capacity,
            allocations,
            decision.packed,
            self.interference,
            self.packing_overhead,
            owners,
            fair,
        )
        for job in active:
            if job.id in factors:
                share, speed = factors[job.id]
                job.advance(now, self.interval, share, speed)

    def _result(
        self, decision_times: list[float], active_counts: list[int], reallocations: int
    ) -> SimResult:
        counts = np.asarray(active_counts, dtype=np.float64)
        total_gpus = sum(self.capacity)
        shares: dict[str, tuple[int, int]] = {}  # type: (GPUs, GPUs per node)
        for node in self.nodes:
            gpus, per_node = shares.get(node.gpu_type, (0, node.gpus))
            shares[node.gpu_type] = (gpus + node.gpus, max(per_node, node.gpus))
        records = []
        for job in self.jobs:
            finish = job.finish_time
            if finish is None:
                raise SimulationError(f"job {job.spec.name} did not finish")
            contention = _mean_over(counts, self.interval, job.spec.time, finish)
            records.append(
                JobRecord(
                    name=job.spec.name,
                    application=job.app.name,
                    submit=job.spec.time,
                    start=job.start_time if job.start_time is not None else finish,
                    finish=finish,
                    gpu_time=job.attained_service,
                    restarts=job.num_restarts,
                    user=job.spec.user,
                    isolated_jct=sum(
                        gpus
                        / total_gpus
                        * isolated_jct(
                            job.apps[kind],
                            self._requested[job.id],
                            job.spec.batch_size,
                            per_node,
                            total_gpus,
                            contention,
                            job.restart_penalty,
                        )
                        for kind, (gpus, per_node) in shares.items()
                    ),
                )
            )
        return SimResult(
            policy=self.policy.name,
            jobs=tuple(records),
            total_gpus=total_gpus,
            reallocations=reallocations,
            decision_times=tuple(decision_times),
            user_ticks=tuple(self.user_ticks),
        )


def _mean_over(counts: np.ndarray, interval: float, start: float, end: float) -> float:
    """Time-average of a per-tick series over `[start, end]` (at least 1)."""
    if end <= start:
        return max(1.0, float(counts[min(int(start // interval), len(counts) - 1)]))
    first = int(start // interval)
    last = min(int(end // interval), len(counts) - 1)
    edges = np.arange(first, last + 2, dtype=np.float64) * interval
    overlap = np.minimum(edges[1:], end) - np.maximum(edges[:-1], start)
    weights = np.clip(overlap, 0.0, None)
    values = counts[first : last + 1]
    return max(1.0, float(np.dot(values, weights) / weights.sum()))


def sharing(
    capacity: Sequence[int],
    allocations: Mapping[int, tuple[int, ...]],
    packed: Sequence[Sequence[int]],
    interference: float,
    packing_overhead: float,
    owners: Mapping[int, str] | None = None,
    fair: Fairness | None = None,
) -> dict[int, tuple[float, float]]:
    """`(share, speed)` of each allocated job: its time share and its slowdown factor.

    A job progresses at `share * speed` of its exclusive rate and holds its
    GPUs `share` of the time (module docstring: time-slicing, packing,
    interference). With `fair` (lab mode) and each job's user in `owners`,
    a node's turns follow the users' shares (`shared_turns`).
    """
    width = len(capacity)
    group_of: dict[int, int] = {}
    for index, group in enumerate(packed):
        members = [job_id for job_id in group if job_id in allocations]
        if len(members) > 1:
            group_of.update((job_id, index) for job_id in members)
    group_size = Counter(group_of.values())
    demand = [0] * width
    group_use: dict[int, list[int]] = {}
    for job_id, allocation in allocations.items():
        number = group_of.get(job_id)
        if number is None:
            demand = [d + a for d, a in zip(demand, allocation, strict=True)]
        else:
            use = group_use.get(number, [0] * width)
            group_use[number] = [max(u, a) for u, a in zip(use, allocation, strict=True)]
    for use in group_use.values():
        demand = [d + u for d, u in zip(demand, use, strict=True)]
    node_share = [min(1.0, c / d) if d else 1.0 for c, d in zip(capacity, demand, strict=True)]
    turns = None
    if fair is not None and owners is not None:
        busy = [c < d for c, d in zip(capacity, demand, strict=True)]  # the nodes with turns
        turns = shared_turns(capacity, busy, allocations, packed, group_of, group_use, owners, fair)
    spread = {job_id for job_id, a in allocations.items() if sum(1 for g in a if g) > 1}
    crowding = [0] * width
    for job_id in spread:
        crowding = [c + (a > 0) for c, a in zip(crowding, allocations[job_id], strict=True)]
    factors = {}
    for job_id, allocation in allocations.items():
        used = [i for i, a in enumerate(allocation) if a]
        number = group_of.get(job_id)
        if turns is None:
            share = min(node_share[i] for i in used)
        else:
            member = job_id if number is None else -1 - number
            share = min(turns[i].get(member, node_share[i]) for i in used)
        speed = 1.0
        if number is not None:
            share /= group_size[number]
            speed = 1.0 - packing_overhead
        if interference and job_id in spread and any(crowding[i] > 1 for i in used):
            speed *= 1.0 - interference
        factors[job_id] = (share, speed)
    return factors


def shared_turns(
    capacity: Sequence[int],
    busy: Sequence[bool],
    allocations: Mapping[int, tuple[int, ...]],
    packed: Sequence[Sequence[int]],
    group_of: Mapping[int, int],
    group_use: Mapping[int, list[int]],
    owners: Mapping[int, str],
    fair: Fairness,
) -> list[dict[int, float]]:
    """Per node, each member's part of its time by the lab's rule (`gpuq.fairshare.turn_shares`).

    The members are the jobs on the node, a packed group counting as one
    (key -1 - its index in `packed`) with its largest allocation there and
    its lowest job id's owner, as the daemon slices a group by one anchor.
    Only the `busy` nodes (over-subscribed) have turns; the others' are empty.
    """
    turns: list[dict[int, float]] = []
    for node, gpus in enumerate(capacity):
        if not busy[node]:
            turns.append({})
            continue
        members: dict[int, tuple[str, int]] = {}
        for job_id, allocation in allocations.items():
            if allocation[node] and job_id not in group_of:
                members[job_id] = (owners.get(job_id, ""), allocation[node])
        for number, use in group_use.items():
            if use[node]:
                anchor = min(j for j in packed[number] if group_of.get(j) == number)
                members[-1 - number] = (owners.get(anchor, ""), use[node])
        turns.append(turn_shares(gpus, members, fair) if members else {})
    return turns
