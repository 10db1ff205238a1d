"""FIFO with EASY backfill: the `fifo` policy.

Rules, each tested in `tests/test_policy_fifo.py`:

Order
    Pending jobs are considered by priority (highest first), then submit time
    (oldest first), then id (lowest first).

Capacity (see `gpuq.policies.placement`)
    A GPU held by a whole-GPU or exclusive job is fully taken. A shared GPU
    offers `memory_total * (1 - memory_margin) - memory_foreign - shares`.

Requests
    - Whole GPUs (`gpu_mem` None, exclusive or not): `gpus` GPUs no gpuq job
      holds, each with foreign memory at most `foreign_tolerance`; placed on
      as few nodes as possible (the fullest node that fits, then view order).
    - Shared (`gpu_mem` set): `gpus` distinct GPUs not taken by a whole-GPU or
      exclusive job, each with at least `gpu_mem` free; placed best-fit (least
      memory left that still fits, ties by view order) to leave big holes for
      big jobs.
    - Exclusive with `gpu_mem`: the job takes its GPUs alone (no gpuq job may
      be there or join it) but only needs `gpu_mem` beside the foreign memory;
      foreign tolerance does not apply. The placement carries `gpu_mem`.
    - CPU-only (`gpus` 0) always starts, with no GPUs and no `gpu_mem`.
    - A request the hardware can never hold (more GPUs than exist, more memory
      than any GPU offers after the margin) waits with a reason such as
      "needs 4 GPUs; this server has 2". Foreign memory never makes a job
      impossible, only waiting, since other users' processes come and go.

Backfill (EASY)
    Walking the order, the first job that does not fit (impossible ones
    excepted) is the head. Its shadow time is the earliest time it fits if
    every running job, including those started in this pass, ends at
    `start_time + time_limit`; jobs without a time limit never end for this
    purpose. The GPUs it would get then are reserved for it. If no such time
    exists there is no reservation and every later job that fits starts.
    Otherwise a later job starts if it fits and either has a time limit with
    `now + time_limit <= shadow time` (it may use any GPU) or fits on GPUs not
    reserved for the head. Only the head gets a reservation, so jobs further
    back may be passed over indefinitely by smaller ones, as in EASY.

Waiting reasons
    Every pending job not started gets a short reason: what it waits for
    ("waiting for 2 free GPUs (0 free)", "waiting for 6.0G on a shared GPU
    (largest free 3.5G)"), "behind job 12 (reserved GPUs)" when it fits only
    on the head's GPUs, or why it can never run.

Cost
    Jobs of the same shape share one cached outcome and reason string until
    the next placement, and a request that does not fit is rejected in
    constant time from sorted free amounts, so a pass costs about
    O(jobs log jobs + placements x GPUs log GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from gpuq.policies.base import ClusterView, JobRequest, Placement, Plan
from gpuq.policies.placement import Capacity, Hardware, Hold

_Shape = tuple[int, int | None, bool]


@dataclass(frozen=True, slots=True)
class Reservation:
    """The head job's promised GPUs (view indices) and when they free up."""

    job_id: int
    shadow_time: float
    gpus: frozenset[int]


def queue_order(pending: tuple[JobRequest, ...]) -> list[JobRequest]:
    """Pending jobs in scheduling order: priority desc, submit time asc, id asc."""
    # Three stable single-key sorts are about three times faster than one tuple key.
    ordered = sorted(pending, key=attrgetter("id"))
    ordered.sort(key=attrgetter("submit_time"))
    ordered.sort(key=attrgetter("priority"), reverse=True)
    return ordered


def find_reservation(
    capacity: Capacity,
    head: JobRequest,
    endings: list[tuple[float, int, Hold]],
    now: float,
) -> Reservation | None:
    """The earliest time and GPUs at which `head` fits as jobs end, if any.

    `endings` lists `(end time, job id, hold)` of every job with a time limit;
    they are released in that order on a copy of `capacity`.
    """
    simulated = capacity.copy()
    for end, _, hold in sorted(endings, key=lambda ending: (ending[0], ending[1])):
        simulated.release(hold)
        gpus = simulated.choose(head.gpus, head.gpu_mem, head.exclusive)
        if gpus is not None:
            return Reservation(head.id, max(end, now), frozenset(gpus))
    return None


class FifoBackfill:
    """First come, first served by priority, with EASY backfill (module docstring)."""

    name: str = "fifo"

    def decide(self, view: ClusterView, now: float) -> Plan:
        """Start what fits in queue order, backfilling around the head's reservation."""
        return _Pass(view, now).run()


class _Pass:
    """One walk of the queue, with caches that hold until the next placement."""

    def __init__(self, view: ClusterView, now: float) -> None:
        self.view = view
        self.now = now
        self.capacity = Capacity.from_view(view)
        self.hardware = Hardware(view)
        self.endings: list[tuple[float, int, Hold]] = [
            (job.start_time + job.time_limit, job.id, self.capacity.hold_of(job))
            for job in view.running
            if job.time_limit is not None
        ]
        self.head: JobRequest | None = None
        self.reservation: Reservation | None = None
        self.behind = ""
        # Both caches rely on capacity only shrinking between placements.
        self.reasons: dict[tuple[_Shape, bool], str] = {}
        self.thresholds: dict[tuple[int, bool, bool], tuple[int, int]] = {}

    def run(self) -> Plan:
        """Walk the queue once and return the plan."""
        starts: list[Placement] = []
        waiting: dict[int, str] = {}
        uuids = tuple(gpu.uuid for gpu in self.view.gpus)
        for job in queue_order(self.view.pending):
            if job.gpus <= 0:
                starts.append(Placement(job.id, ()))
                continue
            never = self.hardware.impossible_reason(job.gpus, job.gpu_mem)
            if never is not None:
                waiting[job.id] = never
                continue
            reservation = self.reservation
            restricted = reservation is not None and (
                job.time_limit is None or self.now + job.time_limit > reservation.shadow_time
            )
            key = ((job.gpus, job.gpu_mem, job.exclusive), restricted)
            reason = self.reasons.get(key)
            if reason is None:
                outcome = self._try(job, restricted)
                if not isinstance(outcome, str):
                    starts.append(Placement(job.id, tuple(uuids[i] for i in outcome), job.gpu_mem))
                    continue
                reason = self.reasons[key] = outcome
            waiting[job.id] = reason
        return Plan(start=tuple(starts), waiting=waiting)

    def _try(self, job: JobRequest, restricted: bool) -> tuple[int, ...] | str:
        """Place `job` and book its GPUs, or say why it waits."""
        reservation = self.reservation if restricted else None
        if job.gpu_mem is not None:
            # Shares of any size: decide by threshold, without looking at each GPU.
            limit_key = (job.gpus, job.exclusive, restricted)
            limits = self.thresholds.get(limit_key)
            if limits is None:
                anywhere = self.capacity.summary().threshold(job.gpus, job.exclusive)
                here = anywhere
                if reservation is not None:
                    here = self.capacity.summary(reservation.gpus).threshold(
                        job.gpus, job.exclusive
                    )
                limits = self.thresholds[limit_key] = (here, anywhere)
            if job.gpu_mem > limits[0]:
                return self.behind if job.gpu_mem <= limits[1] else self._waiting(job)
        excluded = reservation.gpus if reservation is not None else frozenset()
        gpus = self.capacity.choose(job.gpus, job.gpu_mem, job.exclusive, excluded)
        if gpus is None:
            fits = self.capacity.summary().fits(job.gpus, job.gpu_mem, job.exclusive)
            return self.behind if fits else self._waiting(job)
        hold = Hold(job.id, gpus, job.gpu_mem, job.exclusive)
        self.capacity.hold(hold)
        self.reasons.clear()
        self.thresholds.clear()
        if job.time_limit is not None:
            self.endings.append((self.now + job.time_limit, job.id, hold))
        return gpus

    def _waiting(self, job: JobRequest) -> str:
        """What `job` waits for; the first job to wait becomes the head."""
        reason = self.capacity.summary().wait_reason(job.gpus, job.gpu_mem, job.exclusive)
        if self.head is None:
            self.head = job
            self.reservation = find_reservation(self.capacity, job, self.endings, self.now)
            self.behind = f"behind job {job.id} (reserved GPUs)"
        return reason
