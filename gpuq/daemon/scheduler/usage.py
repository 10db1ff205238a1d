"""Lab mode's fair-share accounting in the daemon: charge, persist, show to the policy.

The scheduler pass (`gpuq.daemon.scheduler.tick`) calls `fair_view` when
`lab.enabled`: it charges each user for the GPUs its jobs hold, from the
previous pass until now (`FairShare.hold`: the GPUs held at this pass,
over the time since the last one; passes follow every start and end, so
the error is a pass interval at each change), saves the accounting to the
store every `SAVE_EVERY` seconds (`Store.save_user_usage`; a restart loses
at most that much), and gives the policy the users' standing
(`ClusterState.fair`) and each job's owner (`JobView.user`). The
accounting is loaded from the store (`Store.user_usage`, decayed to now)
on the first pass. `share_rows` is the data of `gpuq share`.

Without `lab.enabled` none of this runs and the policy's state has no
`fair`: it decides as it always did.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gpuq.fairshare import FairShare
from gpuq.models import JobState
from gpuq.policies.interface import ClusterState

if TYPE_CHECKING:
    from gpuq.daemon.state import DaemonState

SAVE_EVERY = 60.0
"""Seconds between saves of the users' usage to the store."""
HOLDING = frozenset({JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING})
"""States in which a job's GPUs are charged to its owner (a suspended job's are not)."""


@dataclass(slots=True)
class Ledger:
    """The daemon's accounting, and when it was last saved."""

    account: FairShare
    saved: float


def ledger(state: DaemonState, now: float) -> Ledger:
    """The state's ledger, loaded from the store on first use; half-life as configured now."""
    half_life = state.config.lab.half_life
    kept = state.fair_ledger
    if kept is None:
        account = FairShare.from_records(state.store.user_usage(), now, half_life)
        kept = state.fair_ledger = Ledger(account, now)
    elif kept.account.half_life != half_life:  # a reload changed it: same usage, new decay
        old = kept.account
        kept.account = FairShare(half_life, dict(old.usage), old.updated)
    return kept


def holdings(state: DaemonState) -> dict[str, float]:
    """GPUs each user's jobs hold now (jobs computing or about to)."""
    held: dict[str, float] = {}
    for job in state.active.values():
        if job.state in HOLDING and job.gpu_uuids:
            held[job.spec.user] = held.get(job.spec.user, 0.0) + len(job.gpu_uuids)
    return held


def charge(state: DaemonState, now: float) -> FairShare:
    """Charge the GPUs held since the last pass; save every `SAVE_EVERY` seconds."""
    book = ledger(state, now)
    book.account.hold(holdings(state), now)
    if now - book.saved >= SAVE_EVERY:
        state.store.save_user_usage(dict(book.account.usage), book.account.updated)
        book.saved = now
    return book.account


def fair_view(state: DaemonState, cluster: ClusterState, now: float) -> ClusterState:
    """`cluster` with the users' standing (`fair`), after charging usage up to `now`."""
    lab = state.config.lab
    account = charge(state, now)
    users = {job.spec.user for job in state.active.values()}
    fair = account.snapshot(
        users,
        lab.share_of,
        max_gpus=lab.max_gpus,
        max_running=lab.max_running,
        aging=lab.aging,
    )
    return replace(cluster, fair=fair)


def share_rows(state: DaemonState, now: float) -> list[dict[str, object]]:
    """`gpuq share`'s rows: per user, share, usage, factor and effective priority.

    Usage is charged up to `now` first. A user's `priority` is that of its
    longest-waiting queued job (None: nothing waiting); see
    `gpuq.fairshare.FairShare.report` for the fields.
    """
    lab = state.config.lab
    account = charge(state, now)
    waiting: dict[str, float] = {}
    for job in state.active.values():
        if job.state is JobState.QUEUED:
            waited = now - job.submit_time
            waiting[job.spec.user] = max(waiting.get(job.spec.user, waited), waited)
    users = {job.spec.user for job in state.active.values()}
    return account.report(users, lab.share_of, waiting, lab.aging)


__all__ = ["SAVE_EVERY", "charge", "fair_view", "holdings", "ledger", "share_rows"]
