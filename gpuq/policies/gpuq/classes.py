"""One `gpuq` decision, priority class by priority class (rules: `gpuq.policies.gpuq.policy`).

`decide_classes` walks the classes from the highest priority down on one
`Board`; each class runs five steps, in order, on what the classes above
left:

1. `admit`: memory shares and jobs that need a minimum of whole GPUs, in
   queue order by fifo's rules (`gpuq.policies.fifo`: EASY backfill with
   time limits, waiting reasons, moves on one server taken up on the board:
   `gpuq.policies.gpuq.moves`), preempting lower classes' checkpointable
   jobs for a job that fits no other way;
2. `size`: the goodput search (`Search`) over the class's whole-GPU jobs on
   the whole GPUs left (close GPUs where it chooses: `Board.pick`), or
   queue order where no job's size can change;
3. `pack`: review the class's packs and pack jobs that would wait behind it
   (`gpuq.policies.gpuq.packing`);
4. `slice`: over-subscribe a node for a job that would wait behind jobs of
   its own class (`gpuq.policies.gpuq.timeslice`);
5. waiting reasons for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from gpuq.fairshare import Fairness
from gpuq.policies.confine import node_names
from gpuq.policies.fairness import UserBook, fair_victims, held_gpus, ranks
from gpuq.policies.fifo import queue_order
from gpuq.policies.gpuq.board import Board
from gpuq.policies.gpuq.moves import Moving, admission, pinned, take_moves
from gpuq.policies.gpuq.packing import Packed, Packer
from gpuq.policies.gpuq.preempt import make_room
from gpuq.policies.gpuq.timeslice import Slicing
from gpuq.policies.interface import ClusterState, Decision, JobView, NodeView
from gpuq.policies.placement import Hardware, Hold, format_size
from gpuq.policies.pollux.policy import Solution, exploring, speedup_note
from gpuq.policies.pollux.search import SearchProblem, job_speedups

Search = Callable[[int, ClusterState], Solution | Decision]
"""The goodput search of one class (its priority, and the state of its whole-GPU jobs).

Pollux's search answers with its `Solution`; on GPUs of several types the
sizing is Sia's (`gpuq.policies.sia`), which answers with a `Decision`
whose allocations and notes are taken as they are.
"""


@dataclass(slots=True)
class Outcome:
    """The decision being built, in the order the caller should start jobs."""

    allocations: dict[int, tuple[int, ...]] = field(default_factory=dict)
    bindings: dict[int, tuple[str, ...]] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)
    packed: list[tuple[int, int]] = field(default_factory=list)

    def decision(self) -> Decision:
        """The finished `Decision`."""
        return Decision(
            allocations=self.allocations,
            bindings=self.bindings,
            notes=self.notes,
            packed=tuple(sorted(self.packed)),
        )


def rigid(job: JobView) -> bool:
    """True if the job runs on exactly one count of GPUs (none, or its minimum)."""
    return job.min_gpus >= 1 and job.max_gpus <= job.min_gpus


@dataclass(frozen=True, slots=True)
class Steps:
    """The optional steps and their settings: moves, packing, time-slicing (None: not taken)."""

    slicing: Slicing | None = None
    moving: Moving | None = None
    packer: Packer | None = None
    fair_grace: float | None = None
    """Fair share's preemption within a class: how long a victim must have run (None: never)."""


def decide_classes(board: Board, search: Search, now: float, steps: Steps) -> Decision:
    """Decide every priority class in turn, highest first (module docstring)."""
    out = Outcome()
    victims: dict[int, str] = {}
    shrunk: dict[int, str] = {}
    for priority in sorted({job.priority for job in board.jobs.values()}, reverse=True):
        _Class(board, priority, search, now, out, (victims, shrunk), steps).run()
    return out.decision()


class _Class:
    """The four steps for one priority class."""

    def __init__(
        self,
        board: Board,
        priority: int,
        search: Search,
        now: float,
        out: Outcome,
        yielded: tuple[dict[int, str], dict[int, str]],
        steps: Steps,
    ) -> None:
        self.board = board
        self.priority = priority
        self.search = search
        self.now = now
        self.out = out
        self.victims, self.shrunk = yielded
        self.slicing = steps.slicing
        self.moving = steps.moving
        self.packer = steps.packer
        self.fair_grace = steps.fair_grace
        self.original = {job.id: job for job in board.state.jobs}
        jobs = [job for job in board.state.jobs if job.priority == priority]
        for job in jobs:
            if job.id in self.victims:
                out.notes[job.id] = self.victims[job.id]
        live = [job for job in jobs if job.id not in self.victims]
        held = [job for job in live if job.id in board.holds]
        self.movable = [
            job for job in held if job.gpu_mem is None and job.preemptible and not job.suspended
        ]
        moving = {job.id for job in self.movable}
        self.fixed = [job for job in held if job.id not in moving]
        waits = [job for job in live if job.id not in board.holds and job.id not in board.riders]
        self.queue = queue_order(waits, ranks(board.state, now))
        self.waiting: dict[int, str] = {}
        self.limited = self._limits()
        if self.limited:
            self.queue = [job for job in self.queue if job.id not in self.limited]

    def _limits(self) -> dict[int, str]:
        """The waiting jobs held back by their owner's limits, with why (`UserBook`).

        What each user holds: its running jobs (those preempted by this
        decision included) and the jobs classes above started. Then, in queue
        order, each job that may start books its minimum (its shares), so a
        user's jobs past the limit wait even where the ones before them do
        not start in the end: never over, sometimes under.
        """
        fair = self.board.state.fair
        if fair is None or not fair.limited:
            return {}
        holders = [job for job in self.board.given.values() if held_gpus(job) > 0]
        book = UserBook(fair, holders)
        for job_id, allocation in self.out.allocations.items():  # started by a class above
            if job_id not in self.board.given or not held_gpus(self.board.given[job_id]):
                book.hold(self.board.jobs[job_id].user, sum(allocation))
        limited = {}
        for job in self.queue:
            gpus = job.gpus_requested if job.gpu_mem is not None else max(job.min_gpus, 1)
            reason = book.reason(job, gpus)
            if reason is None:
                book.hold(job.user, gpus)
            else:
                limited[job.id] = reason
        return limited

    def run(self) -> None:
        """Admit, size, pack, slice, and say why the rest wait."""
        self.out.notes.update(self.limited)
        for job in self.fixed:
            self._keep(job, self.board.jobs[job.id].allocation, _unresizable(job))
        gated = [job for job in self.queue if job.gpu_mem is not None or job.min_gpus >= 1]
        admitted = self._admit(gated) if gated else {}
        ungated = [job for job in self.queue if job.gpu_mem is None and job.min_gpus < 1]
        members = [*self.movable, *(j for j in gated if j.id in admitted), *ungated]
        if members and all(rigid(job) for job in members):
            for job in self.movable:
                self._keep(job, self.board.jobs[job.id].allocation)
            for job in gated:
                if job.id in admitted and job.gpu_mem is None:
                    self._start(
                        job, admitted[job.id], f"next in the queue at priority {job.priority}"
                    )
        elif members:
            self._size(members, admitted)
        hardware = Hardware(self.board.state)
        left = [
            job
            for job in self.queue
            if job.gpu_mem is None
            and job.id not in self.out.allocations
            and hardware.on(job.nodes).impossible_reason(max(job.min_gpus, 1), None) is None
        ]
        blocked = [job for job in left if job.min_gpus >= 1 and job.id not in admitted]
        packed = self._pack(blocked)
        if self.slicing is not None:
            turns = left if self.slicing.everyone else blocked
            turns = [job for job in turns if job.id not in self.out.allocations]
            turns = queue_order([*turns, *packed.unpacked], ranks(self.board.state, self.now))
            self.out.notes.update(
                self.slicing.place(self.board, self.out.allocations, turns, self.now)
            )
        self.out.notes.update(packed.notes)
        for job in self.queue:
            if job.id not in self.out.allocations:
                self.out.notes.setdefault(job.id, self.waiting.get(job.id) or self._why(job))

    # ---- step 1: admission in queue order -------------------------------------------------

    def _fifo_state(
        self, asks: list[JobView], shrink: bool, placed: dict[int, tuple[str, ...]]
    ) -> ClusterState:
        """The board's holds, the asks already `placed` and the other asks, as fifo's state.

        With `shrink`, the class's resizable jobs hold only their minimum.
        """
        board = self.board
        moving = {job.id for job in self.movable}
        shown: set[int] = set(placed)  # shown other than they are: never moved by this pass
        views = []
        for job_id, hold in board.holds.items():
            gpus = hold.gpus
            if shrink and job_id in moving and len(gpus) > max(board.jobs[job_id].min_gpus, 1):
                gpus = gpus[: max(board.jobs[job_id].min_gpus, 1)]
                shown.add(job_id)
            views.append(board.holds_view(job_id, gpus))
        for job in asks:
            if job.id in placed:
                on = placed[job.id]
                job = replace(job, gpu_uuids=on, allocation=board.allocation(self._index(on)))
                views.append(replace(job, start_time=self.now))
            else:
                views.append(job)
        views = [pinned(view, board, self.priority, shown) for view in views]
        return replace(board.state, jobs=tuple(sorted(views, key=lambda job: job.id)))

    def _fifo(
        self, asks: list[JobView], shrink: bool, placed: dict[int, tuple[str, ...]]
    ) -> tuple[ClusterState, Decision]:
        """One fifo pass over the asks not yet placed; places them into `placed`."""
        state = self._fifo_state(asks, shrink, placed)
        decision = admission(self.moving, self.board).decide(state, self.now)
        placed.update(
            (job.id, decision.bindings[job.id])
            for job in asks
            if job.id not in placed and job.id in decision.bindings
        )
        for job_id in take_moves(self.board, state, decision):
            if job_id in self.out.allocations:  # kept already: kept where it goes now
                self._keep(self.board.jobs[job_id], ())
        return state, decision

    def _index(self, uuids: tuple[str, ...]) -> tuple[int, ...]:
        index = self.board.capacity.index
        return tuple(index[uuid] for uuid in uuids)

    def _admit(self, gated: list[JobView]) -> dict[int, tuple[int, ...]]:
        """Place shares and admit minimum whole-GPU asks by fifo's rules; the asks admitted.

        First on the GPUs free now; then, for the asks left, also on what the
        class's resizable jobs hold beyond their minimum (they shrink for
        them), preempting lower classes for an ask that fits no other way.
        """
        asks = [
            job if job.gpu_mem is not None else replace(job, gpus_requested=max(job.min_gpus, 1))
            for job in gated
        ]
        placed: dict[int, tuple[str, ...]] = {}
        state, decision = self._fifo(asks, False, placed)
        board = self.board
        spare = any(len(board.holds[job.id].gpus) > max(job.min_gpus, 1) for job in self.movable)
        if len(placed) < len(asks) and spare:
            state, decision = self._fifo(asks, True, placed)
        if len(placed) < len(asks) and self._preempt(state, asks, placed):
            state, decision = self._fifo(asks, True, placed)
        if len(placed) < len(asks) and self._fair_preempt(state, asks, placed):
            state, decision = self._fifo(asks, True, placed)
        admitted: dict[int, tuple[int, ...]] = {}
        for job in asks:
            uuids = placed.get(job.id)
            if uuids is None:
                self.waiting[job.id] = decision.notes.get(job.id, "waiting")
                continue
            gpus = self._index(uuids)
            if (job.spread or 1) > 1:  # a multi-node job: rigid, and only admission shapes it
                self._start(job, gpus, f"next in the queue at priority {job.priority}")
            elif job.gpu_mem is None:
                admitted[job.id] = gpus
            else:
                alone = " alone" if job.exclusive else ""
                self._start(job, gpus, f"a {format_size(job.gpu_mem)} memory share{alone}")
        return admitted

    def _preempt(
        self, state: ClusterState, asks: list[JobView], placed: dict[int, tuple[str, ...]]
    ) -> list[int]:
        """Shrink or preempt lower classes' jobs for asks that fit no other way (`make_room`)."""
        board = self.board
        changed = make_room(board, self.priority, state, asks, placed)
        for victim_id, (keep, ask) in changed.items():
            victim = board.jobs[victim_id]
            why = f"for job {ask} (priority {self.priority} over {victim.priority})"
            if keep:
                self.shrunk[victim_id] = f"shrunk {why}"
                board.hold(Hold(victim_id, board.holds[victim_id].gpus[:keep]))
            else:
                self.victims[victim_id] = f"preempted {why}"
                board.release(victim_id)
        return list(changed)

    def _fair_preempt(
        self, state: ClusterState, asks: list[JobView], placed: dict[int, tuple[str, ...]]
    ) -> list[int]:
        """Preempt the class's runner jobs of users over their fair share for users under it.

        `gpuq.policies.fairness.fair_victims` says whom; `make_room` how few.
        Not where the class takes turns (time-slicing): there a waiting job
        gets turns on the GPUs instead, and a job preempted for it would
        take them back at once.
        """
        board, fair = self.board, self.board.state.fair
        if fair is None or self.fair_grace is None or self.slicing is not None:
            return []
        holders = [
            board.jobs[job_id]
            for job_id, hold in board.holds.items()
            if board.jobs[job_id].priority == self.priority
            and board.jobs[job_id].gpu_mem is None
            and hold.gpus
            and job_id not in self.victims
            and job_id not in board.started
            and job_id not in board.moved
        ]
        waiting = [job for job in asks if job.id not in placed and job.gpu_mem is None]
        plan = fair_victims(
            holders,
            waiting,
            fair,
            self.now,
            self.fair_grace,
            lambda job: len(board.holds[job.id].gpus),
        )
        if plan is None:
            return []
        changed = make_room(board, self.priority, state, list(plan.asks), placed, plan.victims)
        for victim_id, (keep, ask) in changed.items():
            victim, asker = board.jobs[victim_id], board.jobs[ask].user
            why = (
                f"for job {ask} (fair share: {asker} holds {plan.held.get(asker, 0)} of "
                f"{plan.budgets[asker]} GPUs, {victim.user} "
                f"{plan.held[victim.user]} of {plan.budgets[victim.user]})"
            )
            if keep:
                self.shrunk[victim_id] = f"shrunk {why}"
                board.hold(Hold(victim_id, board.holds[victim_id].gpus[:keep]))
            else:
                self.victims[victim_id] = f"preempted {why}"
                self.out.notes[victim_id] = self.victims[victim_id]
                board.release(victim_id)
        self.movable = [job for job in self.movable if job.id not in self.victims]
        self.fixed = [job for job in self.fixed if job.id not in self.victims]
        return list(changed)

    # ---- step 2: sizes from the goodput search --------------------------------------------

    def _size(self, members: list[JobView], admitted: dict[int, tuple[int, ...]]) -> None:
        """Run the goodput search over the class's whole-GPU jobs and hold what it gives."""
        board = self.board
        before = {job.id: board.holds[job.id].gpus for job in self.movable}
        own = {i for gpus in before.values() for i in gpus}
        for job in self.movable:
            board.release(job.id)
        capacity = board.capacity
        usable = [
            i
            for i in range(len(board.state.gpus))
            if board.whole_free(i) or (i in own and not capacity.owners[i] | capacity.sharers[i])
        ]
        counts = [0] * len(board.state.nodes)
        for i in usable:
            counts[board.node_of[i]] += 1
        if not sum(counts):
            for job in self.movable:
                self.out.notes[job.id] = "its GPUs go to jobs of higher priority"
            return
        nodes = tuple(
            NodeView(node.name, count, node.gpu_type)
            for node, count in zip(board.state.nodes, counts, strict=True)
        )
        views = sorted((board.jobs[job.id] for job in members), key=lambda job: job.id)
        state = replace(
            board.state, nodes=nodes, jobs=tuple(views), gpus=(), fair=self._fair(views)
        )
        answer = self.search(self.priority, state)
        sized = _typed_sizes(answer, views) if isinstance(answer, Decision) else _sizes(answer)
        free = set(usable)
        # Jobs that stay pick first, then those resized or moved (their own GPUs
        # first), then those starting (where admission placed them, if free).
        order = sorted(
            sized,
            key=lambda size: (
                size.job.id not in before,
                size.target != tuple(size.job.allocation),
                size.job.id,
            ),
        )
        for size in order:
            job, target, note = size.job, size.target, size.note
            if not any(target):
                if job.id in before:
                    self.out.notes[job.id] = "its GPUs give other jobs more goodput"
                continue
            gpus = board.pick(free, target, before.get(job.id, admitted.get(job.id, ())))
            if gpus is None:  # cannot happen: the search respects each node's count
                continue
            free.difference_update(gpus)
            started = job.id not in before
            if not started:
                board.hold(Hold(job.id, gpus))
            if not started and sum(target) != sum(job.allocation) and size.change is not None:
                note = size.change
            if job.id in self.shrunk and target != tuple(job.allocation):
                note = self.shrunk[job.id]
            if started:
                self._start(job, gpus, note)
            elif target == tuple(job.allocation):
                self._keep(job, target, note)
            else:
                self.out.allocations[job.id] = target
                self.out.notes[job.id] = note
        self.waiting.update(
            (job.id, _search_wait(board, job, job.id in admitted))
            for job in members
            if job.id not in before and job.id not in self.out.allocations
        )

    def _fair(self, members: Sequence[JobView]) -> Fairness | None:
        """The fair share for sizing `members`: with what each user holds outside them."""
        fair = self.board.state.fair
        if fair is None or fair.max_gpus <= 0:
            return fair
        inside = {job.id for job in members}
        held: dict[str, int] = dict(fair.held)
        for job_id, hold in self.board.holds.items():
            if job_id not in inside:
                user = self.board.jobs[job_id].user
                held[user] = held.get(user, 0) + len(hold.gpus)
        for rider in self.board.riders:
            user = self.board.given[rider].user
            held[user] = held.get(user, 0) + held_gpus(self.board.given[rider])
        return replace(fair, held=held)

    # ---- step 3: packing -----------------------------------------------------------------

    def _pack(self, blocked: list[JobView]) -> Packed:
        """Review the class's packs and pack jobs that would wait (`Packer.step`)."""
        if self.packer is None:
            return Packed()
        board = self.board
        packed = self.packer.step(board, self.priority, blocked, self._stays, self.now)
        for rider, host in sorted(packed.packs.items()):
            gpus = board.holds[host].gpus
            self.out.allocations[rider] = board.allocation(gpus)
            self.out.bindings[rider] = board.uuids(gpus)
            self.out.packed.append((host, rider))
        return packed

    def _stays(self, job_id: int) -> bool:
        """True if the job keeps exactly the GPUs it holds on the board in this decision."""
        hold = self.board.holds.get(job_id)
        if hold is None or job_id in self.board.moved:
            return False
        return self.out.allocations.get(job_id) == self.board.allocation(
            hold.gpus
        ) and self.out.bindings.get(job_id) == self.board.uuids(hold.gpus)

    # ---- helpers ---------------------------------------------------------------------------

    def _start(self, job: JobView, gpus: tuple[int, ...], note: str) -> None:
        """The job starts on `gpus` (bound: the caller must not rebind them)."""
        board = self.board
        board.hold(Hold(job.id, gpus, job.gpu_mem, job.exclusive), self.now)
        self.out.allocations[job.id] = board.allocation(gpus)
        self.out.bindings[job.id] = board.uuids(gpus)
        self.out.notes[job.id] = note

    def _keep(self, job: JobView, allocation: tuple[int, ...], note: str | None = None) -> None:
        """The job stays where it is: its allocation, and the GPUs it names as the caller's.

        A job moved by this decision stays where it goes: bound to its new
        GPUs, with the move's reason.
        """
        moved = self.board.moved.get(job.id)
        if moved is not None:
            gpus = self.board.holds[job.id].gpus
            self.out.allocations[job.id] = self.board.allocation(gpus)
            self.out.bindings[job.id] = self.board.uuids(gpus)
            self.out.notes[job.id] = moved
            return
        original = self.original.get(job.id)
        self.out.allocations[job.id] = tuple(allocation)
        uuids = original.gpu_uuids if original is not None else ()
        if uuids:
            self.out.bindings[job.id] = uuids
        if note:
            self.out.notes[job.id] = note

    def _why(self, job: JobView) -> str:
        """Why a job of this class waits, where no step said."""
        need = max(job.min_gpus, 1) if job.gpu_mem is None else job.gpus_requested
        capacity = self.board.capacity
        summary = capacity.summary(capacity.outside(job))
        where = "" if job.nodes is None else node_names(job.nodes)
        return summary.wait_reason(need, job.gpu_mem, job.exclusive, where)


def _unresizable(job: JobView) -> str | None:
    """Why a running adaptive job that cannot checkpoint keeps its GPUs (None: not such a job)."""
    if not job.adaptive or job.preemptible or job.suspended or job.gpu_mem is not None:
        return None
    return (
        f"kept on {sum(job.allocation)} of {max(job.min_gpus, 1)}-{job.max_gpus} GPUs:"
        " it is resized only through a gpuq.runner checkpoint and has offered none"
    )


@dataclass(frozen=True, slots=True)
class _Size:
    """The goodput sizing's answer for one job: its GPUs per node and why.

    `change` is the reason to give instead of `note` when a running job's
    GPU count changes (None: the same).
    """

    job: JobView
    target: tuple[int, ...]
    note: str
    change: str | None = None


def _sizes(solution: Solution) -> list[_Size]:
    """Each job's allocation from Pollux's search, with its speedup as the reason."""
    best, problem = solution.best, solution.problem
    now_speedups = job_speedups(problem, best[None])[0]
    base_speedups = _base_speedups(problem)
    sizes = []
    for row, job in enumerate(solution.jobs):
        speedup = float(now_speedups[row])
        target = tuple(int(n) for n in best[:, row])
        held = exploring(job, sum(target), solution.max_gpu_factor)
        note = f"{speedup_note(job, speedup)}{held}"
        change = None
        if base_speedups[row] > 0:
            gain = speedup / float(base_speedups[row]) - 1.0
            change = f"goodput {gain:+.0%} ({speedup_note(job, speedup)}){held}"
        sizes.append(_Size(job, target, note, change))
    return sizes


def _typed_sizes(decision: Decision, jobs: Sequence[JobView]) -> list[_Size]:
    """Each job's allocation from a sizing by GPU type, with its reason."""
    sizes = []
    for job in jobs:
        target = tuple(decision.allocations.get(job.id, ()))
        note = decision.notes.get(job.id, "")
        sizes.append(_Size(job, target, note))
    return sizes


def _base_speedups(problem: SearchProblem) -> list[float]:
    """Each job's SPEEDUP where it runs now (0 where the search's tables do not reach)."""
    _, node_slots, width = problem.speedup.shape
    base = problem.base
    speedups = []
    for row in range(base.shape[1]):
        gpus = int(base[:, row].sum())
        nodes = int((base[:, row] > 0).sum())
        inside = 0 < gpus < width and nodes < node_slots
        speedups.append(float(problem.speedup[row, nodes, gpus]) if inside else 0.0)
    return speedups


def _search_wait(board: Board, job: JobView, fits: bool) -> str:
    """Why a whole-GPU job the goodput search left out waits (`fits`: its minimum did)."""
    need = max(job.min_gpus, 1)
    summary = board.capacity.summary(board.capacity.outside(job))
    if fits or summary.whole_free >= need:
        return (
            "waiting: the goodput allocation keeps the GPUs with running jobs for now "
            "(shrinking them would cost more than it gains yet)"
        )
    return summary.wait_reason(
        need, None, False, "" if job.nodes is None else node_names(job.nodes)
    )


__all__ = ["Outcome", "Search", "Steps", "decide_classes", "rigid"]
