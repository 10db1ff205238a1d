"""Room on a time-sliced node's GPUs: how each job can wait for its turn, and where it fits.

The slicer (`gpuq.daemon.scheduler.slicer`) decides whose turn it is; these
pure functions say what memory allows: whether a job leaving its GPUs can
park (its CUDA context stays), be stopped (all of its memory stays) or must
be checkpointed (nothing stays), whether the next job fits beside the jobs
that wait or exit on the same GPUs, and which free GPUs a job holding none
can take. Memory a job has not reported counts as none, as the fake GPUs
of tests have none to report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuq.policies.interface import JobView

PARK_RESIDENT_BYTES = 512 * 1024**2
"""GPU memory a parked runner job keeps (its CUDA context) where nothing better is known."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """How one job can wait for its turn, as the caller knows it.

    `modes`: the ways it can leave its GPUs ("park", "checkpoint", "stop");
    `needs`: bytes per GPU it uses while computing (None: unknown);
    `leaving`: a suspend of it is under way (it is neither computing nor waiting yet);
    `saved`: it is leaving by checkpoint, and the checkpoint is saved: it computes no
    more, and only its process's exit holds its GPUs (and its memory, `needs`);
    `resumable`: False for a job its user suspended, which only its user resumes.
    """

    modes: frozenset[str] = frozenset()
    needs: int | None = None
    leaving: bool = False
    resumable: bool = True
    saved: bool = False

    def resident(self, mode: str) -> int:
        """Bytes per GPU the job keeps while it waits in `mode` (park or stop)."""
        if mode == "park":
            return PARK_RESIDENT_BYTES
        return self.needs or 0

    @property
    def exiting(self) -> int:
        """Bytes per GPU a saved job keeps until its process has exited (a context if unknown)."""
        return PARK_RESIDENT_BYTES if self.needs is None else self.needs


@dataclass(slots=True)
class SlicedNode:
    """One sliced node's pass: its GPUs, members, and what is claimed.

    `over` is False for a node no longer over-subscribed whose jobs still
    wait from their last turns: they are brought back first.
    """

    index: int
    gpus: tuple[str, ...]
    usable: dict[str, int]
    members: list[JobView]
    size: dict[int, int]
    over: bool = True
    claimed: dict[str, int] = field(default_factory=dict)


def info(waiting: Mapping[int, Waiting], job_id: int) -> Waiting:
    """What the caller said of the job (nothing: it cannot wait in any way)."""
    return waiting.get(job_id, Waiting())


def computing(job: JobView, waiting: Mapping[int, Waiting]) -> bool:
    """True if the job computes now: it holds GPUs, is not suspended and is not leaving."""
    return bool(job.gpu_uuids) and not job.suspended and not info(waiting, job.id).leaving


def saved(job: JobView, waiting: Mapping[int, Waiting]) -> bool:
    """True for a job whose checkpoint is saved and whose process is exiting."""
    return bool(job.gpu_uuids) and info(waiting, job.id).saved


def kept(job: JobView, waiting: Mapping[int, Waiting]) -> bool:
    """True for a job whose memory stays on its GPUs while others compute there."""
    return bool(job.gpu_uuids) and (job.suspended or info(waiting, job.id).saved)


def resident(job: JobView, waiting: Mapping[int, Waiting]) -> int:
    """Bytes per GPU a waiting job keeps: a parked runner's context, a stopped job's all.

    A saved job keeps all of its memory until its process has exited.
    """
    known = info(waiting, job.id)
    if known.saved:
        return known.exiting
    return known.resident("park" if "park" in known.modes else "stop")


def sharing(node: SlicedNode, job: JobView, waiting: Mapping[int, Waiting]) -> list[JobView]:
    """The other jobs that hold any of the job's GPUs (those only exiting aside)."""
    return [
        m
        for m in node.members
        if m.id != job.id and set(m.gpu_uuids) & set(job.gpu_uuids) and not saved(m, waiting)
    ]


def alone(node: SlicedNode, job_id: int) -> bool:
    """True if the job holds GPUs no other job waits on (a move there makes no crowd)."""
    holder = next((m for m in node.members if m.id == job_id), None)
    if holder is None or not holder.gpu_uuids:
        return False
    return not any(
        m.id != job_id and set(m.gpu_uuids) & set(holder.gpu_uuids) for m in node.members
    )


def fits_on(
    node: SlicedNode, job: JobView, uuids: tuple[str, ...], waiting: Mapping[int, Waiting]
) -> bool:
    """True if the job's memory fits on `uuids` beside what the node's other jobs keep there."""
    needs = info(waiting, job.id).needs or 0
    for uuid in uuids:
        others = sum(
            resident(m, waiting) for m in node.members if m.id != job.id and uuid in m.gpu_uuids
        )
        if others + needs > node.usable.get(uuid, 0):
            return False
    return True


def fits_beside_exiting(node: SlicedNode, job: JobView, waiting: Mapping[int, Waiting]) -> bool:
    """True unless a saved job still exiting on the job's GPUs leaves it too little memory."""
    needs = info(waiting, job.id).needs or 0
    for uuid in job.gpu_uuids:
        on_gpu = [m for m in node.members if m.id != job.id and uuid in m.gpu_uuids]
        if not any(saved(m, waiting) for m in on_gpu):
            continue
        held = sum(resident(m, waiting) for m in on_gpu if kept(m, waiting))
        if held + needs > node.usable.get(uuid, 0):
            return False
    return True


def place(node: SlicedNode, job: JobView, waiting: Mapping[int, Waiting]) -> tuple[str, ...] | None:
    """Unclaimed GPUs for a job holding none: idle ones first, then the least crowded."""
    size = node.size[job.id]
    pinned: dict[str, int] = {}
    held: dict[str, int] = {}
    for other in node.members:
        if other.id == job.id:
            continue
        for uuid in other.gpu_uuids:
            if not info(waiting, other.id).saved:
                pinned[uuid] = pinned.get(uuid, 0) + 1
            held[uuid] = held.get(uuid, 0) + resident(other, waiting)
    needs = info(waiting, job.id).needs or 0
    candidates = [
        u
        for u in node.gpus
        if u not in node.claimed and held.get(u, 0) + needs <= node.usable.get(u, 0)
    ]
    candidates.sort(key=lambda u: (pinned.get(u, 0), node.gpus.index(u)))
    if len(candidates) < size:
        return None
    return tuple(candidates[:size])


def wait_mode(
    node: SlicedNode,
    job: JobView,
    after: list[int],
    waiting: Mapping[int, Waiting],
    move: bool,
) -> str:
    """Park, stop or checkpoint: how a job leaving its GPUs for `after`'s turn waits.

    Checkpoint when it should `move`; else park, or stop, when what it keeps
    fits beside the largest job coming and what others keep there.
    """
    known = info(waiting, job.id)
    if move and "checkpoint" in known.modes:
        return "checkpoint"
    incoming = max((info(waiting, j).needs or 0 for j in after), default=0)
    others = [m for m in node.members if m.id != job.id and kept(m, waiting)]
    for mode in ("park", "stop"):
        if mode not in known.modes or (mode == "stop" and known.needs is None):
            continue
        fits = True
        for uuid in job.gpu_uuids:
            held = sum(resident(m, waiting) for m in others if uuid in m.gpu_uuids)
            if held + known.resident(mode) + incoming > node.usable.get(uuid, 0):
                fits = False
        if fits:
            return mode
    return "checkpoint"


def can_leave(node: SlicedNode, job: JobView, waiting: Mapping[int, Waiting]) -> bool:
    """True if the job can leave its GPUs for a turn in some mode.

    A stop keeps all of the job's memory: it must fit beside the largest
    job of the node and what waiting jobs keep on the same GPUs.
    """
    known = info(waiting, job.id)
    if known.modes & {"park", "checkpoint"}:
        return True
    if "stop" not in known.modes or known.needs is None:
        return False
    others = [m for m in node.members if m.id != job.id]
    incoming = max((info(waiting, m.id).needs or 0 for m in others), default=0)
    for uuid in job.gpu_uuids:
        held = sum(resident(m, waiting) for m in others if kept(m, waiting) and uuid in m.gpu_uuids)
        if held + known.needs + incoming > node.usable.get(uuid, 0):
            return False
    return True
