"""FIFO with EASY backfill: the `fifo` policy.

Rules, each tested in `tests/test_policy_fifo.py`:

Order
    Pending jobs are considered by priority (highest first), then submit time
    (oldest first), then id (lowest first).

Fair share (`ClusterState.fair`, lab mode; `gpuq.policies.fairness`)
    Within a priority, jobs of several users go by effective priority (the
    owner's fair-share factor plus aging) before submit time. A job whose
    owner is at a per-user limit (`max_gpus`, `max_running`), counting the
    jobs running and those this pass starts, waits with that reason ("user
    alice at max_gpus 8 (holds 8)") and takes no reservation.

Capacity (see `gpuq.policies.placement`)
    A GPU held by a whole-GPU or exclusive job is fully taken. A shared GPU
    offers `memory_total * (1 - memory_margin) - memory_foreign - shares`.

Requests
    - Whole GPUs (`gpu_mem` None, exclusive or not): `gpus_requested` GPUs no
      gpuq job holds, each with foreign memory at most `foreign_tolerance`;
      placed on as few nodes as possible (the fullest node that fits, then GPU
      order).
    - Shared (`gpu_mem` set): `gpus_requested` distinct GPUs not taken by a
      whole-GPU or exclusive job, each with at least `gpu_mem` free; placed
      best-fit (least memory left that still fits, ties by GPU order) to leave
      big holes for big jobs.
    - Exclusive with `gpu_mem`: the job takes its GPUs alone (no gpuq job may
      be there or join it) but only needs `gpu_mem` beside the foreign memory;
      foreign tolerance does not apply.
    - CPU-only jobs never reach a policy: they hold nothing it allocates,
      and the daemon starts them as soon as they are ready.
    - A request the hardware can never hold (more GPUs than exist, more memory
      than any GPU offers after the margin) waits with a reason such as
      "needs 4 GPUs; this server has 2". Foreign memory never makes a job
      impossible, only waiting, since other users' processes come and go.

Decision
    Running jobs keep their GPUs (fifo never suspends or resizes a job), but
    for moves. Every job placed gets its allocation per node and, in
    `bindings`, the exact GPUs chosen: the capacity rules decide them, so
    the caller must not rebind them. A multi-GPU job's GPUs come from one
    link group (PCIe switch or NVLink) where one has room.

Moves (`gpuq.policies.consolidate`; option `moves`, on by default)
    The first job of the queue that does not fit (the head, before its
    reservation) may get room by moving memory-share jobs onto other shared
    GPUs until GPUs it needs are empty; a multi-GPU whole-GPU job that would
    span link groups, while nobody waits ahead of it, may get GPUs of one
    group by moving single-GPU jobs out of it. Only a job the caller can
    checkpoint (`preemptible`) that has run `move_after` seconds since it
    started or was last moved is moved, on its node, all or nothing, at most
    one such set of moves per decision. A moved job keeps running in the
    decision on its new GPUs (its binding), with the reason as its note
    ("frees GPU 0 for job 9"), and the waiting job is placed on the GPUs
    freed: the caller starts it once the moved jobs have left them.

Backfill (EASY)
    Walking the order, the first job that does not fit (impossible ones
    excepted) is the head. Its shadow time is the earliest time it fits if
    every running job, including those started in this pass, ends at
    `start_time + time_limit`; jobs without a time limit never end for this
    purpose. The GPUs it would get then are reserved for it. If no such time
    exists there is no reservation and every later job that fits starts.
    Otherwise a later job starts if it fits and either has a time limit with
    `now + time_limit <= shadow time` (it may use any GPU) or fits on GPUs not
    reserved for the head. Only the head gets a reservation, so jobs further
    back may be passed over indefinitely by smaller ones, as in EASY.

Placement constraints
    A job with a constraint (`JobView.nodes`) is placed, moved for and
    reserved for on the GPUs of its nodes only, by the rules above; its
    waiting reason counts only those GPUs ("waiting for 1 free GPU on gpu2
    (0 free)" while other nodes have free ones), and a request its nodes
    can never hold says so ("needs 4 GPUs; gpu2 has 2").

Waiting reasons
    Every pending job not started gets a short reason: what it waits for
    ("waiting for 2 free GPUs (0 free)", "waiting for 6.0G on a shared GPU
    (largest free 3.5G)"), "behind job 12 (reserved GPUs)" when it fits only
    on the head's GPUs, or why it can never run.

GPUs one by one
    Where the caller lists no GPUs (the simulator counts them per node),
    each node's GPUs are numbered (`node/0`, `node/1`, ...) with the state's
    `gpu_memory` each, and a running job holds the first free ones of its
    allocation: whole GPUs of one node are interchangeable there, so the
    rules above decide exactly as they would on named GPUs.

Cost
    Jobs of the same shape share one cached outcome and reason string until
    the next placement, and a request that does not fit is rejected in
    constant time from sorted free amounts, so a pass costs about
    O(jobs log jobs + placements x GPUs log GPUs). Looking for moves costs
    about O(GPUs^2 + running jobs) more, for the head of the queue and for
    each multi-GPU job placed across link groups before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter

from gpuq.policies import consolidate
from gpuq.policies.confine import node_names
from gpuq.policies.fairness import UserBook, ranks
from gpuq.policies.interface import Capabilities, ClusterState, Decision, GpuView, JobView
from gpuq.policies.placement import Capacity, Hardware, Hold

_Shape = tuple[int, int | None, bool, frozenset[str] | None, int | None]


@dataclass(frozen=True, slots=True)
class Reservation:
    """The head job's promised GPUs (indices into `state.gpus`) and when they free up."""

    job_id: int
    shadow_time: float
    gpus: frozenset[int]


def queue_order(
    pending: Sequence[JobView], ranks: Mapping[int, float] | None = None
) -> list[JobView]:
    """Pending jobs in scheduling order: priority desc, submit time asc, id asc.

    With `ranks` (fair share: `gpuq.policies.fairness.ranks`), a job's rank
    (highest first) comes between its priority and its submit time.
    """
    # Three stable single-key sorts are about three times faster than one tuple key.
    ordered = sorted(pending, key=attrgetter("id"))
    ordered.sort(key=attrgetter("submit_time"))
    if ranks:
        ordered.sort(key=lambda job: ranks.get(job.id, 0.0), reverse=True)
    ordered.sort(key=attrgetter("priority"), reverse=True)
    return ordered


def find_reservation(
    capacity: Capacity,
    head: JobView,
    endings: list[tuple[float, int, Hold]],
    now: float,
) -> Reservation | None:
    """The earliest time and GPUs at which `head` fits as jobs end, if any.

    `endings` lists `(end time, job id, hold)` of every job with a time limit;
    they are released in that order on a copy of `capacity`.
    """
    simulated = capacity.copy()
    outside = capacity.outside(head)
    for end, _, hold in sorted(endings, key=lambda ending: (ending[0], ending[1])):
        simulated.release(hold)
        gpus = simulated.choose(
            head.gpus_requested, head.gpu_mem, head.exclusive, outside, head.spread
        )
        if gpus is not None:
            return Reservation(head.id, max(end, now), frozenset(gpus))
    return None


_UNKNOWN_GPU_MEMORY = 1 << 40
"""Memory of a numbered GPU when the state does not know it: every share fits."""


def numbered_gpus(state: ClusterState) -> ClusterState:
    """`state` with its GPUs listed one by one, where the caller gave only counts.

    Each node's GPUs become `NAME/INDEX`, and each running job without GPU
    names holds the first free ones of its allocation (module docstring).
    A state that lists its GPUs is returned as it is.
    """
    if state.gpus:
        return state
    memory = state.gpu_memory or _UNKNOWN_GPU_MEMORY
    free: list[list[str]] = []
    gpus: list[GpuView] = []
    for node in state.nodes:
        names = [f"{node.name}/{i}" for i in range(max(node.gpus, 0))]
        gpus.extend(GpuView(uuid, node.name, memory) for uuid in names)
        free.append(names)
    jobs: list[JobView] = []
    for job in state.jobs:
        if job.allocation and not job.gpu_uuids:
            held: list[str] = []
            for node_free, count in zip(free, job.allocation, strict=False):
                held.extend(node_free[:count])
                del node_free[:count]
            job = replace(job, gpu_uuids=tuple(held), start_time=job.start_time or job.submit_time)
        jobs.append(job)
    return replace(state, gpus=tuple(gpus), jobs=tuple(jobs))


class FifoBackfill:
    """First come, first served by priority, with EASY backfill (module docstring).

    `moves` lets it move running jobs to make room for the head of the
    queue or to keep a multi-GPU job within one link group; `move_after` is
    how long (seconds) a job runs before it may be moved, again or at all.
    """

    name: str = "fifo"

    def __init__(self, moves: bool = True, move_after: float = consolidate.DEFAULT_SETTLE) -> None:
        if move_after < 0:
            raise ValueError(f"move_after must be 0 or more seconds, not {move_after}")
        self.moves = moves
        self.move_after = float(move_after)
        self.capabilities = Capabilities(preemption=moves, multi_node=True, fair_share=True)

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Start what fits in queue order, backfilling around the head's reservation."""
        settle = self.move_after if self.moves else None
        return _Pass(numbered_gpus(state), now, settle).run()


class _Pass:
    """One walk of the queue, with caches that hold until the next placement.

    `settle` is `move_after` where moves are allowed, None where they are not.
    """

    def __init__(self, state: ClusterState, now: float, settle: float | None = None) -> None:
        self.state = state
        self.now = now
        self.settle = settle
        self.moved: tuple[consolidate.Move, ...] = ()
        self.capacity = Capacity.from_state(state)
        self.hardware = Hardware(state)
        self.endings: list[tuple[float, int, Hold]] = [
            (job.start_time + job.time_limit, job.id, self.capacity.hold_of(job))
            for job in state.jobs
            if job.gpu_uuids and job.time_limit is not None
        ]
        node_of = {node.name: i for i, node in enumerate(state.nodes)}
        self.node_index = [node_of.get(gpu.node, 0) for gpu in state.gpus]
        self.single_node = len(state.nodes) <= 1
        self.head: JobView | None = None
        self.reservation: Reservation | None = None
        self.behind = ""
        # Both caches rely on capacity only shrinking between placements.
        self.reasons: dict[tuple[_Shape, bool], str] = {}
        self.thresholds: dict[tuple[int, bool, bool, frozenset[str] | None], tuple[int, int]] = {}
        self.ranks = ranks(state, now)
        self.users = UserBook.of(state)

    def allocation(self, gpus: Sequence[int]) -> tuple[int, ...]:
        """GPUs per node of a set of GPU indices."""
        counts = [0] * len(self.state.nodes)
        for i in gpus:
            counts[self.node_index[i]] += 1
        return tuple(counts)

    def run(self) -> Decision:
        """Walk the queue once and return the decision."""
        allocations: dict[int, tuple[int, ...]] = {}
        bindings: dict[int, tuple[str, ...]] = {}
        waiting: dict[int, str] = {}
        uuids = tuple(gpu.uuid for gpu in self.state.gpus)
        index = self.capacity.index
        pending: list[JobView] = []
        for job in self.state.jobs:
            if job.gpu_uuids:  # running: keeps its GPUs (unless moved below)
                held = [index[uuid] for uuid in job.gpu_uuids if uuid in index]
                allocations[job.id] = self.allocation(held)
                bindings[job.id] = job.gpu_uuids
            else:
                pending.append(job)
        users = self.users
        for job in queue_order(pending, self.ranks):
            if job.gpus_requested <= 0:
                waiting[job.id] = "asks for no GPU: the caller starts it"
                continue
            limited = None if users is None else users.reason(job, job.gpus_requested)
            if limited is not None:
                waiting[job.id] = limited
                continue
            never = self.hardware.on(job.nodes).impossible_reason(
                job.gpus_requested, job.gpu_mem, job.spread
            )
            if never is not None:
                waiting[job.id] = never
                continue
            reservation = self.reservation
            restricted = reservation is not None and (
                job.time_limit is None or self.now + job.time_limit > reservation.shadow_time
            )
            key = (
                (job.gpus_requested, job.gpu_mem, job.exclusive, job.nodes, job.spread),
                restricted,
            )
            reason = self.reasons.get(key)
            if reason is None:
                outcome = self._try(job, restricted)
                if not isinstance(outcome, str):
                    allocations[job.id] = self.allocation(outcome)
                    bindings[job.id] = tuple(uuids[i] for i in outcome)
                    if users is not None:
                        users.hold(job.user, len(outcome))
                    continue
                reason = self.reasons[key] = outcome
            waiting[job.id] = reason
        for move in self.moved:
            allocations[move.job_id] = self.allocation(move.target)
            bindings[move.job_id] = tuple(uuids[i] for i in move.target)
            waiting[move.job_id] = move.note
        return Decision(allocations=allocations, bindings=bindings, notes=waiting)

    def _try(self, job: JobView, restricted: bool) -> tuple[int, ...] | str:
        """Place `job` and book its GPUs, or say why it waits."""
        reservation = self.reservation if restricted else None
        outside = self.capacity.outside(job)  # other nodes' GPUs, for a constrained job
        if job.gpu_mem is not None and (job.spread is None or self.single_node):
            # Shares of any size: decide by threshold, without looking at each GPU.
            limit_key = (job.gpus_requested, job.exclusive, restricted, job.nodes)
            limits = self.thresholds.get(limit_key)
            if limits is None:
                anywhere = self.capacity.summary(outside).threshold(
                    job.gpus_requested, job.exclusive
                )
                here = anywhere
                if reservation is not None:
                    here = self.capacity.summary(reservation.gpus | outside).threshold(
                        job.gpus_requested, job.exclusive
                    )
                limits = self.thresholds[limit_key] = (here, anywhere)
            if job.gpu_mem > limits[0]:
                if job.gpu_mem <= limits[1]:
                    return self.behind
                room = self._make_room(job)
                return self._waiting(job) if room is None else self._book(job, room)
        excluded = reservation.gpus | outside if reservation is not None else outside
        shape = job.gpus_requested, job.gpu_mem, job.exclusive
        gpus = self.capacity.choose(*shape, excluded, job.spread)
        if gpus is None:
            if job.spread is None or self.single_node:
                fits = self.capacity.summary(outside).fits(*shape)
            else:
                fits = excluded != outside and bool(
                    self.capacity.choose(*shape, outside, job.spread)
                )
            if fits:
                return self.behind
            room = self._make_room(job) if job.spread in (None, 1) else None
            return self._waiting(job) if room is None else self._book(job, room)
        if self._may_move() and job.gpus_requested > 1 and job.spread in (None, 1):
            plan = consolidate.gather(
                self.state, self.capacity, job, gpus, self.now, self.settle or 0.0
            )
            if plan is not None:
                gpus = self._moved(plan)
        return self._book(job, gpus)

    def _may_move(self) -> bool:
        """True while this pass may still plan moves: allowed, none yet, nobody waiting ahead."""
        return self.settle is not None and not self.moved and self.head is None

    def _make_room(self, job: JobView) -> tuple[int, ...] | None:
        """GPUs for the head `job` once share jobs are moved out of its way, if moves can."""
        if not self._may_move():
            return None
        plan = consolidate.free_gpus(self.state, self.capacity, job, self.now, self.settle or 0.0)
        return None if plan is None else self._moved(plan)

    def _moved(self, plan: consolidate.MovePlan) -> tuple[int, ...]:
        """Take up a plan's moves: capacity, backfill endings; returns the waiting job's GPUs."""
        self.capacity = plan.capacity
        self.moved = plan.moves
        targets = {move.job_id: move.target for move in plan.moves}
        self.endings = [
            (end, job_id, replace(hold, gpus=targets[job_id]) if job_id in targets else hold)
            for end, job_id, hold in self.endings
        ]
        self.reasons.clear()
        self.thresholds.clear()
        return plan.gpus

    def _parts_reason(self, job: JobView, where: str) -> str:
        """What a multi-node job waits for: a part's GPUs free on each of its servers."""
        spread = job.spread or 1
        per_node = job.gpus_requested // spread
        free = {n: len(g) for n, g in self.capacity.free_whole(self.capacity.outside(job)).items()}
        have = ", ".join(f"{name} {free.get(name, 0)}" for name in self._node_names(job))
        on = f" of {where}" if where else ""
        gpus = "free GPU" if per_node == 1 else "free GPUs"
        servers = "one server" if spread == 1 else f"each of {spread} servers"
        return f"waiting for {per_node} {gpus} on {servers}{on} (free: {have})"

    def _node_names(self, job: JobView) -> list[str]:
        """The nodes `job` may use, in the state's order."""
        return [node.name for node in self.state.nodes if job.may_run_on(node.name)]

    def _book(self, job: JobView, gpus: tuple[int, ...]) -> tuple[int, ...]:
        """Hold `gpus` for `job` in the capacity; returns them."""
        hold = Hold(job.id, gpus, job.gpu_mem, job.exclusive)
        self.capacity.hold(hold)
        self.reasons.clear()
        self.thresholds.clear()
        if job.time_limit is not None:
            self.endings.append((self.now + job.time_limit, job.id, hold))
        return gpus

    def _waiting(self, job: JobView) -> str:
        """What `job` waits for; the first job to wait becomes the head."""
        summary = self.capacity.summary(self.capacity.outside(job))
        where = "" if job.nodes is None else node_names(job.nodes)
        reason = summary.wait_reason(job.gpus_requested, job.gpu_mem, job.exclusive, where)
        spread = job.spread or 0
        if spread > 1 or (spread == 1 and job.gpus_requested > 1 and not self.single_node):
            reason = self._parts_reason(job, where)
        if self.head is None:
            self.head = job
            self.reservation = find_reservation(self.capacity, job, self.endings, self.now)
            self.behind = f"behind job {job.id} (reserved GPUs)"
        return reason
