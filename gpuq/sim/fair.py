"""Users in the simulator: the lab's fair-share settings, its accounting, and what it measures.

A workload whose jobs name users (`WorkloadJob.user`: a `user` column, or
`assign_users` / `copies_for_users`) runs with fair share: the engine keeps
a `gpuq.fairshare.FairShare`, exactly as the daemon does in lab mode,
charges each user the GPU-seconds its jobs held in each tick (a
time-sliced job its share), and gives the policy the standing as of the
decision (`ClusterState.fair`, with every user of an active job). A
workload without users runs as it always did (no `fair`).

`SimLab` holds the `[lab]` settings the simulator uses (shares, half-life,
per-user limits, aging); `UserTick` is what each user held and had waiting
in one tick (`SimResult.user_ticks`), from which `gpu_time_shares`
computes each user's share of the GPU-time over any set of ticks, such as
those where every user had a job waiting (`all_backlogged`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuq.fairshare import DEFAULT_AGING, DEFAULT_HALF_LIFE, Fairness, FairShare


@dataclass(frozen=True, slots=True)
class SimLab:
    """The lab settings of a simulation (`gpuq.config.LabConfig`'s fair-share keys).

    `shares` maps users to their share (1 for a user it does not name);
    the limits are 0 for none.
    """

    shares: Mapping[str, float] = field(default_factory=dict)
    half_life: float = DEFAULT_HALF_LIFE
    max_gpus: int = 0
    max_running: int = 0
    aging: float = DEFAULT_AGING

    def share_of(self, user: str) -> float:
        """The user's configured share (1 if not named)."""
        return float(self.shares.get(user, 1.0))

    def accounting(self) -> FairShare:
        """A fresh accounting with this half-life, as of time 0."""
        return FairShare(self.half_life)

    def snapshot(self, account: FairShare, users: Iterable[str]) -> Fairness:
        """What the policy sees for the users of the active jobs."""
        return account.snapshot(
            users,
            self.share_of,
            max_gpus=self.max_gpus,
            max_running=self.max_running,
            aging=self.aging,
        )


@dataclass(frozen=True, slots=True)
class UserTick:
    """One tick, per user: GPUs held (time-sliced shares counted as such), jobs waiting, active.

    `waiting` counts the user's active jobs that held no GPU in the tick.
    """

    time: float
    gpus: Mapping[str, float]
    waiting: Mapping[str, int]
    active: Mapping[str, int]


def all_backlogged(tick: UserTick) -> bool:
    """True if at least two users have jobs and every one of them has a job waiting."""
    users = [user for user, count in tick.active.items() if count]
    return len(users) > 1 and all(tick.waiting.get(user, 0) > 0 for user in users)


def gpu_time_shares(
    ticks: Sequence[UserTick], keep: Callable[[UserTick], bool] = lambda tick: True
) -> dict[str, float]:
    """Each user's fraction of the GPU-time held over the ticks `keep` selects."""
    totals: dict[str, float] = {}
    for tick in ticks:
        if keep(tick):
            for user, gpus in tick.gpus.items():
                totals[user] = totals.get(user, 0.0) + gpus
    grand = sum(totals.values())
    return {user: value / grand for user, value in sorted(totals.items())} if grand else {}


def max_min_shares(demands: Mapping[str, float], shares: Mapping[str, float]) -> dict[str, float]:
    """Max-min fair fractions of one unit: users wanting less than their share get it all.

    `demands` are fractions of the cluster each user could use; the rest is
    split by `shares` among those wanting more (continuous water-filling).
    """
    left, result = 1.0, dict.fromkeys(demands, 0.0)
    open_users = {user for user, demand in demands.items() if demand > 0}
    while open_users and left > 1e-12:
        weight = sum(shares.get(user, 1.0) for user in open_users)
        level = left / weight
        sated = {u for u in open_users if demands[u] <= level * shares.get(u, 1.0)}
        if not sated:
            for user in open_users:
                result[user] = level * shares.get(user, 1.0)
            break
        for user in sated:
            result[user] = demands[user]
            left -= demands[user]
        open_users -= sated
    return result


__all__ = [
    "SimLab",
    "UserTick",
    "all_backlogged",
    "gpu_time_shares",
    "max_min_shares",
]
