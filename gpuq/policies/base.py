"""The policy interface: `decide(view, now) -> Plan`, pure and deterministic.

The daemon builds a `ClusterView` from its state each scheduler pass and acts
on the returned `Plan`; the simulator does the same with simulated state.
Policies never read the clock, the database or the GPUs: all they know is in
the view, and `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True, slots=True)
class GpuState:
    """A schedulable GPU as a policy sees it.

    `memory_foreign` is memory held by processes gpuq did not start; it is
    never available to gpuq jobs.
    """

    uuid: str
    node: str
    memory_total: int
    memory_foreign: int = 0


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A job that may start now, if it fits.

    Dependencies, holds and begin times are already resolved by the caller.
    `gpu_mem` is None for whole GPUs, else the bytes needed on each of `gpus`
    shared GPUs. `time_limit` (seconds) lets backfill prove a job ends in time.
    """

    id: int
    priority: int
    submit_time: float
    gpus: int
    gpu_mem: int | None = None
    exclusive: bool = False
    time_limit: float | None = None


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs: whole ones (`gpu_mem` None) or a memory share of each."""

    id: int
    gpu_uuids: tuple[str, ...]
    gpu_mem: int | None = None
    exclusive: bool = False
    start_time: float = 0.0
    time_limit: float | None = None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """An immutable snapshot of everything a placement decision may use.

    `memory_margin` is the fraction of each GPU's memory never handed out to
    shared jobs (a safety margin against allocator overshoot).
    `foreign_tolerance` is how many bytes of foreign memory a GPU may hold and
    still count as free for a whole-GPU job.
    """

    gpus: tuple[GpuState, ...]
    pending: tuple[JobRequest, ...]
    running: tuple[RunningJob, ...] = ()
    memory_margin: float = 0.05
    foreign_tolerance: int = 512 * 1024**2


@dataclass(frozen=True, slots=True)
class Placement:
    """Start job `job_id` on `gpu_uuids`, reserving `gpu_mem` bytes on each.

    `gpu_mem` None means the GPUs are the job's alone.
    """

    job_id: int
    gpu_uuids: tuple[str, ...]
    gpu_mem: int | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do now: jobs to start, and why each other pending job waits."""

    start: tuple[Placement, ...] = ()
    waiting: Mapping[int, str] = field(default_factory=dict)


class Policy(Protocol):
    """A scheduling policy: a pure function of the view and the time."""

    name: str

    def decide(self, view: ClusterView, now: float) -> Plan:
        """Return the plan for this instant; must not mutate `view`."""
        ...
