"""The `gpuq` policy's moves on one server: fifo's moves, made for the first job of a class.

Admission runs fifo's passes (`gpuq.policies.fifo`), and fifo plans its
moves with `gpuq.policies.consolidate`: memory-share jobs moved onto other
shared GPUs so that a job that does not fit gets a free GPU, or single-GPU
jobs moved out of a link group so that a multi-GPU job gets GPUs of one
PCIe switch or NVLink. The `gpuq` policy lets fifo plan them (`Moving`)
and takes them up on its board (`take_moves`): the moved job holds its new
GPUs for the rest of the decision, and its own class keeps it there, bound
to exactly those GPUs, with the move's reason ("frees GPU 0 for job 9").

Who may be moved, beyond consolidate's rules (a checkpointing runner, one
GPU, settled for `move_after` seconds, not packed): only a job of the
waiting job's priority or lower (a move costs the moved job a restart, so a
job is never moved for a lower class), never one started or already moved
by this decision, and at most one set of moves per decision, as in fifo.
Pure: steps of one decision on its `Board`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from gpuq.policies.consolidate import DEFAULT_SETTLE
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.gpuq.board import Board
from gpuq.policies.interface import ClusterState, Decision, JobView


@dataclass(frozen=True, slots=True)
class Moving:
    """The move step's settings: how long a job runs before it may be moved (`move_after`)."""

    settle: float = DEFAULT_SETTLE

    def __post_init__(self) -> None:
        if self.settle < 0:
            raise ValueError(f"move_after must be 0 or more seconds, not {self.settle}")


def admission(moving: Moving | None, board: Board) -> FifoBackfill:
    """Fifo for one admission pass: planning moves while allowed and none was made yet."""
    if moving is None or board.moved:
        return FifoBackfill(moves=False)
    return FifoBackfill(moves=True, move_after=moving.settle)


def pinned(view: JobView, board: Board, priority: int, fixed: Iterable[int]) -> JobView:
    """`view` as fifo must see it: a job that may not be moved now reads as not preemptible.

    `fixed` names jobs this pass shows other than they are (a resizable job
    at its minimum, an ask placed by an earlier pass).
    """
    job = board.jobs.get(view.id)
    may_move = (
        job is not None
        and job.priority <= priority
        and view.id not in board.started
        and view.id not in board.moved
        and view.id not in set(fixed)
    )
    return view if may_move or not view.preemptible else replace(view, preemptible=False)


def take_moves(board: Board, state: ClusterState, decision: Decision) -> list[int]:
    """Book on the board each move fifo's `decision` makes of `state`'s holders; the jobs moved."""
    moved: list[int] = []
    for view in state.jobs:
        target = decision.bindings.get(view.id)
        hold = board.holds.get(view.id)
        if not view.gpu_uuids or target is None or hold is None:
            continue
        if set(target) == set(view.gpu_uuids):
            continue
        index = board.capacity.index
        board.hold(replace(hold, gpus=tuple(sorted(index[uuid] for uuid in target))))
        board.moved[view.id] = decision.notes.get(view.id, "moved")
        moved.append(view.id)
    return moved


__all__ = ["Moving", "admission", "pinned", "take_moves"]
