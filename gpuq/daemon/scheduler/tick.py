"""The tick: one scheduler pass, run by the server whenever something changed.

It runs explicit, ordered steps on the event loop: finish or undo the moves
under way (`moves.settle`: a moved job restarts on the GPUs booked for it),
decide which pending jobs are ready (`readiness`), cancel those whose
dependencies can never be met, hold back those none of whose nodes is up
(`constraints`: placement constraints), build the policy's state (`view`,
with each job's nodes, each moving job on its new GPUs and what the daemon
measured: `introspect`; in lab mode each job's owner and the users' fair
share, usage charged up to now: `usage`),
call the policy in a worker thread with a
deadline (`DECIDE_DEADLINE`), share the GPUs it over-subscribes in turns
(`slicer`, time-slicing policies only), carry out its packs and unpacks
(`packing`), its preemptions and turns
(`actuator`), bind its decision to GPUs (`binding`), and start what it
placed (none on GPUs a moving job has not left yet), in slices with yields
between them.

The decision runs off the event loop so a slow policy never delays a
client's request (the state is an immutable snapshot). A decision still
running at the deadline is not waited for: the pass ends without acting,
every job it would have placed says so, and no new decision starts until
that one returns (its result is dropped: it is about an old state).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from gpuq.daemon import lifecycle, suspend
from gpuq.daemon.scheduler import actuator, introspect, memory, moves, packing, typed, usage
from gpuq.daemon.scheduler.binding import RELEASE_WAIT, Placement, placements
from gpuq.daemon.scheduler.constraints import Constraints, known_nodes
from gpuq.daemon.scheduler.readiness import readiness
from gpuq.daemon.scheduler.view import build_state
from gpuq.daemon.state import DaemonState, GpuSnapshot
from gpuq.models import Job, JobState
from gpuq.policies.actions import plan
from gpuq.policies.interface import ClusterState, Decision

log = logging.getLogger("gpuq.daemon")

START_BUDGET_SECONDS = 0.005
"""Longest stretch a pass spends starting jobs before it lets the event loop serve others."""
DECIDE_DEADLINE = 30.0
"""Seconds a pass waits for the policy's decision before it gives up on it (docstring)."""


async def decide(state: DaemonState, cluster: ClusterState, now: float) -> Decision | str:
    """The policy's decision, made in a worker thread; a reason instead if it is late."""
    late = state.decision_in_flight
    if late is not None and not late.done():
        return "the policy is still deciding (slow decision); waiting for it"
    task = asyncio.ensure_future(asyncio.to_thread(state.policy.decide, cluster, now))
    state.decision_in_flight = task
    state.decision_times.time(task, state.policy.name)
    try:
        return await asyncio.wait_for(asyncio.shield(task), DECIDE_DEADLINE)
    except TimeoutError:
        log.warning("policy %s took over %gs to decide", state.policy.name, DECIDE_DEADLINE)
        task.add_done_callback(lambda _: state.wake.set())  # then decide again, afresh
        return f"the policy did not decide within {DECIDE_DEADLINE:g}s; waiting for it"


def sizing(cluster: ClusterState, decision: Decision) -> dict[int, str]:
    """Why each running adaptive job has its GPUs: the policy's note for it, where it gave one.

    `gpuq show` prints it ("Sizing:"): a job of `--gpus 1-4` on one GPU of an
    idle server says what holds it there, which its history's start reason
    said only once.
    """
    return {
        job.id: decision.notes[job.id]
        for job in cluster.jobs
        if job.adaptive and job.gpu_uuids and decision.notes.get(job.id)
    }


def _after_turns(
    state: DaemonState, starts: list[Placement], sliced: frozenset[int], waiting: dict[int, str]
) -> list[Placement]:
    """The starts to make now: a job's turn begins once the job before it left its GPUs."""
    kept = []
    for placement in starts:
        busy = (
            actuator.computing_on(state, placement.gpu_uuids, placement.job_id)
            if placement.job_id in sliced
            else []
        )
        if busy:
            waiting[placement.job_id] = (
                f"its turn: waiting for job {', '.join(map(str, busy))} to leave"
            )
        else:
            kept.append(placement)
    return kept


def usable(state: DaemonState) -> GpuSnapshot:
    """The GPUs this pass may place on, as the snapshot has them but up to date.

    A server found down since the last sample has none; GPUs lent to other
    servers' jobs are taken whole (`gpuq.daemon.hosted`).
    """
    gpus = state.gpus
    down = {name for name, remote in state.remotes.items() if remote.mirror is None}
    if down:
        gpus = replace(gpus, devices=[g for g in gpus.devices if g.node not in down])
    lent = state.hosted.lent_gpus()
    if not lent:
        return gpus
    foreign = dict(gpus.foreign_memory)
    for gpu in gpus.devices:
        if gpu.uuid in lent:
            foreign[gpu.uuid] = gpu.memory_total
    return replace(gpus, foreign_memory=foreign)


def node_status(state: DaemonState) -> dict[str, str]:
    """What is known of each configured server, for the reasons of jobs waiting for it."""
    status = {state.config.daemon.node_name: "no GPUs seen"}
    for health in state.server_health():
        host, reason = health["host"], health["reason"]
        if health["state"] == "down":
            status[host] = f"down: {reason}" if reason else "down"
        elif health["state"] == "up":
            status[host] = "up, its GPUs not seen yet"
        else:
            status[host] = "not reached yet"
    return status


def constraints_of(state: DaemonState, gpus: GpuSnapshot) -> Constraints:
    """This pass's placement constraints: the known nodes, those with `gpus`, the others' status."""
    seen = frozenset(gpu.node for gpu in gpus.devices)
    remotes = state.remotes

    def dirs(node: str, path: str) -> bool | None:
        remote = remotes.get(node)
        return None if remote is None else remote.has_dir(path)

    local = state.config.daemon.node_name
    types: dict[str, set[str]] = {}
    for gpu in gpus.devices:
        types.setdefault(gpu.node, set()).add(gpu.type)
    kinds = {node: frozenset(names) for node, names in types.items()}
    return Constraints(known_nodes(state.config), seen, node_status(state), dirs, local, kinds)


async def schedule_pass(state: DaemonState) -> list[Placement]:
    """Run one pass: settle, decide and launch. Returns the placements acted on.

    The event loop is never held for long: a large decision runs in a
    worker thread (the state is an immutable snapshot, and only this pass
    starts jobs), and starts are made in slices of `START_BUDGET_SECONDS`
    with a yield between them. Each start only asks the spawner for a shim.
    CPU-only jobs never reach the policy: they hold nothing it allocates,
    so each starts as soon as it is ready.
    """
    if not state.check_state_dir():
        return []
    now = time.time()
    gpus = usable(state)
    book = moves.settle(state, [gpu.uuid for gpu in gpus.devices])
    pending = sorted(
        (j for j in state.active.values() if j.state is JobState.QUEUED), key=lambda j: j.id
    )
    per_array: dict[int, int] = {}
    for job in state.active.values():
        if job.state.is_active and job.array_id is not None:
            per_array[job.array_id] = per_array.get(job.array_id, 0) + 1

    ready = readiness(pending, state.dependency_state, per_array, now)
    for job_id, why in ready.never.items():
        state.transition(state.active[job_id], JobState.CANCELLED, why, end_time=now)
    margin = state.config.scheduler.auto_mem_margin

    def learned(job: Job) -> int | None:
        peak = state.store.memory_peak(job.spec.name)
        return None if peak is None else int(peak * (1 + margin))

    constraints = constraints_of(state, gpus)
    cpu_jobs, placeable, held_back = constraints.hold(ready.ready, state.config.daemon.node_name)
    cpu_only = [Placement(job.id, ()) for job in cpu_jobs]
    cluster = build_state(
        placeable,
        list(state.active.values()),
        gpus,
        state.config.scheduler.memory_margin,
        state.config.scheduler.foreign_tolerance,
        learned,
        now,
        lambda job: suspend.can_preempt(state, job) or suspend.preempting(state, job),
        state.latest_samples,
        state.profiled_gpus,
        state.view_cache,
        constraints.nodes_of,
        users=state.config.lab.enabled,
    )
    cluster = typed.typed_view(cluster, state.type_fits)
    if state.config.lab.enabled:
        cluster = usage.fair_view(state, cluster, now)
    cluster = moves.present(book, state, cluster)
    state.introspection.observe(state.active.values(), state.latest_samples, now)
    cluster = introspect.enrich(cluster, state.introspection, state.packs)
    slicer = state.slicer
    if slicer is not None:
        cluster = slicer.present(cluster)
    decision = await decide(state, cluster, now)
    if isinstance(decision, str):
        late: dict[int, str] = {**ready.waiting, **held_back}
        late.update((job.id, decision) for job in cluster.jobs if not job.gpu_uuids)
        state.waiting_reasons = late
        return []
    memory.persist(state)
    wanted = decision
    state.sizing = sizing(cluster, decision)
    turn_end: float | None = None
    sliced: frozenset[int] = frozenset()
    if slicer is not None and slicer.needed(cluster, decision):
        info = actuator.turn_info(state, cluster, now, slicer.quantum)
        slices = slicer.slice(cluster, decision, info, now)
        decision, turn_end, sliced = slices.decision, slices.wake, slices.sliced
        memory.persist_turns(state)
    actions = plan(cluster, decision)
    packs = packing.carry_out(state, cluster, wanted, decision, actions)
    actions = packs.rest(actions)
    moved = moves.chosen(cluster, wanted, decision)  # the policy's, not the slicer's turns
    preemptions = actuator.preempt(state, actions, moved)
    turns = actuator.resume_turns(state, actions)
    starts, waiting = placements(cluster, decision, sliced)
    starts = packs.starts(starts)
    waiting.update(packs.waiting)
    release = preemptions.release_reason()
    if release is not None:
        waiting = {i: release if why == RELEASE_WAIT else why for i, why in waiting.items()}
    starts = _after_turns(state, starts, sliced, waiting)
    starts = moves.hold_back(state, cluster, moved, starts, waiting)
    reasons = {**ready.waiting, **held_back}
    reasons.update(waiting)
    reasons.update(turns)
    for job in placeable:
        note = constraints.dir_note(job.spec)
        if note is not None and job.id in reasons:
            reasons[job.id] = f"{reasons[job.id]} ({note})"
    state.waiting_reasons = reasons
    state.next_begin = min((t for t in (ready.next_begin, turn_end) if t is not None), default=None)
    starts = [*cpu_only, *starts]
    slice_start = time.perf_counter()
    for placement in starts:
        if time.perf_counter() - slice_start > START_BUDGET_SECONDS:
            await asyncio.sleep(0)
            slice_start = time.perf_counter()
            if not state.check_state_dir():
                break
        placed = state.active.get(placement.job_id)
        if placed is not None and placed.state is JobState.QUEUED:
            lifecycle.start(state, placed, placement)
    return starts
