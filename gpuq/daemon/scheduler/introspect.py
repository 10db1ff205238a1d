"""Introspection: what the daemon measures of each job, for Gandiva's packing decisions.

Gandiva packs jobs whose GPU utilization is low and keeps a pack only while
the jobs' measured progress beats time-slicing. The policy sees a clock-free
`ClusterState`; here the daemon turns what it observes into the
`JobView` fields the policy reads (`enrich`):

- **Step time** (`step_seconds`, `step_shared_with`): each runner sample's
  mean step time covers the window since the job's previous sample (the
  runner leaves out time spent parked). At each pass the daemon notes, for
  every job computing, the jobs computing on its GPUs at the same time; a
  sample counts only if that set did not change during its window, and is
  then reported with that set: alone (a solo measurement) or beside its
  packed partner (a packed one). A window that straddles a pack or an
  unpack is dropped, so no measurement mixes the two.
- **Utilization** (`gpu_utilization`): the mean of the GPU's last
  `UTILIZATION_SAMPLES` utilization samples taken while the job computed
  alone on it (NVML's figure, or the fake GPU's).
- **Memory peak** (`memory_peak`): the largest of what its runner reported,
  what the GPUs showed it holding (over all its attempts) and the need
  raised after it ran out of memory packed (`PackBook.raised`).
- `packed_with` and `oom_partners` from the `PackBook`, and the state's
  `gpu_memory`: the smallest memory any GPU offers a job (margin and other
  users' memory taken off). A guest on its way to its host's GPU (a pack
  being made, the guest queued) is shown where it is going, as the
  time-slicer shows a job checkpointed for its turn.

Times are the daemon's and the runner's clocks (one machine). Pure.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpuq.daemon.scheduler.packs import PackBook
from gpuq.models import Job, JobState
from gpuq.policies.interface import ClusterState, JobView

if TYPE_CHECKING:  # the daemon's state holds an Introspection
    from gpuq.daemon.state import GpuSnapshot

UTILIZATION_SAMPLES = 10
"""How many exclusive utilization samples a job's figure averages."""
COMPUTING = frozenset({JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING})
"""States of a job whose process may compute on its GPUs (not waiting for a turn)."""


@dataclass(frozen=True, slots=True)
class StepMeasurement:
    """A mean step time measured over one window, and who computed beside the job then."""

    seconds: float
    shared_with: tuple[int, ...]
    time: float


@dataclass(slots=True)
class _Seen:
    """What the daemon knows of one job's configuration and measurements."""

    sharing: frozenset[int] = frozenset()
    changed: float = 0.0
    last_sample: float | None = None
    step: StepMeasurement | None = None
    utilization: deque[float] = field(default_factory=lambda: deque(maxlen=UTILIZATION_SAMPLES))
    memory: int = 0


class Introspection:
    """Per-job measurements for packing (module docstring)."""

    def __init__(self) -> None:
        self._jobs: dict[int, _Seen] = {}

    def observe(
        self, jobs: Iterable[Job], samples: Mapping[int, Mapping[str, Any]], now: float
    ) -> None:
        """Take in new runner samples, then note who computes beside whom from now on."""
        active = [job for job in jobs if job.state.is_active]
        running = [job for job in active if job.state in COMPUTING and job.gpu_uuids]
        for job in active:
            seen = self._jobs.setdefault(job.id, _Seen(changed=now))  # its past is unknown
            self._sample(job, seen, samples.get(job.id))
        on_gpu: dict[str, set[int]] = {}
        for job in running:
            for uuid in job.gpu_uuids:
                on_gpu.setdefault(uuid, set()).add(job.id)
        for job in running:
            seen = self._jobs[job.id]
            sharing = frozenset().union(*(on_gpu[uuid] for uuid in job.gpu_uuids)) - {job.id}
            if sharing != seen.sharing:
                seen.sharing, seen.changed = sharing, now
        alive = {job.id for job in active}
        self._jobs = {j: seen for j, seen in self._jobs.items() if j in alive}

    def _sample(self, job: Job, seen: _Seen, sample: Mapping[str, Any] | None) -> None:
        """Attribute a new sample's step time to the job's configuration, if it held throughout."""
        if not sample or not isinstance(sample.get("time"), int | float):
            return
        taken = float(sample["time"])
        if seen.last_sample is not None and taken <= seen.last_sample:
            return
        known = [t for t in (seen.last_sample, job.start_time) if t is not None]
        start = max(known) if known else None  # the window: since the last sample or the start
        seen.last_sample = taken
        seconds = sample.get("step_seconds")
        if start is None or start < seen.changed or not isinstance(seconds, int | float):
            return
        if seconds > 0:
            seen.step = StepMeasurement(float(seconds), tuple(sorted(seen.sharing)), taken)

    def note_utilization(
        self, snapshot: GpuSnapshot, jobs: Iterable[Job], memory: Mapping[int, int]
    ) -> None:
        """Credit each GPU's utilization to the one job computing on it alone, if one does."""
        on_gpu: dict[str, list[int]] = {}
        for job in jobs:
            if job.state in COMPUTING:
                for uuid in job.gpu_uuids:
                    on_gpu.setdefault(uuid, []).append(job.id)
        for gpu in snapshot.devices:
            ids = on_gpu.get(gpu.uuid, [])
            if len(ids) == 1 and gpu.utilization is not None and ids[0] in self._jobs:
                self._jobs[ids[0]].utilization.append(float(gpu.utilization))
        for job_id, used in memory.items():
            if job_id in self._jobs:
                self._jobs[job_id].memory = max(self._jobs[job_id].memory, used)

    def step(self, job_id: int) -> StepMeasurement | None:
        """The job's latest clean step-time measurement, if any."""
        seen = self._jobs.get(job_id)
        return None if seen is None else seen.step

    def utilization(self, job_id: int) -> float | None:
        """The job's mean utilization computing alone, if it was ever sampled so."""
        seen = self._jobs.get(job_id)
        if seen is None or not seen.utilization:
            return None
        return sum(seen.utilization) / len(seen.utilization)

    def memory(self, job_id: int) -> int:
        """The most GPU memory the job was seen holding (0 if never)."""
        seen = self._jobs.get(job_id)
        return 0 if seen is None else seen.memory


def gpu_memory(state: ClusterState) -> int | None:
    """The smallest memory any of the state's GPUs offers a job, or None without GPUs."""
    usable = [
        int(g.memory_total * (1 - state.memory_margin)) - g.memory_foreign for g in state.gpus
    ]
    return max(0, min(usable)) if usable else None


def enrich(state: ClusterState, introspection: Introspection, book: PackBook) -> ClusterState:
    """`state` with what the daemon measured and the packs it carries out (module docstring)."""
    held = {view.id: view.allocation for view in state.jobs if view.gpu_uuids}
    jobs: list[JobView] = []
    for view in state.jobs:
        changes: dict[str, Any] = {}
        record = book.of(view.id)
        if record and record.phase == "packing" and record.guest == view.id and not view.gpu_uuids:
            if record.host in held:  # on its way to its host's GPU: the policy sees it there
                changes.update(allocation=held[record.host], suspended=True)
        step = introspection.step(view.id)
        if step is not None:
            changes.update(step_seconds=step.seconds, step_shared_with=step.shared_with)
        utilization = introspection.utilization(view.id)
        if utilization is not None:
            changes["gpu_utilization"] = utilization
        peak = max(
            view.memory_peak or 0, introspection.memory(view.id), book.raised.get(view.id, 0)
        )
        if peak > 0:
            changes["memory_peak"] = peak
        if partners := book.partners(view.id):
            changes["packed_with"] = partners
        if failed := book.oom_partners(view.id):
            changes["oom_partners"] = failed
        jobs.append(replace(view, **changes) if changes else view)
    return replace(state, jobs=tuple(jobs), gpu_memory=gpu_memory(state))
