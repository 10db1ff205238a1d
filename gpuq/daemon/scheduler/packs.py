"""The daemon's book of packed jobs: which pairs share a GPU, and what it learned from them.

A pack is carried out in steps (`gpuq.daemon.scheduler.packing`), each
committed here before it is acted on, so that a daemon killed in the middle
finishes or undoes it after a restart:

- `packing`: the guest is joining the host's GPUs (started there, or given
  its turn back while the host computes);
- `packed`: both compute on the GPUs at once;
- `unpacking`: one member (`leaving`) is being taken off the shared GPUs
  (parked or stopped for its turn, or checkpointed to restart elsewhere).

It also keeps, per job, what packing taught: the partners beside which it
ran out of GPU memory (never packed together again), the memory need raised
after that, and how many times it was requeued for it (not counted as
retries). Entries of jobs that ended are dropped (`prune`). Pure: saved as
JSON with the policy's memory (`gpuq.daemon.scheduler.memory`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpuq.policies.interface import JobView

PHASES = ("packing", "packed", "unpacking")


@dataclass(frozen=True, slots=True)
class PackRecord:
    """One packed pair: `host` held `gpu_uuids` when `guest` joined it.

    `reason` is the reason of the step in progress, `since` when that step
    began, and `daemon` the start time of the daemon that committed it (a
    step committed by an earlier daemon is finished "after a restart").
    """

    host: int
    guest: int
    gpu_uuids: tuple[str, ...]
    phase: str
    reason: str
    since: float
    daemon: float
    leaving: int | None = None

    @property
    def members(self) -> frozenset[int]:
        """The two jobs of the pack."""
        return frozenset((self.host, self.guest))

    def partner(self, job_id: int) -> int:
        """The other member."""
        return self.guest if job_id == self.host else self.host


class PackBook:
    """Packed pairs and what packing learned (module docstring)."""

    def __init__(self) -> None:
        self.records: dict[frozenset[int], PackRecord] = {}
        self.failed: set[frozenset[int]] = set()
        """Pairs of which one ran out of GPU memory while packed with the other."""
        self.raised: dict[int, int] = {}
        """A job's GPU memory need, per GPU, raised after it ran out of memory packed."""
        self.oom_requeues: dict[int, tuple[int, ...]] = {}
        """The attempts of a job that ran out of memory packed, and were requeued for it."""

    def of(self, job_id: int) -> PackRecord | None:
        """The pack the job is in, if any."""
        return next((r for r in self.records.values() if job_id in r.members), None)

    def partners(self, job_id: int) -> tuple[int, ...]:
        """The jobs packed with this one (`JobView.packed_with`): none once an unpack began."""
        record = self.of(job_id)
        if record is None or record.phase == "unpacking":
            return ()
        return (record.partner(job_id),)

    def oom_partners(self, job_id: int) -> tuple[int, ...]:
        """The jobs beside which this one ran out of GPU memory, packed."""
        return tuple(sorted(j for pair in self.failed if job_id in pair for j in pair - {job_id}))

    def put(self, record: PackRecord) -> None:
        """Add or replace the record of its pair."""
        self.records[record.members] = record

    def step(self, record: PackRecord, **changes: Any) -> PackRecord:
        """The record with `changes` (phase, reason, since, ...), put in place of the old one."""
        updated = replace(record, **changes)
        self.put(updated)
        return updated

    def drop(self, record: PackRecord) -> None:
        """Forget the pair's record."""
        self.records.pop(record.members, None)

    def prune(self, active: Iterable[int]) -> bool:
        """Forget what concerns only jobs that ended; True if anything was forgotten."""
        alive = set(active)
        before = self.save()
        self.records = {k: r for k, r in self.records.items() if k <= alive}
        self.failed = {pair for pair in self.failed if pair <= alive}
        self.raised = {j: n for j, n in self.raised.items() if j in alive}
        self.oom_requeues = {j: n for j, n in self.oom_requeues.items() if j in alive}
        return self.save() != before

    def save(self) -> dict[str, Any]:
        """Everything, JSON-ready."""
        return {
            "version": 1,
            "records": [
                {**asdict(r), "gpu_uuids": list(r.gpu_uuids)}
                for r in sorted(self.records.values(), key=lambda r: (r.host, r.guest))
            ],
            "failed": sorted(sorted(pair) for pair in self.failed),
            "raised": {str(j): n for j, n in sorted(self.raised.items())},
            "oom_requeues": {str(j): list(a) for j, a in sorted(self.oom_requeues.items())},
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned; ValueError if it is not that."""
        if saved.get("version") != 1:
            raise ValueError(f"unknown pack book version {saved.get('version')!r}")
        try:
            records = [
                PackRecord(
                    int(r["host"]),
                    int(r["guest"]),
                    tuple(str(u) for u in r["gpu_uuids"]),
                    str(r["phase"]),
                    str(r["reason"]),
                    float(r["since"]),
                    float(r["daemon"]),
                    None if r.get("leaving") is None else int(r["leaving"]),
                )
                for r in saved["records"]
            ]
            failed = {frozenset(int(j) for j in pair) for pair in saved["failed"]}
            raised = {int(j): int(n) for j, n in saved["raised"].items()}
            requeues = {int(j): tuple(int(n) for n in a) for j, a in saved["oom_requeues"].items()}
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"damaged pack book: {exc}") from exc
        if any(r.phase not in PHASES for r in records):
            raise ValueError("damaged pack book: unknown phase")
        self.records = {r.members: r for r in records}
        self.failed, self.raised, self.oom_requeues = failed, raised, requeues


def computing(job: JobView) -> bool:
    """True if the job computes on GPUs now: it holds some and is not suspended."""
    return bool(job.gpu_uuids) and not job.suspended


def anchor_of(group: Iterable[int], jobs: Mapping[int, JobView]) -> int:
    """The member of a packed group the others join: computing first, then holding GPUs, by id."""
    members = sorted(group)
    for wanted in (computing, lambda job: bool(job.gpu_uuids)):
        found = [j for j in members if j in jobs and wanted(jobs[j])]
        if found:
            return found[0]
    return members[0]


def guests_of(packed: Iterable[Iterable[int]], jobs: Mapping[int, JobView]) -> dict[int, int]:
    """Each packed member that is not its group's anchor, with its anchor.

    Only members that hold no GPUs or the anchor's: one still holding other
    GPUs (parked there for a turn, or being moved) is not a guest yet.
    """
    guests: dict[int, int] = {}
    for group in packed:
        members = set(group)
        if len(members) < 2:
            continue
        anchor = anchor_of(members, jobs)
        held = set(jobs[anchor].gpu_uuids) if anchor in jobs else set()
        for j in members - {anchor}:
            if j in jobs and (not jobs[j].gpu_uuids or set(jobs[j].gpu_uuids) == held):
                guests[j] = anchor
    return guests
