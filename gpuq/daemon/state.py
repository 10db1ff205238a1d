"""The daemon's in-memory state and the one place job transitions happen.

`DaemonState` owns the store, the cache of unfinished jobs, the latest GPU
sample, the per-job control sockets and the event fan-out. Every transition
goes through `transition`, which commits to SQLite first and only then
updates memory and tells subscribers: the database is the truth, memory is
a cache of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuq.config import Config
from gpuq.daemon.control import CONTROL_DIR, ControlHub
from gpuq.daemon.executor import Executor
from gpuq.daemon.store import Store
from gpuq.errors import ConflictError, NotFoundError
from gpuq.gpus import GpuBackend
from gpuq.models import GpuInfo, Job, JobState
from gpuq.policies.base import Policy


@dataclass
class GpuSnapshot:
    """The latest GPU sample with memory split by owner."""

    devices: list[GpuInfo] = field(default_factory=list)
    gpuq_memory: dict[str, int] = field(default_factory=dict)
    foreign_memory: dict[str, int] = field(default_factory=dict)
    jobs_on_gpu: dict[str, list[int]] = field(default_factory=dict)
    time: float = 0.0


class DaemonState:
    """Everything the handlers and the scheduler share, on one event loop."""

    def __init__(
        self,
        config: Config,
        store: Store,
        backend: GpuBackend,
        executor: Executor,
        policy: Policy,
        control: ControlHub | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.backend = backend
        self.executor = executor
        self.policy = policy
        self.control = control or ControlHub(config.daemon.runtime_dir / CONTROL_DIR)
        """The per-job control sockets to `gpuq.runner` (`gpuq.daemon.control`)."""
        self.started = time.time()
        self.active: dict[int, Job] = {}
        self.waiting_reasons: dict[int, str] = {}
        self.gpus = GpuSnapshot()
        self.memory_peaks: dict[int, int] = {}
        self.child_pgids: dict[int, int] = {}
        self.next_begin: float | None = None
        self.wake = asyncio.Event()
        self.should_exit = asyncio.Event()
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    # -- jobs -------------------------------------------------------------

    def load(self) -> None:
        """Fill the cache with every unfinished job from the store."""
        unfinished = [s for s in JobState if not s.is_terminal]
        self.active = {job.id: job for job in self.store.jobs(unfinished)}

    def job(self, job_id: int) -> Job:
        """A job from the cache or the store; NotFoundError if it never existed."""
        job = self.active.get(job_id) or self.store.get(job_id)
        if job is None:
            highest = self.store.max_job_id()
            raise NotFoundError(
                f"no job {job_id}",
                f"job ids so far run from 1 to {highest}" if highest else "no job was submitted",
            )
        return job

    def with_reason(self, job: Job) -> Job:
        """The job with its current waiting reason filled in (pending jobs)."""
        reason = self.waiting_reasons.get(job.id)
        if reason and job.state is JobState.QUEUED:
            return replace(job, reason=reason)
        return job

    def transition(self, job: Job, state: JobState, reason: str, **changes: Any) -> Job:
        """Commit a transition, then update the cache and tell subscribers."""
        updated = self.store.transition(job, state, reason, time.time(), **changes)
        if state.is_terminal:
            self.active.pop(job.id, None)
            self.waiting_reasons.pop(job.id, None)
            self.child_pgids.pop(job.id, None)
        else:
            self.active[job.id] = updated
        self.publish({"type": "job", "job": updated.to_dict()})
        self.wake.set()
        return updated

    def require(self, job_id: int, allowed: Iterable[JobState], action: str) -> Job:
        """The job, if its state allows `action`; else ConflictError."""
        job = self.job(job_id)
        allowed = frozenset(allowed)
        if job.state not in allowed:
            raise ConflictError(
                f"cannot {action} job {job_id}: it is {job.state.value}",
                f"{action} applies to {', '.join(sorted(s.value for s in allowed))} jobs",
            )
        return job

    # -- events -----------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        """A queue that receives every event from now on (bounded)."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=10_000)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        """Stop delivering events to `queue`."""
        self._subscribers.discard(queue)

    def publish(self, event: dict[str, Any]) -> None:
        """Fan an event out; a subscriber too slow to keep up loses events."""
        for queue in self._subscribers:
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(event)

    def status(self) -> dict[str, Any]:
        """The daemon's own facts for `gpuq daemon status`."""
        counts: dict[str, int] = {}
        for job in self.active.values():
            counts[job.state.value] = counts.get(job.state.value, 0) + 1
        return {
            "pid": os.getpid(),
            "started": self.started,
            "uptime": time.time() - self.started,
            "node": self.config.daemon.node_name,
            "backend": self.backend.kind,
            "gpus": len(self.gpus.devices),
            "policy": self.policy.name,
            "state_dir": str(self.config.daemon.state_dir),
            "runtime_dir": str(self.config.daemon.runtime_dir),
            "jobs": counts,
            "highest_job_id": self.store.max_job_id(),
        }
