"""The daemon's in-memory state and the one place job transitions happen.

`DaemonState` owns the store, the cache of unfinished jobs, the latest GPU
sample, the node jobs run on (`gpuq.daemon.node`: processes, GPUs and
per-job control sockets) and the event fan-out. Every transition
goes through `transition`, which commits to SQLite first and only then
updates memory and tells subscribers: the database is the truth, memory is
a cache of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpuq.config import Config
from gpuq.daemon import notify, reload, servers
from gpuq.daemon.executor import Outcome
from gpuq.daemon.hosted import Hosted
from gpuq.daemon.node.gang import GangNode
from gpuq.daemon.node.interface import Node
from gpuq.daemon.node.remote import RemoteNode
from gpuq.daemon.reload import ConfigWatch
from gpuq.daemon.scheduler import memory
from gpuq.daemon.scheduler.introspect import Introspection
from gpuq.daemon.scheduler.packs import PackBook
from gpuq.daemon.scheduler.slicer import Slicer, slicer_for
from gpuq.daemon.scheduler.typed import TypeFits
from gpuq.daemon.scheduler.typed import record as record_type_fit
from gpuq.daemon.scheduler.view import ViewCache
from gpuq.daemon.statedir import StateDirWatch, remember_last_id
from gpuq.daemon.store import Store
from gpuq.daemon.timings import DecisionTimes, LoopLag
from gpuq.errors import ConflictError, GpuqError, NotFoundError, StateError
from gpuq.models import TERMINAL_STATES, GpuInfo, Job, JobState
from gpuq.policies.interface import Decision, Policy
from gpuq.policies.registry import get_policy

if TYPE_CHECKING:
    from gpuq.daemon.scheduler.usage import Ledger


@dataclass
class GpuSnapshot:
    """The latest GPU sample with memory split by owner."""

    devices: list[GpuInfo] = field(default_factory=list)
    gpuq_memory: dict[str, int] = field(default_factory=dict)
    foreign_memory: dict[str, int] = field(default_factory=dict)
    jobs_on_gpu: dict[str, list[int]] = field(default_factory=dict)
    foreign_pids: dict[str, frozenset[int]] = field(default_factory=dict)
    """Per GPU, the processes on it that are not gpuq jobs'."""
    time: float = 0.0


log = logging.getLogger("gpuq.daemon")

RUNNING_STATES = frozenset({JobState.RUNNING, JobState.SUSPENDING})
"""States in which a job's command runs: only these count as run time."""


def account_run_time(job: Job, state: JobState, now: float, changes: dict[str, Any]) -> None:
    """Add the run-time fields a transition of `job` to `state` changes to `changes`.

    A run stops at the job's recorded end time when one is given (an exit
    seen after a daemon restart), else now.
    """
    if state in RUNNING_STATES:
        if job.running_since is None:
            changes.setdefault("running_since", now)
            if job.first_start_time is None:
                changes.setdefault("first_start_time", now)
    elif job.running_since is not None:
        stop = changes.get("end_time") or now
        changes["run_seconds"] = job.run_seconds + max(0.0, stop - job.running_since)
        changes["running_since"] = None


class DaemonState:
    """Everything the handlers and the scheduler share, on one event loop."""

    def __init__(self, config: Config, store: Store, node: Node, policy: Policy) -> None:
        self.config = config
        self.store = store
        self.node = node
        """The server jobs run on: launch, signals, GPU samples, control channels."""
        self.policy = policy
        self.slicer: Slicer | None = slicer_for(policy)
        """Turns on GPUs a time-slicing policy over-subscribes (`scheduler.slicer`)."""
        self.slicer_saved: str | None = None
        self.started = time.time()
        self.active: dict[int, Job] = {}
        self.waiting_reasons: dict[int, str] = {}
        self.sizing: dict[int, str] = {}
        """Why each running adaptive job has the GPUs it has: the policy's latest note."""
        self.gpus = GpuSnapshot()
        self.memory_peaks: dict[int, int] = {}
        self.child_pgids: dict[int, int] = {}
        self.next_begin: float | None = None
        self.latest_samples: dict[int, dict[str, Any]] = {}
        """Each active job's newest runner sample (`suspend.ChannelListener`), for the view."""
        self.type_fits: dict[int, TypeFits] = {}
        """Each job's newest model per GPU type (`gpuq.daemon.scheduler.typed`)."""
        self.profiled_gpus: dict[int, int] = {}
        """The most GPUs each active job held while its runner reported: explored counts."""
        self.view_cache = ViewCache()
        """Waiting jobs' views from the last pass (`scheduler.view`): a long queue costs little."""
        self.introspection = Introspection()
        """What the daemon measured of each job for packing (`scheduler.introspect`)."""
        self.packs = PackBook()
        """The packs carried out, and what they taught (`scheduler.packs`, `scheduler.packing`)."""
        self.fair_ledger: Ledger | None = None
        """Lab mode's fair-share accounting, loaded on the first pass (`scheduler.usage`)."""
        self.packs_saved: str | None = None
        self.policy_saved: str | None = None
        """The policy's memory as last kept in the store (`scheduler.memory`)."""
        self.decision_in_flight: asyncio.Future[Decision] | None = None
        """The policy's decision being made in a worker thread (`scheduler.tick.decide`)."""
        self.decision_times = DecisionTimes()
        """How long each policy's decisions took (`gpuq.daemon.timings`)."""
        self.loop_lag = LoopLag()
        """How late the event loop ran lately (`gpuq.daemon.timings.watch_loop`)."""
        self.unrecorded: dict[int, Outcome] = {}
        """Outcomes seen but not yet committed (a full disk); retried every second."""
        self.state_dir_watch: StateDirWatch | None = None
        self.config_watch = ConfigWatch(config.source)
        self.problems: dict[str, str] = {}
        """What the user must know about the daemon itself (full disk, state directory gone)."""
        self.hosted = Hosted(
            config.daemon.state_dir / "hosted", config.daemon.log_dir / "hosted", None
        )
        """Attempts this daemon runs for other servers' daemons (`gpuq.daemon.hosted`)."""
        self.background: set[asyncio.Task[None]] = set()
        """Work running beside the loop's handlers (checkpoint copies), kept until it ends."""
        self.remotes: dict[str, RemoteNode] = {}
        """The other servers, as nodes jobs run on (`gpuq.daemon.node.remote`), by host."""
        self.gangs: dict[int, GangNode] = {}
        """Multi-node jobs' current attempts, each as one node (`gpuq.daemon.node.gang`)."""
        self.safety_asked: dict[int, tuple[int, float]] = {}
        """Each job's attempt and when it last saved a safety checkpoint (`gpuq.daemon.safety`)."""
        self.safety_pulls: set[int] = set()
        """Jobs whose safety checkpoint is being copied here now."""
        self.wake = asyncio.Event()
        self.should_exit = asyncio.Event()
        self.connections: Counter[int] = Counter()
        """Open client connections by uid (`gpuq.daemon.connection.admit`)."""
        self.awaited: Counter[int] = Counter()
        """The jobs `wait` requests are waiting on now, each with how many are."""
        self.stop_reason = ""
        """Why the daemon is stopping, for its log: a signal, or who asked."""
        self.stopped_for_good: GpuqError | None = None
        """Set by a final `shutdown`: the error requests still in flight are answered with."""
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()

    # -- jobs -------------------------------------------------------------

    def load(self) -> None:
        """Fill the cache with every unfinished job from the store."""
        unfinished = [s for s in JobState if not s.is_terminal]
        self.active = {job.id: job for job in self.store.jobs(unfinished)}
        for job in self.active.values():
            if job.attempts and (sample := self.store.latest_sample(job.id)) is not None:
                self.latest_samples[job.id] = sample
                self.profiled_gpus[job.id] = self.store.most_gpus_sampled(job.id)
                record_type_fit(self.type_fits.setdefault(job.id, {}), sample)

    def job(self, job_id: int) -> Job:
        """A job from the cache or the store; NotFoundError if it never existed."""
        job = self.active.get(job_id) or self.store.get(job_id)
        if job is None:
            if self.store.array(job_id) and (tasks := self.store.array_task_ids(job_id)):
                raise NotFoundError(
                    f"{job_id} is an array, not a job: this takes one job",
                    f"give one of its tasks' ids, {tasks[0]} to {tasks[-1]} (gpuq show {job_id} "
                    "lists them)",
                )
            raise NotFoundError(f"no job {job_id}", self._missing_hint(job_id))
        return job

    def _missing_hint(self, job_id: int) -> str:
        """Why there is no job `job_id`: past the ids handed out, or removed (`gpuq clean`)."""
        highest = self.store.max_job_id()
        if not highest:
            return "no job was submitted"
        if 1 <= job_id <= highest:
            return (
                f"job ids so far run from 1 to {highest}; job {job_id} was removed by gpuq "
                "clean (or its id was skipped and never was a job's)"
            )
        return f"job ids so far run from 1 to {highest}"

    def server_health(self) -> list[dict[str, Any]]:
        """Each configured server's health, in the config's order (`gpuq.daemon.servers`)."""
        return servers.summary((s.host for s in self.config.cluster.servers), self.remotes)

    def node_of(self, job_id: int) -> Node:
        """The node the job's current attempt runs on: its parts, another server's, or this one."""
        gang = self.gangs.get(job_id)
        if gang is not None:
            return gang
        job = self.active.get(job_id)
        if job is not None and job.node:
            remote = self.remotes.get(job.node)
            if remote is not None:
                return remote
        return self.node

    def node_named(self, name: str) -> Node:
        """The node called `name` (this server's own name or an unknown one: this server)."""
        return self.remotes.get(name) or self.node

    def gpu_nodes(self, uuids: Iterable[str]) -> dict[str, tuple[str, ...]]:
        """The GPUs of `uuids` by node, nodes in order of their first GPU (unknown: this one)."""
        node_of = {gpu.uuid: gpu.node for gpu in self.gpus.devices}
        grouped: dict[str, list[str]] = {}
        for uuid in uuids:
            node = node_of.get(uuid, self.config.daemon.node_name)
            if node not in self.remotes:
                node = self.config.daemon.node_name
            grouped.setdefault(node, []).append(uuid)
        return {node: tuple(group) for node, group in grouped.items()}

    def gpu_types(self, uuids: Iterable[str]) -> str:
        """The types of the GPUs of `uuids`, sorted and comma-separated ("" for none)."""
        wanted = set(uuids)
        return ",".join(sorted({gpu.type for gpu in self.gpus.devices if gpu.uuid in wanted}))

    def gpu_node(self, uuids: Iterable[str]) -> str:
        """The name of the node whose GPUs these are (none: this server)."""
        wanted = set(uuids)
        for gpu in self.gpus.devices:
            if gpu.uuid in wanted and gpu.node in self.remotes:
                return gpu.node
        return self.config.daemon.node_name

    def resolve_ids(self, ids: Iterable[int]) -> list[int]:
        """Job ids, each array id replaced by the ids of its tasks (unknown ids kept), once each.

        `gpuq cancel 12 13`, 12 an array and 13 its first task, acts on 13 once.
        """
        resolved: dict[int, None] = {}
        for job_id in ids:
            resolved.update(dict.fromkeys(self.array_tasks(job_id) or [job_id]))
        return list(resolved)

    def array_tasks(self, array_id: int) -> list[int]:
        """The ids of the tasks of the array `array_id`; none if it is no array's id."""
        if array_id in self.active or self.store.get(array_id) is not None:
            return []  # a job's id, never an array's
        return self.store.array_task_ids(array_id) if self.store.array(array_id) else []

    def dependency_state(self, job_id: int) -> JobState | None:
        """The state a dependency on `job_id` sees: a job's, or an array's as a whole."""
        job = self.active.get(job_id) or self.store.get(job_id)
        if job is not None:
            return job.state
        return self.store.array_state(job_id)

    def with_reason(self, job: Job) -> Job:
        """The job with its current waiting reason filled in (pending jobs)."""
        reason = self.waiting_reasons.get(job.id)
        if reason and job.state is JobState.QUEUED:
            return replace(job, reason=reason)
        return job

    def transition(self, job: Job, state: JobState, reason: str, **changes: Any) -> Job:
        """Commit a transition, then update the cache, tell subscribers and notify.

        Run time is accounted here: time in `running` or `suspending`
        counts, time suspended or waiting does not. A job that reaches a
        final state runs its `--notify` command, whatever the state.
        """
        now = time.time()
        account_run_time(job, state, now, changes)
        updated = self.store.transition(job, state, reason, now, **changes)
        if state.is_terminal:
            self.active.pop(job.id, None)
            self.waiting_reasons.pop(job.id, None)
            self.sizing.pop(job.id, None)
            self.child_pgids.pop(job.id, None)
            self.latest_samples.pop(job.id, None)
            self.profiled_gpus.pop(job.id, None)
            self.type_fits.pop(job.id, None)
        else:
            self.active[job.id] = updated
        if self._subscribers:
            self.publish({"type": "job", "job": updated.to_dict(now=now)})
        self.wake.set()
        if state.is_terminal and updated.spec.notify:
            notify.run(self.store, updated)
        return updated

    def require(self, job_id: int, allowed: Iterable[JobState], action: str) -> Job:
        """The job, if its state allows `action`; else ConflictError."""
        job = self.job(job_id)
        allowed = frozenset(allowed)
        if job.state not in allowed:
            applies = f"{action} applies to {', '.join(sorted(s.value for s in allowed))} jobs"
            if job.state not in TERMINAL_STATES:
                now = f"it is {job.state.value}"
            elif allowed & TERMINAL_STATES:  # retry: that it ended is not the reason
                ended = {JobState.CANCELLED: "was cancelled", JobState.LOST: "was lost"}
                now = f"it {ended.get(job.state, job.state.value)} ({applies})"
            else:
                now = f"it has ended ({job.state.value})"
            raise ConflictError(f"cannot {action} job {job_id}: {now}", applies)
        return job

    # -- problems ---------------------------------------------------------

    def report_disk_full(self, detail: str) -> None:
        """Tell users (ls banner, doctor) that state cannot be written."""
        self.problems["disk"] = (
            f"the state directory {self.config.daemon.state_dir} is full or not writable "
            f"({detail}); free some space: what is pending is recorded as soon as it can be"
        )

    def clear_disk_full(self) -> None:
        """State can be written again."""
        self.problems.pop("disk", None)

    def check_state_dir(self) -> bool:
        """Look again at the state directory; False once it was deleted or replaced."""
        if self.state_dir_watch is None or "state_dir" in self.problems:
            return "state_dir" not in self.problems
        problem = self.state_dir_watch.problem()
        if problem is None:
            return True
        self.problems["state_dir"] = problem
        return False

    def require_state_dir(self) -> None:
        """Refuse work that would need the state directory once it is gone."""
        if not self.check_state_dir():
            raise StateError(
                self.problems["state_dir"],
                "gpuq daemon restart starts afresh in a new state directory (ids continue; "
                "jobs still running keep running but are not re-adopted)",
            )

    def remember_ids(self, last_id: int) -> None:
        """Keep the id high-water mark outside the database too (`gpuq.daemon.statedir`)."""
        try:
            remember_last_id(self.config.daemon.runtime_dir, last_id)
        except OSError as exc:
            log.warning("cannot write the id high-water mark: %s", exc)

    def warnings(self) -> list[str]:
        """The daemon's problems, for the `warnings` of replies (shown by `gpuq ls`, doctor)."""
        return [*self.problems.values(), *self.config_watch.warnings(self.config)]

    def reload_config(self) -> dict[str, Any]:
        """Apply the config file as it is now (`gpuq.daemon.reload`); ConfigError if invalid."""
        running, applied, restart = reload.reload(self.config)
        changed = running.scheduler.policy != self.config.scheduler.policy
        if changed:
            self.policy = get_policy(running.scheduler.policy)
            self.slicer = slicer_for(self.policy)
        self.config = running
        if changed:
            memory.restore(self)
            memory.restore_turns(self)
        self.config_watch.loaded(running.source)
        # What differs from what runs, not what ever differed: an edit undone needs no restart.
        self.config_watch.restart_needed = restart
        self.wake.set()
        source = None if running.source is None else str(running.source)
        return {"source": source, "applied": applied, "restart_needed": restart}

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
            "backend": self.node.gpu_backend,
            "gpus": len(self.gpus.devices),
            "policy": self.policy.name,
            "state_dir": str(self.config.daemon.state_dir),
            "runtime_dir": str(self.config.daemon.runtime_dir),
            "jobs": counts,
            "highest_job_id": self.store.max_job_id(),
            "warnings": self.warnings(),
            "loop_lag": self.loop_lag.summary(),
            "decisions": self.decision_times.summary(),
            "servers": self.server_health(),
        }
