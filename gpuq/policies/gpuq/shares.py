"""Fair share in the `gpuq` policy's goodput sizing: a budget of GPUs per user.

Where the jobs a class sizes belong to several users (`JobView.user`,
with `ClusterState.fair` set), the search gets a budget per user
(`SearchProblem.user_caps`), and no user's jobs hold more than it:

1. each user's demand is what Pollux's greedy (`greedy_counts`, restart
   charges included) gives that user's jobs alone on the class's GPUs: the
   GPUs they can use with a gain;
2. the budgets split the GPUs max-min fair by the configured shares
   (`gpuq.policies.fairness.budgets`): a user wanting less than its share
   gets all it wants, the others share the rest by their shares, and the
   remainders of the integer split go to the larger fractions, then the
   higher fair-share factor. Where the demands fit together, there are no
   budgets at all: nobody is held back while GPUs would stay idle;
3. a per-user `max_gpus` caps the budget further, less what the user holds
   outside the class's sizing (`Fairness.held`).

Then the search maximizes its goodput objective within the budgets, so
each user's jobs share its budget as Pollux shares a cluster. Why budgets
rather than weights on speedups: Pollux's objective is fair per job, so a
user with ten times the jobs would get about ten times the GPUs whatever
its weight; a budget makes a user's GPU share its configured share (or
all it can use), whatever its number of jobs.

Budgets follow the configured shares, not the usage: a split a user can
predict from `gpuq share`, which no quiet week swings to one user. Decayed
usage (the fair-share factor) decides who goes first where shares cannot
split exactly: the remainders above, and the queue of jobs waiting for a
minimum to start (`gpuq.policies.fairness.ranks`).

With one user and no limit, or without `fair`, the problem is unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from gpuq.fairshare import Fairness
from gpuq.policies.fairness import budgets
from gpuq.policies.interface import JobView
from gpuq.policies.pollux.greedy import greedy_counts
from gpuq.policies.pollux.search import SearchProblem


def alone(problem: SearchProblem, columns: np.ndarray) -> SearchProblem:
    """The problem of the jobs in `columns` alone on the same GPUs (no user budgets)."""
    return replace(
        problem,
        base=problem.base[:, columns],
        max_gpus=problem.max_gpus[columns],
        min_gpus=problem.min_gpus[columns],
        speedup=problem.speedup[columns],
        realloc_factor=problem.realloc_factor[columns],
        allowed=None if problem.allowed is None else problem.allowed[:, columns],
        users=None,
        user_caps=None,
    )


def demands(jobs: list[JobView], problem: SearchProblem) -> dict[str, int]:
    """GPUs each user's jobs can use with a gain: the greedy's count for them alone."""
    owners = np.array([job.user for job in jobs], dtype=object)
    wanted = {}
    for user in sorted(set(owners)):
        columns = np.flatnonzero(owners == user)
        wanted[user] = int(greedy_counts(alone(problem, columns)).sum())
    return wanted


def user_caps(jobs: list[JobView], problem: SearchProblem, fair: Fairness) -> dict[str, int] | None:
    """Each user's budget of the class's GPUs (module docstring); None where none is needed."""
    users = sorted({job.user for job in jobs})
    total = int(problem.node_gpus.sum())
    room = {
        user: max(fair.max_gpus - fair.held.get(user, 0), 0) if fair.max_gpus > 0 else total
        for user in users
    }
    caps = dict(room)
    if len(users) > 1:
        wanted = demands(jobs, problem)
        if sum(wanted.values()) > total:
            wanted = {user: min(wanted[user], room[user]) for user in users}
            shares = {user: fair.of(user).share for user in users}
            factors = {user: fair.of(user).factor for user in users}
            split = budgets(wanted, shares, total, factors)
            caps = {user: min(split[user], room[user]) for user in users}
    if all(cap >= total for cap in caps.values()):
        return None
    return caps


def with_budgets(
    jobs: list[JobView], problem: SearchProblem, fair: Fairness | None
) -> SearchProblem:
    """`problem` with each user's budget (`user_caps`), or unchanged where none applies."""
    if fair is None:
        return problem
    caps = user_caps(jobs, problem, fair)
    if caps is None:
        return problem
    order = sorted(caps)
    index = {user: i for i, user in enumerate(order)}
    return replace(
        problem,
        users=np.array([index[job.user] for job in jobs], dtype=np.intp),
        user_caps=np.array([caps[user] for user in order], dtype=np.int16),
    )


__all__ = ["demands", "user_caps", "with_budgets"]
