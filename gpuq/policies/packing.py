"""Gandiva's packing with introspection: the rules `gandiva` and `gpuq` share.

Two jobs packed on one GPU compute at once. Time-slicing that GPU between
them instead gives each half its solo rate, 1.0 of solo in all, so a pack
pays only where the jobs' packed rates, each a fraction of its solo rate,
add up to more. Gandiva does not predict it: it profiles each job alone,
tries a pack, measures it, and keeps it or undoes it (paper sections 4.1,
4.2.2). Each policy decides which jobs to offer and where; these are the
measurements and the judgements:

Rates (`Rates`)
    Where the caller measures step times (the daemon, from the runner:
    `JobView.step_seconds`), a job's rate is 1 / step_seconds: its *solo
    rate* when it computed alone (`step_shared_with` empty; time waiting for
    a turn is not in a step), its *packed rate* (a fraction of solo) when it
    computed beside exactly one partner. A job without the runner reports
    no step times: it is never measured, so never packed.
Candidates (`profile`)
    A job asking for one GPU, not alone (`exclusive`), whose utilization
    (`gpu_utilization`, measured alone) and memory (`memory_peak`) are known
    and whose solo rate was measured: Gandiva profiles jobs alone first. A
    job whose utilization or memory is unknown counts as busy and is never
    packed.
Pairs (`pair_fits`)
    Both memory peaks fit in the GPU's memory together, and their
    utilizations add up to at most `max_utilization` (a gate against
    hopeless trials; the paper tries any pair). The policies add: both of
    one priority, and never a pair that failed before (packed slower than
    time-slicing, or one ran out of GPU memory beside the other:
    `JobView.oom_partners`).
Keep or undo (`judge`)
    A pack is a trial until both members' packed rates are measured. It is
    then kept while their sum exceeds `keep_threshold` (1.0: time-slicing's)
    and undone the first time it does not, with the reason "packed
    throughput 0.71 of time-sliced (0.36+0.35 of solo)".

Pure: no clock, no I/O; what is measured comes in the `ClusterState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuq.policies.interface import ClusterState, JobView


@dataclass(frozen=True, slots=True)
class Profile:
    """What packing knows of a candidate: its utilization alone (percent) and memory peak."""

    utilization: float
    memory: int


@dataclass(slots=True)
class Pack:
    """A packed pair under watch: its host, since when, and each member's latest packed rate."""

    host: int
    since: float
    rates: dict[int, float] = field(default_factory=dict)

    def save(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "host": self.host,
            "since": self.since,
            "rates": {str(j): r for j, r in self.rates.items()},
        }

    @classmethod
    def load(cls, data: Mapping[str, Any]) -> Pack:
        """`save`'s form read back (KeyError, TypeError or ValueError if it is not one)."""
        rates = {int(j): float(r) for j, r in data["rates"].items()}
        return cls(int(data["host"]), float(data["since"]), rates)


class Rates:
    """Solo and packed rates measured from the caller's step times (module docstring)."""

    def __init__(self) -> None:
        self.solo: dict[int, float] = {}
        """Each job's latest measured exclusive rate, iterations per second."""
        self.packed: dict[int, tuple[int, float]] = {}
        """Partner and packed rate measured at this decision, per packed job."""

    def observe(self, state: ClusterState, now: float) -> None:
        """Take in every job's step time as measured now; forget jobs that left."""
        self.packed = {}
        present = {job.id for job in state.jobs}
        self.solo = {j: rate for j, rate in self.solo.items() if j in present}
        for job in state.jobs:
            if job.step_seconds is not None:
                self.measured(job, job.step_seconds)
            else:
                self.unmeasured(job, now)

    def measured(self, job: JobView, step_seconds: float) -> None:
        """Take a step time the caller measured: solo alone, else packed beside its partner."""
        if step_seconds <= 0.0:
            return
        rate = 1.0 / step_seconds
        if not job.step_shared_with:
            self.solo[job.id] = rate
        elif len(job.step_shared_with) == 1 and self.solo.get(job.id, 0.0) > 0.0:
            self.packed[job.id] = (job.step_shared_with[0], rate / self.solo[job.id])

    def unmeasured(self, job: JobView, now: float) -> None:
        """A job the caller measured no step time for: nothing learned (a subclass may)."""

    def save(self) -> dict[str, Any]:
        """The solo rates, JSON-ready."""
        return {"solo": {str(job_id): rate for job_id, rate in self.solo.items()}}

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned (KeyError, TypeError or ValueError if it cannot)."""
        self.solo = {int(job_id): float(rate) for job_id, rate in saved["solo"].items()}
        self.packed = {}


def profile(job: JobView, solo_rate: float | None) -> Profile | None:
    """The job's profile if it may be packed at all (module docstring), else None."""
    if job.gpus_requested != 1 or job.exclusive:
        return None
    if job.gpu_utilization is None or job.memory_peak is None:
        return None
    if solo_rate is None or solo_rate <= 0.0:
        return None
    return Profile(job.gpu_utilization, job.memory_peak)


def pair_fits(guest: Profile, host: Profile, memory: int, max_utilization: float) -> bool:
    """True if both fit in `memory` bytes at once and are light enough together."""
    return (
        guest.memory + host.memory <= memory
        and guest.utilization + host.utilization <= max_utilization
    )


def trial_note(where: str, guest: Profile, host: Profile) -> str:
    """The reason of a new pack: "trial on n1 (utilization 30% + 30%)"."""
    return f"trial on {where} (utilization {guest.utilization:.0f}% + {host.utilization:.0f}%)"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the measurements say of a pack: still a trial, kept, or to undo; with the reason."""

    outcome: str
    note: str

    @property
    def undo(self) -> bool:
        """True if the pack is no better than time-slicing."""
        return self.outcome == "undone"


def judge(
    pack: Pack,
    guest: int,
    packed: Mapping[int, tuple[int, float]],
    keep_threshold: float,
    where: str,
) -> Verdict:
    """Take the members' packed rates measured now into `pack`; keep or undo it (docstring).

    `packed` is `Rates.packed`; `where` names the node for the reason.
    """
    for job_id, partner in ((guest, pack.host), (pack.host, guest)):
        measured = packed.get(job_id)
        if measured is not None and measured[0] == partner:
            pack.rates[job_id] = measured[1]
    if len(pack.rates) < 2 or guest not in pack.rates or pack.host not in pack.rates:
        return Verdict("trial", f"trial, measuring on {where}")
    total = pack.rates[guest] + pack.rates[pack.host]
    rates = f"{pack.rates[guest]:.2f}+{pack.rates[pack.host]:.2f} of solo"
    if total > keep_threshold:
        return Verdict("kept", f"kept, {total:.2f}x time-slicing ({rates}) on {where}")
    return Verdict(
        "undone", f"packed throughput {total:.2f} of time-sliced ({rates}), undone on {where}"
    )


__all__ = [
    "Pack",
    "Profile",
    "Rates",
    "Verdict",
    "judge",
    "pair_fits",
    "profile",
    "trial_note",
]
