"""The board: one `gpuq` decision's cluster, GPU by GPU, as the classes are decided.

`Board.build` reads the caller's state once:

- GPUs one by one: the caller's (the daemon's), or each node's numbered
  (`gpuq.policies.fifo.numbered_gpus`: the simulator counts GPUs per node);
- who holds which GPUs: a memory-share job its GPUs; a whole-GPU job the
  GPUs it names, or, where it names none or shares them with another job
  (a node time-sliced last time: the simulator's allocations over-subscribe,
  the daemon's parked jobs keep the GPUs of the job computing), free GPUs of
  its node. Whole-GPU jobs that cannot wait their turn (`can_take_turns`)
  and multi-node jobs are placed first, then the others oldest first (submit
  time, id); a single-node job left without GPUs on its node is a **guest**
  of the time-sliced node: the rest of the decision sees it as waiting, with
  its node remembered (`guests`);
- a `Capacity` (`gpuq.policies.placement`) with every holder's GPUs held.

As each priority class is decided, the board releases the GPUs of the jobs
being decided or preempted and holds those the decision gives, so the next
class sees what is left. Pure and deterministic; the caller's state is
never changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpuq.policies.fifo import numbered_gpus
from gpuq.policies.interface import ClusterState, JobView
from gpuq.policies.placement import Capacity, Hold


def can_take_turns(job: JobView) -> bool:
    """True if the job can leave its GPUs for another's turn and come back.

    A checkpointing runner (`preemptible`), a job already waiting for its
    turn (`suspended`), or one whose memory is known (it can be stopped).
    """
    return job.preemptible or job.suspended or job.memory_peak is not None


@dataclass(slots=True)
class Board:
    """The cluster of one decision (module docstring)."""

    state: ClusterState
    capacity: Capacity
    jobs: dict[int, JobView]
    holds: dict[int, Hold]
    guests: dict[int, int]
    node_of: list[int]
    started: dict[int, float] = field(default_factory=dict)

    @classmethod
    def build(cls, state: ClusterState) -> Board:
        """The board of `state` (module docstring)."""
        listed = numbered_gpus(replace(state, jobs=())) if not state.gpus else state
        gpus = listed.gpus
        index = {gpu.uuid: i for i, gpu in enumerate(gpus)}
        node_index = {node.name: i for i, node in enumerate(state.nodes)}
        node_of = [node_index.get(gpu.node, 0) for gpu in gpus]
        whole_owner: list[int | None] = [None] * len(gpus)
        shared = [False] * len(gpus)
        holders: dict[int, tuple[int, ...]] = {}
        guests: dict[int, int] = {}
        for job in state.jobs:
            if job.gpu_mem is not None and job.gpu_uuids:
                held = tuple(index[u] for u in job.gpu_uuids if u in index)
                holders[job.id] = held
                for i in held:
                    shared[i] = True

        def free_on(node: int, count: int, prefer: tuple[int, ...]) -> list[int] | None:
            mine = [i for i in prefer if node_of[i] == node and whole_owner[i] is None]
            rest = [
                i
                for i in range(len(gpus))
                if node_of[i] == node and whole_owner[i] is None and not shared[i] and i not in mine
            ]
            chosen = (mine + rest)[:count]
            return chosen if len(chosen) == count else None

        wholes = [j for j in state.jobs if j.gpu_mem is None and (j.gpu_uuids or any(j.allocation))]
        wholes.sort(key=lambda j: (_single_node(j) and can_take_turns(j), j.submit_time, j.id))
        for job in wholes:
            own = tuple(index[u] for u in job.gpu_uuids if u in index)
            wanted = _allocation(job, own, node_of, len(state.nodes))
            if not any(wanted):
                continue  # names no GPU the board knows: it holds nothing here
            if own and len(own) == sum(wanted) and all(whole_owner[i] is None for i in own):
                chosen: list[int] | None = list(own)
            else:
                chosen = []
                for node, count in enumerate(wanted):
                    more = free_on(node, count, own) if count else []
                    if more is None:
                        chosen = None
                        break
                    chosen.extend(more)
            if chosen is None and _single_node(job) and can_take_turns(job):
                guests[job.id] = next(n for n, c in enumerate(wanted) if c)
                continue
            if chosen is None:  # cannot wait its turn: it holds what it names
                chosen = list(own)
            for i in chosen:
                whole_owner[i] = job.id
            holders[job.id] = tuple(sorted(chosen))
        uuids = [gpu.uuid for gpu in gpus]
        jobs: list[JobView] = []
        for job in state.jobs:
            if job.id in holders:
                held = holders[job.id]
                counts = [0] * len(state.nodes)
                for i in held:
                    counts[node_of[i]] += 1
                job = replace(
                    job,
                    allocation=tuple(counts),
                    gpu_uuids=tuple(uuids[i] for i in held),
                    start_time=job.start_time or job.submit_time,
                )
            elif job.gpu_uuids or any(job.allocation):
                job = replace(job, allocation=(), gpu_uuids=())
            jobs.append(job)
        model = replace(listed, jobs=tuple(jobs))
        board = cls(
            state=model,
            capacity=Capacity.from_state(model),
            jobs={job.id: job for job in jobs},
            holds={},
            guests=guests,
            node_of=node_of,
        )
        for job in jobs:
            if job.gpu_uuids:
                board.holds[job.id] = board.capacity.hold_of(job)
        return board

    def release(self, job_id: int) -> Hold | None:
        """Give back the GPUs `job_id` holds on the board (none: None)."""
        hold = self.holds.pop(job_id, None)
        if hold is not None:
            self.capacity.release(hold)
        return hold

    def hold(self, hold: Hold, now: float | None = None) -> None:
        """Book `hold` on the board; `now` marks a job the decision starts (for time limits)."""
        self.release(hold.job_id)
        self.holds[hold.job_id] = hold
        self.capacity.hold(hold)
        if now is not None:
            self.started[hold.job_id] = now

    def uuids(self, gpus: tuple[int, ...]) -> tuple[str, ...]:
        """The UUIDs of GPU indices."""
        return tuple(self.state.gpus[i].uuid for i in gpus)

    def allocation(self, gpus: tuple[int, ...]) -> tuple[int, ...]:
        """GPUs per node of a set of GPU indices."""
        counts = [0] * len(self.state.nodes)
        for i in gpus:
            counts[self.node_of[i]] += 1
        return tuple(counts)

    def whole_free(self, i: int) -> bool:
        """True if GPU `i` can be given whole now: no job on it, foreign memory within tolerance."""
        capacity = self.capacity
        return capacity.whole_ok[i] and not capacity.owners[i] and not capacity.sharers[i]

    def open_per_node(self) -> list[int]:
        """Whole GPUs free on each node now."""
        counts = [0] * len(self.state.nodes)
        for i in range(len(self.state.gpus)):
            if self.whole_free(i):
                counts[self.node_of[i]] += 1
        return counts

    def holds_view(self, job_id: int, gpus: tuple[int, ...]) -> JobView:
        """The job as holding `gpus`, for a fifo pass (start time: when the decision starts it)."""
        job = self.jobs[job_id]
        hold = self.holds.get(job_id)
        start = self.started.get(job_id, job.start_time or job.submit_time)
        return replace(
            job,
            gpu_uuids=self.uuids(gpus),
            allocation=self.allocation(gpus),
            gpu_mem=hold.gpu_mem if hold is not None else job.gpu_mem,
            start_time=start,
        )


def _single_node(job: JobView) -> bool:
    return sum(1 for count in job.allocation if count > 0) <= 1


def _allocation(
    job: JobView, own: tuple[int, ...], node_of: list[int], nodes: int
) -> tuple[int, ...]:
    """The GPUs per node a holder needs: its allocation, or the nodes of the GPUs it names."""
    if any(job.allocation) and len(job.allocation) == nodes:
        return job.allocation
    counts = [0] * nodes
    for i in own:
        counts[node_of[i]] += 1
    return tuple(counts)


__all__ = ["Board", "can_take_turns"]
