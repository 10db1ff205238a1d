"""Fair share in the policies: queue order by effective priority, per-user limits, budgets.

The caller puts the users' standing in `ClusterState.fair`
(`gpuq.fairshare.Fairness`: shares, decayed usage, Slurm's factor, limits);
without it, or with a single user, nothing here changes a decision.

Queue order (`ranks`, used by `gpuq.policies.fifo.queue_order`)
    Within a priority class the users' waiting jobs are interleaved as a
    weighted fair queue: the next job is the one whose owner would then
    hold the fewest GPUs for its weight, counting the GPUs its jobs hold
    now and those of its jobs already put ahead in this order. A user's
    weight is its configured share times the effective priority of its
    next job (`gpuq.fairshare.effective_priority`: the fair-share factor of
    its decayed usage, plus the job's wait over `aging`). So GPUs that free
    up together are split by share rather than all going to one user, a
    user with less past usage gets more until the usage evens out, and a
    job that waits long enough goes first whoever owns it. A user's own
    jobs keep their order (submit time, id). Computed only where the jobs
    have at least two owners: with one, the order is first come, first
    served, as it always was.
Per-user limits (`UserBook`)
    What each user holds (GPUs and running jobs, plus `Fairness.held`)
    and books in one pass; a job that would take its owner over
    `max_gpus` or `max_running` waits with `limit_reason`'s reason ("user
    alice at max_gpus 8 (holds 8)").
Preemption for fair share (`fair_victims`, for the `gpuq` policy's admission)
    Within a priority class whose GPUs are all held, a user holding less
    than its budget (max-min fair by share over what the class holds and
    the users' waiting jobs ask) may take GPUs from users holding more:
    their gpuq.runner jobs that have run at least `grace` seconds, the most
    recently started first, never so many that the user falls below its
    budget, and for no more of the waiting user's jobs than its budget
    leaves room for. The victims checkpoint, so no work is lost.
Budgets (`budgets`, for the `gpuq` policy's goodput sizing)
    The GPUs a class sizes are split across its users max-min fair by
    their configured shares: a user gets what its jobs can use (`demands`)
    up to its weighted share of what the others leave, and every GPU the
    others leave over goes to the users who want more, in proportion to
    their shares. Whole GPUs: the remainders go to the users with the
    largest fractions, ties to the higher fair-share factor (the less
    usage), then the name.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpuq.fairshare import Fairness, effective_priority, limit_reason
from gpuq.policies.interface import ClusterState, JobView


def owners(jobs: Sequence[JobView]) -> set[str]:
    """The users owning `jobs`."""
    return {job.user for job in jobs}


def ranks(state: ClusterState, now: float) -> dict[int, float]:
    """Each waiting job's rank in its class (higher first), by id; empty without fair share.

    The rank is minus the job's place in its class's weighted fair queue
    (module docstring); running jobs count as what their owners hold.
    """
    fair = state.fair
    if fair is None or len(owners(state.jobs)) < 2:
        return {}
    held: dict[str, float] = {user: float(gpus) for user, gpus in fair.held.items()}
    classes: dict[int, list[JobView]] = {}
    for job in state.jobs:
        if (gpus := held_gpus(job)) > 0:
            held[job.user] = held.get(job.user, 0.0) + gpus
        else:
            classes.setdefault(job.priority, []).append(job)
    ranked: dict[int, float] = {}
    for waiting in classes.values():
        for place, job in enumerate(_fair_queue(waiting, fair, dict(held), now)):
            ranked[job.id] = -float(place)
    return ranked


def _fair_queue(
    jobs: Sequence[JobView], fair: Fairness, held: dict[str, float], now: float
) -> list[JobView]:
    """`jobs` of one class interleaved by weighted fair queueing (module docstring)."""
    queues: dict[str, list[JobView]] = {}
    for job in sorted(jobs, key=lambda j: (j.submit_time, j.id), reverse=True):
        queues.setdefault(job.user, []).append(job)  # each user's next job last

    def finish(user: str) -> tuple[float, float, float, int]:
        head = queues[user][-1]
        standing = fair.of(user)
        weight = standing.share * effective_priority(
            standing.factor, now - head.submit_time, fair.aging
        )
        need = max(head.min_gpus, 1)
        after = (held.get(user, 0.0) + need) / max(weight, 1e-12)
        return after, -standing.factor, head.submit_time, head.id

    heap = [(finish(user), user) for user in queues]
    heapq.heapify(heap)
    order: list[JobView] = []
    while heap:  # only the user just served changes its key
        _, user = heapq.heappop(heap)
        job = queues[user].pop()
        held[user] = held.get(user, 0.0) + max(job.min_gpus, 1)
        order.append(job)
        if queues[user]:
            heapq.heappush(heap, (finish(user), user))
    return order


def held_gpus(job: JobView) -> int:
    """GPUs a job holds: the GPUs it names (a memory share counts its GPUs), else its allocation."""
    return len(job.gpu_uuids) if job.gpu_uuids else sum(job.allocation)


class UserBook:
    """What each user holds and books in one pass, against the per-user limits."""

    def __init__(self, fair: Fairness, holders: Sequence[JobView] = ()) -> None:
        self.fair = fair
        self.gpus: dict[str, int] = dict(fair.held)
        self.running: dict[str, int] = {}
        for job in holders:
            self.hold(job.user, held_gpus(job))

    @classmethod
    def of(cls, state: ClusterState) -> UserBook | None:
        """The book of `state`'s running jobs, or None where no limit applies."""
        fair = state.fair
        if fair is None or not fair.limited:
            return None
        return cls(fair, [job for job in state.jobs if held_gpus(job) > 0])

    def hold(self, user: str, gpus: int) -> None:
        """Count a job of `user` holding `gpus` GPUs (a running job, or one the pass starts)."""
        self.gpus[user] = self.gpus.get(user, 0) + gpus
        self.running[user] = self.running.get(user, 0) + 1

    def reason(self, job: JobView, gpus: int | None = None) -> str | None:
        """Why `job` may not start on `gpus` GPUs (default: its minimum), or None."""
        fair = self.fair
        asked = max(job.min_gpus, 1) if gpus is None else gpus
        user = job.user
        return limit_reason(
            user,
            self.gpus.get(user, 0),
            self.running.get(user, 0),
            asked,
            fair.max_gpus,
            fair.max_running,
        )

    def room(self, user: str) -> int | None:
        """GPUs `user` may still take under `max_gpus` (None: no such limit)."""
        if self.fair.max_gpus <= 0:
            return None
        return max(self.fair.max_gpus - self.gpus.get(user, 0), 0)


def budgets(
    demands: Mapping[str, int],
    weights: Mapping[str, float],
    total: int,
    tie_break: Mapping[str, float] | None = None,
) -> dict[str, int]:
    """Whole GPUs per user: max-min fair by `weights`, each within its demand (module docstring).

    A user with no weight gets what the others leave. `tie_break` (higher
    first: the fair-share factor) decides which users get the remainders
    of equal fractions. The budgets add up to `min(total, sum of demands)`.
    """
    wanted = {user: max(int(demand), 0) for user, demand in demands.items()}
    left = max(int(total), 0)
    if sum(wanted.values()) <= left:
        return dict(wanted)
    given = dict.fromkeys(wanted, 0)
    open_users = {user for user, demand in wanted.items() if demand > 0}
    while left > 0 and open_users:
        weight = {user: max(weights.get(user, 1.0), 0.0) for user in open_users}
        total_weight = sum(weight.values())
        if total_weight <= 0:
            weight = dict.fromkeys(open_users, 1.0)
            total_weight = float(len(open_users))
        level = left / total_weight
        sated = {u for u in open_users if wanted[u] - given[u] <= level * weight[u] + 1e-9}
        if sated:
            for user in sated:
                left -= wanted[user] - given[user]
                given[user] = wanted[user]
            open_users -= sated
            continue
        exact = {user: level * weight[user] for user in open_users}
        for user in open_users:
            given[user] += math.floor(exact[user] + 1e-9)
        left = max(int(total), 0) - sum(given.values())
        order = sorted(
            open_users,
            key=lambda u: (
                -(exact[u] - math.floor(exact[u] + 1e-9)),
                -(tie_break or {}).get(u, 0.0),
                u,
            ),
        )
        for user in order[:left]:
            given[user] += 1
        break
    return given


@dataclass(frozen=True, slots=True)
class FairVictims:
    """Whom fair share lets preempt whom in a class: the victims and the asks they yield to."""

    victims: frozenset[int]
    asks: tuple[JobView, ...]
    budgets: Mapping[str, int]
    held: Mapping[str, int]


def fair_victims(
    holders: Sequence[JobView],
    asks: Sequence[JobView],
    fair: Fairness,
    now: float,
    grace: float,
    gpus_of: Callable[[JobView], int] = held_gpus,
) -> FairVictims | None:
    """The class's runner jobs that fair share lets its waiting asks take (module docstring).

    `holders` are the class's whole-GPU jobs holding GPUs (`gpus_of`
    each; a victim must be `preemptible`); `asks` its waiting whole-GPU
    jobs in queue order. None
    where no user is under its budget with a job waiting, or none over it
    with a job it may give up.
    """
    held: dict[str, int] = {}
    for job in holders:
        held[job.user] = held.get(job.user, 0) + gpus_of(job)
    need: dict[str, int] = {}
    for job in asks:
        need[job.user] = need.get(job.user, 0) + max(job.min_gpus, 1)
    users = set(held) | set(need)
    if len(users) < 2 or not need:
        return None
    demand = {user: held.get(user, 0) + need.get(user, 0) for user in users}
    shares = {user: fair.of(user).share for user in users}
    factors = {user: fair.of(user).factor for user in users}
    budget = budgets(demand, shares, sum(held.values()), factors)
    room = {user: budget[user] - held.get(user, 0) for user in users}
    chosen: list[JobView] = []
    for job in asks:
        wanted = max(job.min_gpus, 1)
        if room[job.user] >= wanted:
            chosen.append(job)
            room[job.user] -= wanted
    spare = {user: held.get(user, 0) - budget[user] for user in users}
    victims: set[int] = set()
    candidates = sorted(
        (
            job
            for job in holders
            if job.preemptible and not job.suspended and now - job.start_time >= grace
        ),
        key=lambda job: (-job.start_time, -job.id),
    )
    for job in candidates:
        gpus = gpus_of(job)
        if 0 < gpus <= spare[job.user]:
            victims.add(job.id)
            spare[job.user] -= gpus
    if not chosen or not victims:
        return None
    return FairVictims(frozenset(victims), tuple(chosen), budget, held)


__all__ = ["FairVictims", "UserBook", "budgets", "fair_victims", "held_gpus", "owners", "ranks"]
