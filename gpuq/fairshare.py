"""Fair share across users: decayed usage, Slurm's fair-share factor, limits and aging.

Pure logic, shared by the daemon (`gpuq.daemon.scheduler.tick` keeps a
`FairShare` and persists it) and the simulator (`gpuq.sim.engine` keeps the
very same accounting); the policies read the `Fairness` snapshot it makes
(`ClusterState.fair`, `gpuq.policies.fairness`). Stdlib only: the CLI and
the daemon import it without numpy.

Usage
    A user's usage is the GPU-seconds its jobs held, each decayed with the
    half-life `half_life` (`lab.half_life`, a week by default): a GPU-second
    used `t` seconds ago counts `2^(-t / half_life)`. Usage at a constant
    `g` GPUs over the last `s` seconds adds exactly
    `g * half_life / ln 2 * (1 - 2^(-s / half_life))` (`accrued`), so the
    figure does not depend on how often it is updated. A user whose usage
    decayed below `FORGET_BELOW` GPU-seconds is forgotten.
Fair-share factor (Slurm's classic formula, priority/multifactor)
    `F = 2^(-U / S)`, with `U` the user's usage over the usage of every
    user known (0 while nobody used anything) and `S` its share (`lab.shares`,
    default 1) over the shares of those users. The users known are those
    with usage and those with jobs in the queue; a user named in the
    configuration who neither used GPUs lately nor waits is left out (else
    every share would shrink with the length of the table). F is 1 for a
    user who used nothing, 0.5 for one whose usage is exactly its share,
    and falls towards 0 as it uses more.
Aging
    A job's effective priority within its priority class is `F + waited /
    aging` (`effective_priority`): every `aging` seconds of waiting (a day
    by default) add 1, the whole range of the factor. Linear and without a
    cap, so nothing starves: a job K submitted more than `aging` seconds
    after job J always ranks below it (K's priority is at most
    `1 + waited_K / aging`, less than `waited_J / aging`), so J is passed
    over only by jobs submitted before it or within `aging` after it. With
    a single user, ranking by it is first come, first served, as before.
Turns (`turn_shares`)
    Where jobs of several users take turns on an over-subscribed node, a
    job's part of the node's time is weighted by its owner's share over
    the GPUs that owner's jobs ask for there, so a user's jobs together
    compute for the user's share of the node, however many they are; with
    one user's jobs, or fair share off, each is owed G / D. The daemon's
    time-slicer and the simulator apply this one rule.
Limits (`lab.max_gpus`, `lab.max_running`, `lab.max_queued`; 0: none)
    A job whose owner already holds `max_gpus` GPUs (or would with it) or
    runs `max_running` jobs is not started; its reason says so
    (`limit_reason`). `max_queued` is checked at submission
    (`queued_limit_reason`). A memory share counts as one GPU per GPU it is on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_HALF_LIFE = 7 * 86400.0
"""Seconds after which usage counts half (Slurm's PriorityDecayHalfLife default)."""
DEFAULT_AGING = 86400.0
"""Seconds of waiting that add 1 to a job's effective priority (module docstring)."""
FORGET_BELOW = 1.0
"""GPU-seconds of decayed usage under which a user is dropped from the accounting."""


def decayed(usage: float, elapsed: float, half_life: float) -> float:
    """`usage` as it counts `elapsed` seconds later: halved every `half_life` seconds."""
    if elapsed <= 0:
        return usage
    return float(usage * 2.0 ** (-elapsed / half_life))


def accrued(gpus: float, seconds: float, half_life: float) -> float:
    """Decayed GPU-seconds of holding `gpus` GPUs over the last `seconds` (module docstring).

    The integral of `gpus * 2^(-t / half_life)` for t from 0 to `seconds`:
    a GPU-second just used counts 1, one used a half-life ago counts 1/2.
    """
    if gpus <= 0 or seconds <= 0:
        return 0.0
    return gpus * half_life / math.log(2.0) * -math.expm1(-seconds * math.log(2.0) / half_life)


def fair_share_factor(usage_norm: float, share_norm: float) -> float:
    """Slurm's `F = 2^(-U / S)`: 1 unused, 0.5 at its share, towards 0 above (0 without a share)."""
    if share_norm <= 0:
        return 0.0
    return float(2.0 ** (-max(usage_norm, 0.0) / share_norm))


def effective_priority(factor: float, waited: float, aging: float = DEFAULT_AGING) -> float:
    """A job's rank in its priority class: its owner's factor plus 1 per `aging` seconds waited."""
    return factor + max(waited, 0.0) / aging


def limit_reason(
    user: str,
    held_gpus: int,
    running: int,
    gpus: int,
    max_gpus: int = 0,
    max_running: int = 0,
) -> str | None:
    """Why `user`'s job of `gpus` GPUs may not start now, or None if its limits allow it.

    `held_gpus` and `running` are what the user's jobs hold and how many
    run; a limit of 0 is no limit.
    """
    if max_running > 0 and running >= max_running:
        return f"user {user or '?'} at max_running {max_running} ({running} running)"
    if max_gpus > 0 and held_gpus + gpus > max_gpus:
        return f"user {user or '?'} at max_gpus {max_gpus} (holds {held_gpus})"
    return None


def queued_limit_reason(user: str, queued: int, max_queued: int, adding: int = 1) -> str | None:
    """Why `adding` more jobs of `user` (who has `queued` waiting) are refused, or None.

    For the submission handler: `queued` counts the user's jobs not yet
    started or finished (held and queued); `max_queued` 0 is no limit.
    """
    if max_queued > 0 and queued + adding > max_queued:
        return (
            f"{user or '?'} has {queued} job(s) waiting; {adding} more would pass the lab's "
            f"limit of {max_queued} (max_queued)"
        )
    return None


@dataclass(frozen=True, slots=True)
class UserShare:
    """One user's standing: configured share, decayed usage (GPU-seconds) and factor."""

    share: float = 1.0
    usage: float = 0.0
    factor: float = 1.0
    share_norm: float = 1.0
    """Its share over the shares of every user known."""
    usage_norm: float = 0.0
    """Its usage over the usage of every user known (0 while nobody used any)."""


@dataclass(frozen=True, slots=True)
class Fairness:
    """What a policy knows of the users (`ClusterState.fair`; None: lab mode off).

    `users` maps each user known (module docstring) to its `UserShare`;
    a job's owner that it does not name counts with share 1 and factor 1.
    `max_gpus` and `max_running` are the per-user limits (0: none), and
    `aging` the seconds of waiting worth 1 of effective priority.
    `held` is the GPUs each user holds outside the state's jobs, counted
    against `max_gpus`: empty from the callers; the `gpuq` policy sets it
    when it sizes one priority class on what the others left.
    """

    users: Mapping[str, UserShare] = field(default_factory=dict)
    max_gpus: int = 0
    max_running: int = 0
    aging: float = DEFAULT_AGING
    held: Mapping[str, int] = field(default_factory=dict)

    def of(self, user: str) -> UserShare:
        """The user's standing (share 1, factor 1 for a user it does not know)."""
        return self.users.get(user) or UserShare()

    @property
    def limited(self) -> bool:
        """True if a per-user limit is set."""
        return self.max_gpus > 0 or self.max_running > 0


def turn_shares(
    gpus: int, members: Mapping[int, tuple[str, int]], fair: Fairness | None
) -> dict[int, float]:
    """Each member's part (at most 1) of the time of a node of `gpus` its jobs take turns on.

    `members` maps each job sharing the node to its owner and the GPUs it
    asks for there (module docstring, "Turns"). Each job's weight is 1, or
    with fair share and members of several users its owner's share over
    the GPUs its owner's members ask for; parts are proportional to the
    weights, and what a job cannot use (a part above 1) goes to the others
    by their weights, as the turns give it: the node's GPUs never idle
    while a member waits. Without shares that is G / D each, D the GPUs the
    members ask for together (1 each where D <= G).
    """
    sizes = {job_id: size for job_id, (_, size) in members.items()}
    demand = sum(sizes.values())
    if demand <= gpus:
        return dict.fromkeys(sizes, 1.0)
    asked: dict[str, int] = {}
    for user, size in members.values():
        asked[user] = asked.get(user, 0) + size
    if fair is None or len(asked) < 2:
        return dict.fromkeys(sizes, gpus / demand)
    weight = {
        job_id: fair.of(user).share / asked[user] if asked[user] else 0.0
        for job_id, (user, _) in members.items()
    }
    parts: dict[int, float] = {}
    while True:  # water-filling: fix the members whose part reaches 1, share out the rest
        left = [j for j in sizes if j not in parts]
        room = gpus - sum(sizes[j] for j in parts)
        weighed = sum(weight[j] * sizes[j] for j in left)
        if weighed <= 0:  # those left have no share: what remains goes to them evenly
            rest = sum(sizes[j] for j in left)
            parts.update((j, min(1.0, room / rest) if rest else 0.0) for j in left)
            return parts
        level = room / weighed
        full = [j for j in left if level * weight[j] >= 1.0]
        if not full:
            parts.update((j, level * weight[j]) for j in left)
            return parts
        parts.update((j, 1.0) for j in full)


@dataclass(slots=True)
class FairShare:
    """The users' decayed usage, kept up to date as jobs hold GPUs (module docstring).

    `usage` is every user's decayed GPU-seconds as of `updated`. Feed it
    with `record` (a user's GPUs over the seconds just past); read it with
    `snapshot` (for a policy) or `report` (for `gpuq share`).
    """

    half_life: float = DEFAULT_HALF_LIFE
    usage: dict[str, float] = field(default_factory=dict)
    updated: float = 0.0

    def __post_init__(self) -> None:
        if not self.half_life > 0 or not math.isfinite(self.half_life):
            raise ValueError(f"half_life must be positive and finite, got {self.half_life}")

    @classmethod
    def from_records(
        cls, records: Mapping[str, tuple[float, float]], now: float, half_life: float
    ) -> FairShare:
        """The accounting as stored (`Store.user_usage`: usage and when), decayed to `now`."""
        usage = {
            user: decayed(value, now - updated, half_life)
            for user, (value, updated) in records.items()
        }
        kept = {user: value for user, value in usage.items() if value >= FORGET_BELOW}
        return cls(half_life, kept, now)

    def advance(self, now: float) -> None:
        """Decay every user's usage to `now` (no-op for a `now` in the past)."""
        if now <= self.updated:
            return
        elapsed = now - self.updated
        usage = {
            user: decayed(value, elapsed, self.half_life) for user, value in self.usage.items()
        }
        self.usage = {user: value for user, value in usage.items() if value >= FORGET_BELOW}
        self.updated = now

    def record(self, user: str, gpus: float, seconds: float, now: float) -> None:
        """Charge `user` for holding `gpus` GPUs over the `seconds` that end at `now`."""
        self.advance(now)
        charge = accrued(gpus, seconds, self.half_life)
        if charge > 0:
            self.usage[user] = self.usage.get(user, 0.0) + charge

    def hold(self, holdings: Mapping[str, float], now: float) -> None:
        """Charge each user for its GPUs (`holdings`) from the last update until `now`."""
        seconds = now - self.updated
        if seconds > 0:
            self.record_all(holdings, seconds, now)

    def record_all(self, holdings: Mapping[str, float], seconds: float, now: float) -> None:
        """Charge each user for its GPUs (`holdings`) over the `seconds` that end at `now`."""
        self.advance(now)
        for user, gpus in sorted(holdings.items()):
            self.record(user, gpus, seconds, now)

    def standings(
        self, users: Iterable[str], share_of: Callable[[str], float]
    ) -> dict[str, UserShare]:
        """Each user known (`users` and those with usage) with its share, usage and factor."""
        known = sorted(set(users) | set(self.usage))
        shares = {user: max(share_of(user), 0.0) for user in known}
        total_share = sum(shares.values())
        total_usage = sum(self.usage.get(user, 0.0) for user in known)
        standing = {}
        for user in known:
            share_norm = shares[user] / total_share if total_share > 0 else 0.0
            used = self.usage.get(user, 0.0)
            usage_norm = used / total_usage if total_usage > 0 else 0.0
            factor = fair_share_factor(usage_norm, share_norm)
            standing[user] = UserShare(shares[user], used, factor, share_norm, usage_norm)
        return standing

    def snapshot(
        self,
        users: Iterable[str],
        share_of: Callable[[str], float],
        *,
        max_gpus: int = 0,
        max_running: int = 0,
        aging: float = DEFAULT_AGING,
    ) -> Fairness:
        """What a policy sees (`ClusterState.fair`), usage as of the last `advance`."""
        return Fairness(self.standings(users, share_of), max_gpus, max_running, aging)

    def report(
        self,
        users: Iterable[str],
        share_of: Callable[[str], float],
        waiting: Mapping[str, float] | None = None,
        aging: float = DEFAULT_AGING,
    ) -> list[dict[str, object]]:
        """One JSON-ready row per user known, for `gpuq share` (sorted by name).

        Each row: `user`, `share` (configured), `share_norm`, `usage`
        (decayed GPU-seconds), `usage_norm`, `factor` and `priority`: the
        effective priority of the user's longest-waiting job, from
        `waiting` (its seconds waited; None for a user with nothing waiting).
        """
        waits = waiting or {}
        rows: list[dict[str, object]] = []
        for user, standing in sorted(self.standings([*users, *waits], share_of).items()):
            waited = waits.get(user)
            priority = (
                None if waited is None else effective_priority(standing.factor, waited, aging)
            )
            rows.append(
                {
                    "user": user,
                    "share": standing.share,
                    "share_norm": standing.share_norm,
                    "usage": standing.usage,
                    "usage_norm": standing.usage_norm,
                    "factor": standing.factor,
                    "priority": priority,
                }
            )
        return rows


__all__ = [
    "DEFAULT_AGING",
    "DEFAULT_HALF_LIFE",
    "FORGET_BELOW",
    "FairShare",
    "Fairness",
    "UserShare",
    "accrued",
    "decayed",
    "effective_priority",
    "fair_share_factor",
    "limit_reason",
    "queued_limit_reason",
    "turn_shares",
]
