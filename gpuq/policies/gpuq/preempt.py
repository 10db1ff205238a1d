"""Priority preemption for the `gpuq` policy: room for a job that fits no other way.

A job of a higher priority class that admission cannot place (it does not
fit in what is free, and it is not merely behind another job's
reservation) takes room from running jobs of lower priority that the
caller can preempt without losing work (`JobView.preemptible`, not waiting
for a turn, not started or moved by this decision). Steps are tried in this order
until the job fits: shrink a job to its minimum (giving up the GPUs it holds
beyond, through a resize), then preempt a job whole; each kind lowest
priority first, then the most recently started, then the highest id. Steps
found unneeded once it fits are undone, so a job yields no more than the
asks need. A job with a placement constraint makes room only on its nodes.
Pure: computed on a copy of fifo's capacity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpuq.policies.gpuq.board import Board
from gpuq.policies.interface import ClusterState, JobView
from gpuq.policies.placement import Capacity, Hardware, Hold


def make_room(
    board: Board,
    priority: int,
    state: ClusterState,
    asks: list[JobView],
    placed: Mapping[int, tuple[str, ...]],
    among: frozenset[int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Lower-priority jobs to shrink or preempt so that waiting asks fit (module docstring).

    `state` is the class's last fifo state (holders, asks placed by an
    earlier pass among them, and asks) and `placed` every ask placed so
    far. `among` names the only jobs that may yield instead of the lower
    classes' (fair share's victims, `gpuq.policies.fairness.fair_victims`).
    Returns, per job changed, the GPUs it keeps (0: preempted) and the ask
    it yields to; the board is not changed.
    """
    views = {job.id: job for job in state.jobs}
    victims = sorted(
        (
            views[job_id]
            for job_id in board.holds
            if job_id in views
            and (board.jobs[job_id].priority < priority if among is None else job_id in among)
            and board.jobs[job_id].preemptible
            and not board.jobs[job_id].suspended
            and job_id not in board.started
            and job_id not in board.moved
        ),
        key=lambda job: (job.priority, -job.start_time, -job.id),
    )
    if not victims:
        return {}
    capacity = Capacity.from_state(state)
    for job in asks:
        if job.id in placed and not views[job.id].gpu_uuids:  # placed by the last pass
            gpus = tuple(capacity.index[u] for u in placed[job.id])
            capacity.hold(Hold(job.id, gpus, job.gpu_mem, job.exclusive))
    current = {victim.id: capacity.hold_of(victim) for victim in victims}
    steps: list[tuple[int, int]] = []  # (victim, GPUs it keeps) in the order tried
    for victim in victims:
        least = max(board.jobs[victim.id].min_gpus, 1)
        if victim.gpu_mem is None and len(current[victim.id].gpus) > least:
            steps.append((victim.id, least))
    steps.extend((victim.id, 0) for victim in victims)

    def apply(job_id: int, keep: int) -> Hold:
        before = current[job_id]
        capacity.release(before)
        current[job_id] = replace(before, gpus=before.gpus[:keep])
        capacity.hold(current[job_id])
        return before

    def undo(job_id: int, before: Hold) -> None:
        capacity.release(current[job_id])
        current[job_id] = before
        capacity.hold(before)

    hardware = Hardware(state)
    changed: dict[int, int] = {}  # victim -> the ask it yields to
    for job in asks:
        if job.id in placed or hardware.on(job.nodes).impossible_reason(
            job.gpus_requested, job.gpu_mem, job.spread
        ):
            continue

        def fits(job: JobView = job) -> tuple[int, ...] | None:
            return capacity.choose(
                job.gpus_requested, job.gpu_mem, job.exclusive, capacity.outside(job), job.spread
            )

        applied: list[tuple[int, Hold]] = []
        for victim_id, keep in steps:
            if fits() is not None:
                break
            if len(current[victim_id].gpus) > keep:
                applied.append((victim_id, apply(victim_id, keep)))
        if fits() is None:
            for victim_id, before in reversed(applied):
                undo(victim_id, before)
            continue
        needed: list[tuple[int, Hold]] = []
        for index in range(len(applied) - 1, -1, -1):  # undo what was not needed
            victim_id, before = applied[index]
            if any(v == victim_id for v, _ in needed):
                needed.append((victim_id, before))
                continue
            after = current[victim_id]
            undo(victim_id, before)
            if fits() is None:
                capacity.release(before)
                current[victim_id] = after
                capacity.hold(after)
                needed.append((victim_id, before))
        room = fits()
        if room is None:  # cannot happen: it fitted with these steps
            continue
        capacity.hold(Hold(job.id, room, job.gpu_mem, job.exclusive))
        for victim_id, _ in needed:
            changed[victim_id] = job.id
    return {v: (len(current[v].gpus), ask) for v, ask in changed.items()}


__all__ = ["make_room"]
