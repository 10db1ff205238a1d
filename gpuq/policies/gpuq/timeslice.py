"""The `gpuq` policy's time-slicing step: a job that would wait behind its own class takes turns.

After a priority class is sized, its whole-GPU jobs still waiting become,
in queue order, guests of one node each, whose allocation they then
over-subscribe; the caller shares that node's GPUs in turns (the daemon's
slicer, `gpuq.daemon.scheduler.slicer`; the simulator runs each job of the
node at GPUs/demand of its speed). The step stops at the first job no node
takes, so no job takes turns ahead of an older one of its class that gets
none (a job that can never run is passed over). A node takes a guest when:

- its whole GPUs held by gpuq jobs are all held by single-node jobs of the
  guest's class that can wait their turn (`board.can_take_turns`): never a
  job of another priority, a multi-node job, or one that cannot leave its
  GPUs (memory-share GPUs are not part of it and do not count);
- at least one of them holds a GPU there, and the guest's size
  (its minimum, at least one GPU) fits in the node's GPUs held or free;
- the node's demand, guests included, stays within `oversubscription`
  times those GPUs (Gandiva's limit, 2 by default).

A guest goes back to the node it was sliced on before where that node
still takes it (no move), else to the node with the lowest demand per GPU
after it (then node order). A node that takes a guest keeps its free GPUs
for its turns: they are held for the guest, so no lower class lands
between jobs taking turns. A job with a placement constraint
(`JobView.nodes`) takes turns only on its nodes; one that a node would take
but none of its own does is passed over, not a stop. Pure: a step of one
decision on its `Board`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuq.policies.gpuq.board import Board, can_take_turns
from gpuq.policies.interface import JobView
from gpuq.policies.placement import Hold


@dataclass(slots=True)
class _Node:
    """A node as the slicing step sees it for one class."""

    index: int
    name: str
    members: list[int] = field(default_factory=list)
    held: int = 0
    idle: list[int] = field(default_factory=list)
    demand: int = 0
    blocked: bool = False

    def takes(self, size: int, limit: float) -> bool:
        gpus = self.held + len(self.idle)
        return (
            not self.blocked
            and self.held > 0
            and size <= gpus
            and self.demand + size <= limit * gpus + 1e-9
        )

    def load(self, size: int) -> float:
        return (self.demand + size) / (self.held + len(self.idle))


@dataclass(frozen=True, slots=True)
class Slicing:
    """The time-slicing step's settings: the over-subscription limit and the caller's quantum.

    `everyone`: every waiting whole-GPU job may take turns, not only those
    whose minimum does not fit (the policy's `timeslice="all"`).
    """

    oversubscription: float = 2.0
    quantum: float = 60.0
    everyone: bool = False

    def place(
        self,
        board: Board,
        allocations: dict[int, tuple[int, ...]],
        waiting: list[JobView],
        now: float,
    ) -> dict[int, str]:
        """Make guests of `waiting` (one class, queue order) where a node takes them; notes."""
        if not waiting:
            return {}
        priority = waiting[0].priority
        nodes = _nodes(board, priority)
        notes: dict[int, str] = {}
        for job in waiting:
            if (job.spread or 1) > 1:
                continue  # a multi-node job takes no turns: its parts start and stop together
            size = max(job.min_gpus, 1)
            taking = [node for node in nodes if node.takes(size, self.oversubscription)]
            if not taking:
                break  # no turns ahead of an older job of the class that gets none
            eligible = [node for node in taking if job.may_run_on(node.name)]
            if not eligible:
                continue  # its placement constraint, not its turn, keeps it out
            before = board.guests.get(job.id)
            same = [node for node in eligible if node.index == before]
            node = same[0] if same else min(eligible, key=lambda n: (n.load(size), n.index))
            if node.idle:
                board.hold(Hold(job.id, tuple(node.idle)), now)
                node.held += len(node.idle)
                node.idle = []
            allocation = [0] * len(board.state.nodes)
            allocation[node.index] = size
            allocations[job.id] = tuple(allocation)
            others = ", ".join(map(str, node.members))
            notes[job.id] = (
                f"time-sliced on {node.name} with job{'s' * (len(node.members) > 1)} {others}: "
                f"jobs of priority {priority} waiting for GPUs take turns "
                f"({self.quantum:g} s quanta)"
            )
            node.members.append(job.id)
            node.demand += size
        return notes


def _nodes(board: Board, priority: int) -> list[_Node]:
    """Each node's members of class `priority`, GPUs held and free, and demand (module)."""
    nodes = [_Node(i, node.name) for i, node in enumerate(board.state.nodes)]
    for job_id, hold in board.holds.items():
        if hold.gpu_mem is not None:
            continue  # a memory share: its GPUs are not time-sliced
        job = board.jobs[job_id]
        spans = {board.node_of[i] for i in hold.gpus}
        member = (
            hold.gpu_mem is None
            and len(spans) == 1
            and job.priority == priority
            and can_take_turns(job)
        )
        for index in spans:
            node = nodes[index]
            if not member:
                node.blocked = True
                continue
            node.members.append(job_id)
            node.held += len(hold.gpus)
            node.demand += len(hold.gpus)
    for i in range(len(board.state.gpus)):
        if board.whole_free(i):
            nodes[board.node_of[i]].idle.append(i)
    return nodes


__all__ = ["Slicing"]
