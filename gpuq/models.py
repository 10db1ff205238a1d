"""Shared value types: job specs, jobs, states, GPUs and events.

Frozen dataclasses with explicit JSON encodings. The daemon stores them, the
protocol carries them, policies and the simulator read them; nothing here
does I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gpuq.gputypes import gpu_type

JSON_SCHEMA_VERSION = 1
"""Version of the `--json` job/GPU object schema (docs/json-schema.md)."""
HOST_PATTERN: Final = r"(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9_][A-Za-z0-9._-]*"
"""A server's name: an ssh destination (host or ssh alias, optionally user@), never `-...`."""
LABEL_PATTERN: Final = r"[A-Za-z0-9][A-Za-z0-9._-]*"
"""A node label, such as `a100` or `fast-disk`."""


class JobState(enum.StrEnum):
    """Where a job is in its lifecycle (DESIGN.md section 5)."""

    HELD = "held"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        """True once the job will never run again without `gpuq retry`."""
        return self in TERMINAL_STATES

    @property
    def is_active(self) -> bool:
        """True while a job process may exist (it holds its GPUs)."""
        return self in ACTIVE_STATES


TERMINAL_STATES = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST}
)
ACTIVE_STATES = frozenset(
    {JobState.STARTING, JobState.RUNNING, JobState.SUSPENDING, JobState.SUSPENDED}
)
PENDING_STATES = frozenset({JobState.HELD, JobState.QUEUED})


class DependencyKind(enum.StrEnum):
    """When a dependency is satisfied: Slurm's afterok / afterany / afternotok."""

    OK = "ok"
    ANY = "any"
    NOTOK = "notok"


@dataclass(frozen=True, slots=True)
class Dependency:
    """This job may start only after `job_id` ends in a way `kind` accepts."""

    job_id: int
    kind: DependencyKind = DependencyKind.OK

    def satisfied_by(self, state: JobState) -> bool | None:
        """True if satisfied, False if it never can be, None if not yet known."""
        if not state.is_terminal:
            return None
        succeeded = state is JobState.SUCCEEDED
        if self.kind is DependencyKind.ANY:
            return True
        if self.kind is DependencyKind.OK:
            return succeeded
        return not succeeded

    def __str__(self) -> str:
        return f"{self.job_id}:{self.kind.value}"


@dataclass(frozen=True, slots=True)
class SignalSpec:
    """Send `signal` to the job `seconds` before its time limit or a preemption."""

    signal: int
    seconds: float


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What the user asked for; immutable once submitted.

    `gpus` is the number of whole GPUs, or, with `gpu_mem`, the number of GPU
    shares of that many bytes each (packing). `gpu_mem_auto` asks gpuq to use
    the memory peak learned from earlier runs of a job with the same name.
    `gpus_max` makes the job adaptive (`--gpus MIN-MAX`): a policy that
    allocates by goodput gives it from `gpus` to `gpus_max` GPUs and may
    resize it through its runner's checkpoint; others give it `gpus`.
    Placement constraints: `nodes` (run only on one of these servers; empty:
    any), `exclude_nodes` (never on these) and `labels` (only on a server
    carrying every one of them), by node name (`daemon.node_name` or a
    `[[cluster.servers]]` host). `node_count` above 1 makes a multi-node
    job (`--nodes N`): one process on each of that many servers, each with
    `gpus / node_count` whole GPUs, started, stopped and ended together.
    `gpu_types` (`--gpu-type`): only on GPUs of one of these types
    (`gpuq.gputypes`; empty: any). `uid` is the owner's user id, set by the
    daemon from the submitting process's credentials (SO_PEERCRED), never
    from the request; in lab mode the job runs as that user.
    """

    command: tuple[str, ...]
    cwd: str
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    name: str = ""
    user: str = ""
    gpus: int = 1
    gpus_max: int | None = None
    gpu_mem: int | None = None
    gpu_mem_auto: bool = False
    exclusive: bool = False
    priority: int = 0
    after: tuple[Dependency, ...] = ()
    hold: bool = False
    begin: float | None = None
    time_limit: float | None = None
    retries: int = 0
    requeue: bool = False
    output: str = ""
    error: str | None = None
    signal: SignalSpec | None = None
    notify: str | None = None
    array_index: int | None = None
    array_parallel: int | None = None
    nodes: tuple[str, ...] = ()
    exclude_nodes: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()
    node_count: int = 1
    gpu_types: tuple[str, ...] = ()
    uid: int | None = None

    @property
    def multi_node(self) -> bool:
        """True for a job that runs one part on each of several servers (`--nodes N`)."""
        return self.node_count > 1

    @property
    def constrained(self) -> bool:
        """True when the job may not run on every server (`--node`, `--exclude-node`, `--label`)."""
        return bool(self.nodes or self.exclude_nodes or self.labels)

    @property
    def shares_gpu(self) -> bool:
        """True when the job asks for part of a GPU rather than whole GPUs."""
        return self.gpu_mem is not None or self.gpu_mem_auto

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready encoding (the environment included: store and wire only).

        A shallow copy of the fields (every field is a plain value, or
        converted below): `dataclasses.asdict` deep-copies, which made
        encoding a 5,000-task array a second of the daemon's time.
        """
        data = {name: getattr(self, name) for name in _SPEC_FIELDS}
        data["command"] = list(self.command)
        data["env"] = dict(self.env)
        data["after"] = [str(dep) for dep in self.after]
        data["signal"] = None if self.signal is None else [self.signal.signal, self.signal.seconds]
        for name in _NAME_LISTS:
            data[name] = list(data[name])
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """Decode `to_dict` output; the protocol layer validates types first."""
        values = dict(data)
        values["command"] = tuple(values["command"])
        values["env"] = dict(values.get("env") or {})
        values["after"] = tuple(parse_dependency(str(d)) for d in values.get("after") or ())
        sig = values.get("signal")
        values["signal"] = None if sig is None else SignalSpec(int(sig[0]), float(sig[1]))
        for name in _NAME_LISTS:
            values[name] = tuple(values.get(name) or ())
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


_SPEC_FIELDS: Final = tuple(f.name for f in dataclasses.fields(JobSpec))
_NAME_LISTS: Final = ("nodes", "exclude_nodes", "labels", "gpu_types")
"""Spec fields that are tuples of names (lists in JSON)."""


def parse_dependency(text: str) -> Dependency:
    """Parse `ID` or `ID:ok|any|notok`; raises ValueError on bad input."""
    job_text, _, kind_text = text.partition(":")
    kinds = {k.value for k in DependencyKind}
    if not job_text.isdigit() or int(job_text) <= 0 or (kind_text and kind_text not in kinds):
        raise ValueError(f"bad dependency {text!r}")
    return Dependency(int(job_text), DependencyKind(kind_text or "ok"))


@dataclass(frozen=True, slots=True)
class Job:
    """A submitted job and everything gpuq knows about it now."""

    id: int
    spec: JobSpec
    state: JobState
    reason: str = ""
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    gpu_mem_reserved: int | None = None
    node: str = ""
    attempts: int = 0
    array_id: int | None = None
    stdout_path: str = ""
    stderr_path: str = ""
    retry_at: float | None = None
    first_start_time: float | None = None
    run_seconds: float = 0.0
    running_since: float | None = None

    @property
    def part_nodes(self) -> tuple[str, ...]:
        """The servers of the attempt's parts, rank 0 first (one for a single-node job).

        A multi-node job's `node` lists them with commas (`head,gpu2`).
        """
        return tuple(self.node.split(",")) if self.node else ()

    def run_time(self, now: float) -> float:
        """Seconds the job's command has run, over all attempts, suspended time excluded."""
        if self.running_since is None:
            return self.run_seconds
        return self.run_seconds + max(0.0, now - self.running_since)

    def to_dict(self, *, with_env: bool = False, now: float | None = None) -> dict[str, Any]:
        """The documented `--json` job object (docs/json-schema.md); `now` for `run_time`."""
        spec = self.spec.to_dict()
        if not with_env:
            spec.pop("env")
        return {
            "id": self.id,
            "name": self.spec.name,
            "user": self.spec.user,
            "state": self.state.value,
            "reason": self.reason,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "gpus": self.spec.gpus,
            "gpus_max": self.spec.gpus_max,
            "gpu_mem": self.spec.gpu_mem,
            "gpu_uuids": list(self.gpu_uuids),
            "gpu_mem_reserved": self.gpu_mem_reserved,
            "node": self.node,
            "priority": self.spec.priority,
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "first_start_time": self.first_start_time,
            "run_time": self.run_time(time.time() if now is None else now),
            "running_since": self.running_since,
            "retry_at": self.retry_at,
            "attempts": self.attempts,
            "array_id": self.array_id,
            "array_index": self.spec.array_index,
            "stdout": self.stdout_path,
            "stderr": self.stderr_path,
            "spec": spec,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Job:
        """Decode the `--json` job object back into a Job (its run time as of the encoding)."""
        return cls(
            id=int(data["id"]),
            spec=JobSpec.from_dict(data["spec"]),
            state=JobState(data["state"]),
            reason=str(data.get("reason") or ""),
            submit_time=float(data.get("submit_time") or 0.0),
            start_time=data.get("start_time"),
            end_time=data.get("end_time"),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            gpu_uuids=tuple(data.get("gpu_uuids") or ()),
            gpu_mem_reserved=data.get("gpu_mem_reserved"),
            node=str(data.get("node") or ""),
            attempts=int(data.get("attempts") or 0),
            array_id=data.get("array_id"),
            stdout_path=str(data.get("stdout") or ""),
            stderr_path=str(data.get("stderr") or ""),
            retry_at=data.get("retry_at"),
            first_start_time=data.get("first_start_time"),
            run_seconds=float(data.get("run_time") or 0.0),
        )


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One transition in a job's append-only history, with its reason."""

    job_id: int
    time: float
    state: JobState
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON encoding used by `gpuq show --json`."""
        return {"time": self.time, "state": self.state.value, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding memory on a GPU, as the backend sees it."""

    pid: int
    used_memory: int | None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One schedulable GPU (or MIG instance), identified by UUID.

    `memory_used` is everything in use on the device; the daemon splits it
    into gpuq's jobs and other processes using `processes`. GPUs of a node
    with the same non-empty `link_group` share a PCIe switch or an NVLink
    (a multi-GPU job placed within one group talks fastest); empty where the
    topology is unknown.
    """

    uuid: str
    index: int
    name: str
    memory_total: int
    memory_used: int
    utilization: float | None = None
    processes: tuple[GpuProcess, ...] = ()
    node: str = ""
    parent_uuid: str | None = None
    link_group: str = ""

    @property
    def type(self) -> str:
        """The GPU's type, the model its name reports ("A100"; `gpuq.gputypes`)."""
        return gpu_type(self.name)

    def to_dict(self) -> dict[str, Any]:
        """JSON encoding (part of the `gpuq gpus --json` object)."""
        return {
            "uuid": self.uuid,
            "index": self.index,
            "name": self.name,
            "type": self.type,
            "memory_total": self.memory_total,
            "memory_used": self.memory_used,
            "utilization": self.utilization,
            "processes": [{"pid": p.pid, "used_memory": p.used_memory} for p in self.processes],
            "node": self.node,
            "parent_uuid": self.parent_uuid,
            "link_group": self.link_group,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuInfo:
        """Decode `to_dict` from another server's daemon; ValueError if a field is wrong.

        Its processes are left out: their pids mean nothing here.
        """

        def integer(name: str) -> int:
            value = data.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"GPU field {name} must be a non-negative integer")
            return value

        uuid, name = data.get("uuid"), data.get("name")
        if not isinstance(uuid, str) or not uuid or not isinstance(name, str):
            raise ValueError("a GPU needs a uuid and a name")
        util = data.get("utilization")
        parent = data.get("parent_uuid")
        return cls(
            uuid=uuid,
            index=integer("index"),
            name=name,
            memory_total=integer("memory_total"),
            memory_used=integer("memory_used"),
            utilization=float(util) if isinstance(util, int | float) else None,
            node=str(data.get("node") or ""),
            parent_uuid=parent if isinstance(parent, str) else None,
            link_group=str(data.get("link_group") or ""),
        )
