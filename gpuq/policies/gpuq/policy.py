"""gpuq's default policy, `gpuq`: a lab's queue with goodput, moves, packing and time-slicing.

It does what a lab's daemon needs `fifo` for (priorities, memory shares,
exclusive jobs, foreign memory, backfill with time limits, a reason for
every wait) and sizes whole-GPU jobs by Pollux's goodput search. Each
decision is built on a board of the cluster GPU by GPU
(`gpuq.policies.gpuq.board`) and decided one priority class at a time
(`gpuq.policies.gpuq.classes`); each rule is tested in
tests/test_policy_gpuq.py.

Priorities: strict classes, highest first
    Jobs of one priority are decided together, on the GPUs the classes above
    left: a higher-priority job is always served before a lower one. Inside
    a class, the goodput objective decides; it is never traded against
    priority (a class's goodput cannot buy GPUs a higher class wants).
Preemption for priority (`gpuq.policies.gpuq.preempt`)
    A waiting job that fits no other way (not merely behind a reservation)
    takes GPUs from running jobs of lower priority: first by shrinking
    adaptive ones to their minimum, then by preempting jobs whole; each
    lowest priority first, then the most recently started (the least work to
    redo), no more than it needs. Only jobs the caller can preempt without
    losing work (`JobView.preemptible`: a gpuq.runner that checkpoints,
    live) are ever shrunk or preempted; the others keep their GPUs and the
    job waits. Each reason names the job yielded to ("preempted for job 12
    (priority 5 over 0)", "resized 2 -> 1 GPUs: shrunk for job 12 ...").
    Within a priority, a job leaves its GPUs only for the goodput search
    below or for another's turn (time-slicing).
Fair share (lab mode: `ClusterState.fair`; `gpuq.policies.fairness`)
    Within a class the users' waiting jobs are ordered as a weighted fair
    queue, the goodput search gives each user a budget, and a waiting job
    of a user under its budget that fits no other way preempts runner jobs
    of users over theirs that have run `fair_grace` seconds (300), through
    their checkpoint, never taking a user below its own budget ("preempted
    for job 12 (fair share: bob holds 0 of 2 GPUs, alice 8 of 6)"), where
    the class does not take turns (`timeslice=off`; with turns, the waiting
    job gets its turns instead). With one user, or without `fair`, nothing
    of this applies.
Admission in queue order (fifo's rules, `gpuq.policies.fifo`, reused)
    Memory-share jobs (`--gpu-mem`, exclusive or not) and the minimum of
    every whole-GPU job that needs one (`min_gpus` >= 1: every daemon job)
    are placed in queue order (submit time, then id) with fifo's capacity
    rules (shares best-fit, never over-committing a GPU's memory beside its
    foreign memory; whole GPUs only where foreign memory is within the
    tolerance), its EASY backfill with time limits around the first job that
    does not fit, and its waiting reasons. Running jobs hold their GPUs,
    except that a running job the search may resize holds only its minimum
    here: what it holds beyond that may go to an earlier-queued share or
    job, and the search then shrinks it (through its checkpoint). Memory
    shares are never resized or preempted for jobs of their own class (they
    may be moved, below). Jobs that run on any count (`min_gpus` 0: the
    simulator's Pollux jobs) are not gated: the search alone decides for
    them, as in Pollux.
Moves on one server (`moves`, on; `gpuq.policies.gpuq.moves`)
    Admission lets fifo plan its moves (`gpuq.policies.consolidate`) for the
    first job of a class that does not fit: memory-share jobs moved onto
    other shared GPUs until it gets the free GPU it needs ("frees GPU 0 for
    job 9"), or single-GPU jobs moved out of a link group so that a
    multi-GPU job gets GPUs of one PCIe switch or NVLink. Only a job the
    caller can checkpoint, that has run `move_after` seconds (60) since it
    started or was last moved, and of the waiting job's priority or lower
    (a move costs the moved job a restart: never for a lower class) is
    moved, at most one set of moves per decision. The moved job runs on in
    the decision on its new GPUs, bound to exactly those, with the move's
    reason, and the waiting job starts on the GPUs freed once the moved job
    has left them. Why: a job holding a sliver of a GPU would otherwise keep
    a whole-GPU job waiting, or taking turns, until it ends.
Topology (`gpuq.policies.topology`)
    Where gpuq chooses GPUs itself (a job the goodput search starts, grows
    or shrinks), a multi-GPU job gets GPUs of one link group where one has
    room (`pick_close`), its own first; a job whose count stays keeps
    exactly its GPUs. Admission's GPUs are fifo's, close by the same rule.
Goodput allocation (Pollux's search, `gpuq.policies.pollux.policy`)
    The class's whole-GPU jobs that can change GPUs (running jobs whose
    caller can preempt them, and those admitted or not gated) are sized by
    Pollux's search on the class's whole GPUs: free ones (no gpuq job, foreign
    memory within the tolerance) and those they hold. Running jobs that
    cannot be preempted, and jobs waiting for their turn, keep theirs. A
    job's GPUs are its own ones first, then free ones in GPU order. Where no
    job of the class can change its size (all rigid: one count each), the
    search has nothing to size and admitted jobs start where admission
    placed them. The search charges restarts as below.
GPU types (`types="aware"`, the default)
    Where the GPUs a class sizes are of several types (`NodeView.gpu_type`),
    its whole-GPU jobs are sized by Sia's ILP instead (`gpuq.policies.sia`,
    with `typed_p` as its p, -0.5): each job's type and count from its
    model on each type (`JobView.per_type`), Sia's restart factor with the
    job's own restart cost. Pollux's search does not know types: on a mixed
    cluster it sees GPUs of one job spread over types and models fitted to
    all of them. On GPUs of one type nothing changes. Three rules of gpuq's
    on top of Sia's (`gpuq.policies.sia.policy`, each measured in
    bench/RESULTS.md): a job not measured yet starts by the types' prior
    speeds, on up to 2 GPUs of the fastest free type, not on one GPU of any
    (`unknown="prior"`); no running job is shrunk while a GPU is idle
    (`shrink="idle"`); and jobs that have received less GPU time weigh more
    in the objective, down to 0.3 (`service=3600`). On Sia's Philly and
    Saturn traces they lower average JCT by about 6-7% against `sia`.
    `types="sia"`: Sia's ILP as the paper runs it (with gpuq's starts);
    `types="unaware"`: Pollux's search everywhere.
Restart charges (on the search, per job)
    Pollux charges REALLOC_FACTOR `max(T - R*delta, 0) / (T + delta)` (T the
    job's age, R its restarts, delta the restart penalty) to every change,
    starting a waiting job included; a job arriving at the decision instant
    (T = 0) is then worth nothing and waits a whole interval with GPUs idle.
    `starts="idle"` (the default): while the class's GPUs include an idle
    one, a job holding none is charged nothing. `starts="free"`: in a full
    cluster too (average JCT -0.2% to +0.6% on workloads 1-4 over seeds 0-5,
    but workload-2's p99 JCT +1.2% [+0.7%, +1.6%]: the newcomers shrink the
    longest jobs more often). `starts="charged"`: Pollux's rule.
    `remaining_aware` (off): a running job's move is charged `L / (L +
    delta)` when that is heavier, L its remaining time where it is
    (`gpuq.policies.gpuq.estimates`); it changed average JCT by less than the
    seeds' spread and raised workload-4's p99 by 3.7% with free starts, and
    it reads remaining work (an oracle in the simulator), which the daemon
    does not estimate, so the daemon refuses it.
Time-slicing (`timeslice`, `gpuq.policies.gpuq.timeslice`)
    `timeslice="blocked"` (the default): a whole-GPU job that admission
    could not place (its minimum does not fit in its class's GPUs even with
    every resizable job of the class at its minimum: it waits behind jobs
    of its own priority) becomes a guest of a node whose gpuq jobs are all
    of its class and can wait their turn, over-subscribing it at most
    `oversubscription` (2) times, in queue order until one finds no such
    node (no job takes turns ahead of an older one that gets none); the
    daemon then shares the node's GPUs in turns of `quantum` seconds (60),
    parking or checkpointing a runner job, stopping a job whose memory is
    known (`gpuq.daemon.scheduler.slicer`, which refuses any other). Why: a
    job queued behind jobs of its own priority gets its first minutes within
    a quantum rather than when a job ends, so a user sees its first losses
    (or its crash) early: Gandiva's argument, for the many short and failing
    runs of a lab. Only behind its own class, since a higher class preempts
    and a lower one waits. Not a job whose minimum fits but that the goodput
    search left waiting, nor one that runs on any count (`min_gpus` 0, the
    simulator's Pollux jobs): the search can give it GPUs by shrinking
    others, and holds off only while a restart costs more than it gains,
    which turns would overrule. `timeslice="all"` slices those too: on
    workloads 1-4 (seeds 0 and 1, bench/RESULTS.md) it moved average JCT by
    -0.2% to 0 but raised p99 JCT on workloads 2 and 3 (+0.2%, +1.5%), the
    longest jobs slowed by the turns on their nodes; so in the simulator the
    default decides exactly as `timeslice="off"` (no turns). How turns meet
    the search: a guest is shown to the next decision as waiting (the board
    makes the newest single-node jobs of an over-subscribed node its
    guests), so it starts for real as soon as its minimum fits (its turns
    then end), and a node being time-sliced is full to the search, which
    neither grows its jobs nor places other jobs there.
Fair share across users (`ClusterState.fair`: lab mode, or a simulated workload with users)
    Where a class's jobs belong to several users (`JobView.user`): its
    queue goes by effective priority (the owner's fair-share factor from
    decayed usage, plus aging: `gpuq.policies.fairness`) before submit
    time, so admission serves the user furthest below its share first and
    no job starves; a job whose owner is at `max_gpus` or `max_running`
    waits ("user alice at max_gpus 8 (holds 8)") and is neither packed nor
    time-sliced; and the goodput search runs within a budget of GPUs per
    user, max-min fair by the configured shares (`gpuq.policies.gpuq.shares`:
    a user gets all its jobs can use up to its share, the rest is split by
    share, and no budget holds back GPUs that nobody else wants). With one
    user, or without `fair`, every decision is exactly as before. On GPUs
    of several types (Sia's sizing) only the queue order and the limits
    apply, not the budgets.
Placement constraints (`JobView.nodes`: `gpuq submit --node`, `--label`)
    A constrained job is admitted, moved for, preempted for, sized by the
    search, packed and time-sliced on its nodes only, by the rules above;
    its waiting reason names them ("waiting for 1 free GPU on gpu2 (0
    free)").
Reasons
    Every job gets a note: where it runs and why ("speedup 1.62 over a fair
    share", "goodput +38% (...)" for a resize, "a 6.0G memory share", "next
    in the queue at priority 0", "frees GPU 0 for job 9" for a move, "trial
    on n1 (...)" for a pack), or why it waits (fifo's "waiting for 2 free
    GPUs (0 free)", "behind job 12 (reserved GPUs)", "needs 4 GPUs; this
    server has 2"; the search's "the goodput allocation keeps the GPUs with
    running jobs for now"; a guest's "time-sliced on n1 with job 3").
Packing with introspection (`packing`, on; `gpuq.policies.gpuq.packing`)
    Before a job waiting behind its own class takes turns, it is packed
    with a job of its class running on one whole GPU, where both are
    gpuq.runner jobs measured alone (their step times), of one GPU, with
    low measured utilization (the two add up to at most
    `pack_utilization`, 100%) and memory peaks that fit in that GPU
    together, and not a pair that failed before ("trial on n1 (utilization
    30% + 30%)"). The caller then measures both jobs' steps packed; once
    both are measured the pack is kept while their packed rates (each a
    fraction of its rate alone) add up to more than `keep_threshold` (1.0,
    what time-slicing gives the two) and undone the first time they do not
    ("packed throughput 0.71 of time-sliced (0.36+0.35 of solo)"): the pair
    then takes turns and is never packed again, nor is a pair of which one
    ran out of GPU memory packed. A pack also ends when its host leaves its
    GPU, or when a whole GPU is free on its node. Why: a job waiting behind
    its own class otherwise runs in turns, at half speed; two light jobs (a
    small model, a data-bound loop) often each run faster than that on one
    GPU at once, and measuring them is the only reliable way to know
    (Gandiva, sections 4.1 and 4.2.2; the rules are shared with `gandiva`:
    `gpuq.policies.packing`). Jobs the simulator runs report no utilization
    or memory, so packing never happens there.

`restart_penalty`, `population` and `generations` are Pollux's options; the
random generator is seeded once and each class keeps its own warm-start
population (saved and restored: `Remembers`). With one class of jobs that
run on any count and no shares (Pollux's workloads), the decisions are
exactly those of the search alone, time-slicing on or off (and no job is
moved or packed there: no shares, no topology, no utilization measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from gpuq.policies.consolidate import DEFAULT_SETTLE
from gpuq.policies.gpuq.board import Board
from gpuq.policies.gpuq.classes import Steps, decide_classes
from gpuq.policies.gpuq.estimates import remaining_time
from gpuq.policies.gpuq.moves import Moving
from gpuq.policies.gpuq.packing import Packer
from gpuq.policies.gpuq.shares import with_budgets
from gpuq.policies.gpuq.timeslice import Slicing
from gpuq.policies.interface import Capabilities, ClusterState, Decision, JobView
from gpuq.policies.pollux.policy import (
    PolluxPolicy,
    Population,
    Solution,
    dump_population,
    load_population,
)
from gpuq.policies.pollux.search import SearchProblem

if TYPE_CHECKING:
    from gpuq.policies.sia.policy import SiaPolicy

STARTS = ("idle", "free", "charged")
"""When starting a waiting job is free of Pollux's restart charge (module docstring)."""
TYPES = ("aware", "sia", "unaware")
"""Whether the goodput sizing knows GPU types (module docstring)."""
TYPED_SERVICE = 3600.0
"""GPU-seconds of service at which a job's weight on GPUs of several types is 1/sqrt(2)."""
TIMESLICE = ("blocked", "all", "off")
"""Which waiting jobs take turns (module docstring)."""


DEFAULT_FAIR_GRACE = 300.0
"""Seconds a runner job of a user over its fair share runs before one under it may preempt it."""


class GpuqPolicy(PolluxPolicy):
    """gpuq's default policy: classes, admission, moves, goodput, packing, turns (see module)."""

    name = "gpuq"

    def __init__(
        self,
        seed: int = 0,
        starts: str = "idle",
        remaining_aware: bool = False,
        *,
        timeslice: str = "blocked",
        quantum: float = 60.0,
        oversubscription: float = 2.0,
        moves: bool = True,
        move_after: float = DEFAULT_SETTLE,
        packing: bool = True,
        keep_threshold: float = 1.0,
        pack_utilization: float = 100.0,
        restart_penalty: float | None = None,
        population: int = 100,
        generations: int = 100,
        types: str = "aware",
        typed_p: float = -0.5,
        fair_grace: float = DEFAULT_FAIR_GRACE,
    ) -> None:
        super().__init__(
            seed=seed,
            restart_penalty=restart_penalty,
            population=population,
            generations=generations,
        )
        if starts not in STARTS:
            raise ValueError(f"starts must be one of {', '.join(STARTS)}, not {starts!r}")
        if timeslice not in TIMESLICE:
            raise ValueError(f"timeslice must be one of {', '.join(TIMESLICE)}, not {timeslice!r}")
        if quantum <= 0:
            raise ValueError(f"quantum must be positive, got {quantum}")
        if oversubscription < 1:
            raise ValueError(f"oversubscription must be at least 1, got {oversubscription}")
        if not fair_grace >= 0:
            raise ValueError(f"fair_grace must be 0 or more seconds, got {fair_grace}")
        self.fair_grace = float(fair_grace)
        if types not in TYPES:
            raise ValueError(f"types must be one of {', '.join(TYPES)}, not {types!r}")
        self.starts = starts
        self.types = types
        if not math.isfinite(typed_p) or typed_p == 0:
            raise ValueError(f"typed_p must be finite and non-zero, got {typed_p}")
        self.typed_p = typed_p
        self._typed: SiaPolicy | None = None  # built on the first decision over several types
        self.remaining_aware = remaining_aware
        self.timeslice = timeslice
        on = timeslice != "off"
        self.slicing = Slicing(oversubscription, quantum, timeslice == "all") if on else None
        self.moving = Moving(float(move_after)) if moves else None
        self.packer = Packer(keep_threshold, pack_utilization) if packing else None
        self._populations: dict[int, Population | None] = {}
        # Remaining work is read only by the option that charges moves over it.
        self.capabilities = Capabilities(
            adaptive_jobs=True,
            time_slicing=on,
            packing=packing,
            preemption=True,
            remaining_work=remaining_aware,
            remembers=True,
            quantum=quantum,
            multi_node=True,
            fair_share=True,
        )

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Decide each priority class in turn on a board of the cluster (module docstring)."""
        if not state.jobs or not state.nodes:
            return Decision()
        riders: dict[int, int] = {}
        if self.packer is not None:
            self.packer.observe(state, now)
            riders = self.packer.riders(state)
        board = Board.build(state, riders)
        steps = Steps(
            slicing=self.slicing,
            moving=self.moving,
            packer=self.packer,
            fair_grace=self.fair_grace,
        )
        return decide_classes(board, lambda c, s: self._search(c, s, now), now, steps)

    def _search(self, priority: int, state: ClusterState, now: float) -> Solution | Decision:
        """Pollux's search for one class, warm-started from that class's last population.

        On GPUs of several types (and `types="aware"`), Sia's sizing instead.
        """
        kinds = {node.gpu_type for node in state.nodes if node.gpus}
        if self.types != "unaware" and len(kinds) > 1:
            if self._typed is None:
                # Here: scipy's solver loads only where GPUs of several types are sized.
                from gpuq.policies.sia.policy import SiaPolicy

                ours = self.types == "aware"
                self._typed = SiaPolicy(
                    p=self.typed_p,
                    starts=self.starts,
                    unknown="prior" if ours else "smallest",
                    shrink="idle" if ours else "any",
                    service=TYPED_SERVICE if ours else 0.0,
                )
            return self._typed.decide(state, now)
        self._previous = self._populations.get(priority)
        solution = self.solve(state, now)
        self._populations[priority] = self._previous
        return solution

    def problem(self, state: ClusterState, now: float) -> tuple[list[JobView], SearchProblem]:
        """Pollux's search problem for this instant, with gpuq's restart charges and budgets.

        Budgets per user where the jobs have several (`gpuq.policies.gpuq.shares`).
        """
        jobs, problem = self._charged(state, now)
        return jobs, with_budgets(jobs, problem, state.fair)

    def _charged(self, state: ClusterState, now: float) -> tuple[list[JobView], SearchProblem]:
        """Pollux's search problem for this instant, with gpuq's restart charges (module)."""
        jobs, problem = super().problem(state, now)
        idle = int(problem.base.sum()) < int(problem.node_gpus.sum())
        free_starts = self.starts == "free" or (self.starts == "idle" and idle)
        if not (free_starts or self.remaining_aware):
            return jobs, problem
        factors = problem.realloc_factor.copy()
        running = problem.base.sum(axis=0) > 0
        if free_starts:
            factors[~running] = 1.0
        if self.remaining_aware:
            penalty = (
                state.restart_penalty if self.restart_penalty is None else self.restart_penalty
            )
            for row in np.flatnonzero(running):
                factors[row] = min(factors[row], remaining_factor(jobs[row], penalty))
        return jobs, replace(problem, realloc_factor=factors)

    def save(self) -> dict[str, Any]:
        """Its memory (`Remembers`): the random generator, each class's population, packing's."""
        saved: dict[str, Any] = {"version": 3, "rng": self._rng.bit_generator.state}
        saved["classes"] = {
            str(priority): dump_population(population)
            for priority, population in sorted(self._populations.items())
            if population is not None
        }
        if self.packer is not None:
            saved["packing"] = self.packer.save()
        return saved

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned, or Pollux's memory as class 0's; ValueError if neither."""
        version = saved.get("version")
        if version == 1:  # one population, as pollux and earlier gpuq versions saved it
            super().restore(saved)
            self._populations = {0: self._previous} if self._previous is not None else {}
            return
        if version not in (2, 3):  # 2: before packing
            raise ValueError(f"not a saved {self.name} policy: unknown version {version!r}")
        super().restore({"version": 1, "rng": saved.get("rng")})
        try:
            populations = {int(k): load_population(v) for k, v in saved["classes"].items()}
            if self.packer is not None and version == 3:
                self.packer.restore(saved["packing"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a saved {self.name} policy: {exc}") from None
        self._populations = dict(populations)


def remaining_factor(job: JobView, penalty: float) -> float:
    """`L / (L + penalty)` for a running job that would finish in L seconds where it is.

    1.0 when L is unknown (no model or no remaining count) or infinite.
    """
    nodes = sum(1 for count in job.allocation if count > 0)
    left = remaining_time(job, nodes, job.gpus)
    if left is None or not math.isfinite(left) or left + penalty <= 0:
        return 1.0
    return left / (left + penalty)


__all__ = ["STARTS", "TIMESLICE", "GpuqPolicy", "remaining_factor"]
