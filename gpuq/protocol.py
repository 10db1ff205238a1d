"""The wire protocol between gpuq clients and the daemon.

Newline-delimited JSON over a Unix socket, one object per line, so `socat`
can talk to the daemon while debugging:

    -> {"id": 0, "method": "hello", "params": {"version": 1}}
    <- {"id": 0, "result": {"version": 1, "daemon_version": "0.1.0", ...}}
    -> {"id": 1, "method": "show", "params": {"id": 7}}
    <- {"id": 1, "result": {"job": {...}, "events": [...]}}

The first request on a connection must be `hello`; a version mismatch gets a
clear error. Errors are `{"id", "error": {"code", "message", "hint"}}`.
Streaming requests (`logs` with follow, `subscribe`) send any number of
`{"id", "event": {...}}` lines before their final result.

Each request kind is a frozen dataclass below; `parse_request` validates a
decoded object into one of them, so handlers only ever see well-typed input.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from dataclasses import dataclass
from typing import Any, Final

from gpuq.errors import ProtocolError, UsageError
from gpuq.models import HOST_PATTERN, LABEL_PATTERN, DependencyKind, JobSpec, JobState
from gpuq.units import MAX_DURATION, MAX_DURATION_TEXT, MAX_GPUS, MAX_INT, MAX_NODES
from gpuq.wire import (
    HEARTBEAT_EVENT,
    HEARTBEAT_SECONDS,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    PROTOCOL_VERSION,
    Envelope,
    decode,
    encode,
    error_reply,
    parse_reply,
)

__all__ = [
    "HEARTBEAT_EVENT",
    "HEARTBEAT_SECONDS",
    "MAX_REPLY_BYTES",
    "MAX_REQUEST_BYTES",
    "PROTOCOL_VERSION",
    "Envelope",
    "decode",
    "encode",
    "error_reply",
    "parse_reply",
]

INT_RANGE: Final = range(-MAX_INT - 1, MAX_INT + 1)
"""Integers a request may carry: what SQLite stores (signed 64 bits)."""
MAX_BEGIN: Final = 253402300800.0
"""The first second of the year 10000: a later `begin` cannot be shown as a date."""


@dataclass(frozen=True, slots=True)
class Hello:
    """Open a session; must be the first request on a connection."""

    version: int
    client: str = ""


@dataclass(frozen=True, slots=True)
class Submit:
    """Queue a job, or one job per index of `array` (each gets its own id).

    `token` makes the submission idempotent: a client that lost the reply
    sends the same token again and gets the same ids back.
    """

    spec: dict[str, Any]
    array: tuple[int, ...] = ()
    token: str | None = None


@dataclass(frozen=True, slots=True)
class ListJobs:
    """List jobs, newest last; empty filters match everything."""

    states: tuple[str, ...] = ()
    user: str | None = None
    name: str | None = None
    ids: tuple[int, ...] = ()
    include_done: bool = True
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class Show:
    """One job with its event history."""

    id: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """Cancel jobs: pending ones at once, running ones TERM then KILL."""

    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep queued jobs from starting until released."""

    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Release:
    """Let held jobs be scheduled."""

    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Retry:
    """Queue finished jobs again under their own ids."""

    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SetPriority:
    """Change the priority of pending jobs."""

    ids: tuple[int, ...]
    priority: int


@dataclass(frozen=True, slots=True)
class Suspend:
    """Suspend running jobs in `mode`, one of `SUSPEND_MODES`.

    ``auto``: checkpoint if the job's gpuq.runner is connected, else stop;
    ``checkpoint``: save and exit, freeing the GPUs (resume requeues it);
    ``park``: state to host memory, GPUs kept; ``stop``: SIGSTOP.
    """

    ids: tuple[int, ...]
    mode: str = "auto"


@dataclass(frozen=True, slots=True)
class Resume:
    """Resume suspended jobs."""

    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Block until all (or, with `any`, one) of the jobs end."""

    ids: tuple[int, ...]
    any: bool = False
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Logs:
    """Read a job's output; with `follow`, stream it until the job ends.

    `part`: for a multi-node job, whose part's output (its rank; 0 is the
    first). `offset`: start at this byte instead (a followed log going on
    after its daemon restarted, from the `offset` of its last event).
    """

    id: int
    stream: str = "stdout"
    tail: int | None = None
    follow: bool = False
    part: int = 0
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class JobMetrics:
    """A job's metrics samples (from its gpuq.runner) taken after `since`, oldest first."""

    id: int
    since: float = 0.0
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class Gpus:
    """Every GPU with memory split by owner, utilization and jobs."""


@dataclass(frozen=True, slots=True)
class DaemonStatus:
    """The daemon's own state: pid, version, paths, counts."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the daemon; jobs keep running and are re-adopted on restart.

    `final`: stopped, not restarted (`gpuq daemon stop`). A request still
    being answered (a `wait`, a followed log) then gets an `unavailable`
    error saying so, where a restart just closes its connection, so its
    client stops at once rather than wait a minute for a daemon to return.
    """

    final: bool = False


@dataclass(frozen=True, slots=True)
class Reload:
    """Read the config file again; apply what can change live, report what needs a restart."""


@dataclass(frozen=True, slots=True)
class Clean:
    """Delete finished jobs (and their logs) that ended before `older_than`."""

    older_than: float = 0.0
    dry_run: bool = False


@dataclass(frozen=True, slots=True)
class Audit:
    """The audit log of a lab daemon, newest `limit` entries (an admin's: everyone's).

    `user` narrows it to one user (admins only: a user sees their own
    entries); `since` to entries from that time. `here`: on a lab member,
    its own log (the head's node requests, reloads, what it refused itself)
    rather than the lab's, which the head keeps.
    """

    user: str | None = None
    since: float | None = None
    limit: int = 1000
    here: bool = False


@dataclass(frozen=True, slots=True)
class Share:
    """Each user's fair share on a lab daemon: share, decayed usage, factor, jobs and GPUs."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Turn the connection into a stream of job and GPU events."""

    topics: tuple[str, ...] = ("jobs",)


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a running `gpuq.runner` job to another server (or this one): checkpoint, copy, resume.

    `to` names the node: this daemon's own name or a `[[cluster.servers]]` host.
    """

    id: int
    to: str


@dataclass(frozen=True, slots=True)
class NodeLaunch:
    """Start one attempt of a head daemon's job here (`gpuq.daemon.hosted`).

    `head` names the daemon that owns the job; `launch` holds the fields of
    its `LaunchSpec`; `gpus` are this server's GPUs the attempt holds.
    """

    head: str
    job: int
    attempt: int
    launch: dict[str, Any]
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeSignal:
    """Signal a hosted attempt's whole process tree (if it is still that attempt)."""

    head: str
    job: int
    attempt: int
    signal: int


@dataclass(frozen=True, slots=True)
class NodeSync:
    """What the head's attempts here are doing, and this server's GPUs.

    `expect` maps each job id (as a string: JSON keys are strings) to the
    attempt the head believes runs here; the reply says what each is doing
    and names live attempts the head no longer expects. `dirs` are working
    directories the head asks about. With `wait`, the reply waits up to
    that many seconds for a hosted attempt to change after `version`.
    Runners' messages come back in order until the head names the last
    one it took in (`acked`, counted in the daemon run named `outbox`).
    """

    head: str
    expect: dict[str, Any]
    dirs: tuple[str, ...] = ()
    version: int = -1
    wait: float = 0.0
    acked: int = -1
    outbox: str = ""


@dataclass(frozen=True, slots=True)
class NodeControl:
    """Pass a control message (`gpuq.control`) to a hosted attempt's runner."""

    head: str
    job: int
    attempt: int
    message: dict[str, Any]


@dataclass(frozen=True, slots=True)
class NodeReceive:
    """Take a job's checkpoints copied from another server (`gpuq.daemon.incoming`).

    `phase` "prepare" makes the directory the copy fills; "commit" checks
    what arrived and puts it in place of the job's checkpoints. `checked`:
    the sender checked every file's SHA-256 at the source (`node.check`)
    while rsync copied it, so the commit checks headers and lengths only.
    """

    head: str
    job: int
    phase: str
    checked: bool = False


@dataclass(frozen=True, slots=True)
class NodeCheck:
    """Check the SHA-256 of a job's checkpoint files here (the source of a copy)."""

    head: str
    job: int


@dataclass(frozen=True, slots=True)
class NodeDirs:
    """Which of these directories do not exist on this server (a head placing a job)."""

    paths: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeRead:
    """Up to `limit` bytes of a hosted attempt's output file from `offset` (logs)."""

    head: str
    job: int
    stream: str
    offset: int = 0
    limit: int = 256 * 1024
    tail: int | None = None
    raw: bool = False
    """The bytes as they are, in base64, instead of text (a copy of the file: `node.output`)."""


@dataclass(frozen=True, slots=True)
class NodeOutput:
    """Write part of a lab job's earlier output to its default log here, before it restarts here.

    The job moved from another server; its attempt here appends to the file.
    `offset` 0 starts the file anew; `data` is base64.
    """

    head: str
    job: int
    stream: str
    uid: int
    offset: int
    data: str


NODE_REQUESTS: Final = (
    NodeLaunch,
    NodeSignal,
    NodeSync,
    NodeControl,
    NodeReceive,
    NodeCheck,
    NodeDirs,
    NodeRead,
    NodeOutput,
)
"""What another server's daemon asks of this one (`node.*`): they run jobs as any user."""

Request = (
    Hello
    | Submit
    | ListJobs
    | Show
    | Cancel
    | Hold
    | Release
    | Retry
    | SetPriority
    | Suspend
    | Resume
    | Wait
    | Logs
    | JobMetrics
    | Gpus
    | DaemonStatus
    | Shutdown
    | Reload
    | Clean
    | Audit
    | Share
    | Subscribe
    | Migrate
    | NodeLaunch
    | NodeSignal
    | NodeSync
    | NodeControl
    | NodeReceive
    | NodeCheck
    | NodeDirs
    | NodeRead
    | NodeOutput
)

METHODS: Final[dict[str, type[Request]]] = {
    "hello": Hello,
    "submit": Submit,
    "list": ListJobs,
    "show": Show,
    "cancel": Cancel,
    "hold": Hold,
    "release": Release,
    "retry": Retry,
    "priority": SetPriority,
    "suspend": Suspend,
    "resume": Resume,
    "wait": Wait,
    "logs": Logs,
    "metrics": JobMetrics,
    "gpus": Gpus,
    "status": DaemonStatus,
    "shutdown": Shutdown,
    "reload": Reload,
    "clean": Clean,
    "audit": Audit,
    "share": Share,
    "subscribe": Subscribe,
    "migrate": Migrate,
    "node.launch": NodeLaunch,
    "node.signal": NodeSignal,
    "node.sync": NodeSync,
    "node.control": NodeControl,
    "node.receive": NodeReceive,
    "node.check": NodeCheck,
    "node.dirs": NodeDirs,
    "node.read": NodeRead,
    "node.output": NodeOutput,
}
METHOD_NAMES: Final = {cls: name for name, cls in METHODS.items()}
STREAM_TOPICS: Final = ("jobs", "gpus", "metrics")
SUSPEND_MODES: Final = ("auto", "checkpoint", "park", "stop")
"""Modes of the `suspend` request; see `Suspend`."""


def _check(value: object, type_text: str, where: str) -> object:
    """Validate one decoded JSON value against a field's annotation text."""
    optional = type_text.endswith(" | None")
    base = type_text.removesuffix(" | None")
    if value is None and optional:
        return None
    ok: bool
    if base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
        if ok and value not in INT_RANGE:
            raise UsageError(
                f"invalid value for {where}: out of range", "integers must fit in 64 bits"
            )
    elif base == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok:
            value = float(value)  # type: ignore[arg-type]
    elif base == "str":
        ok = isinstance(value, str)
    elif base == "bool":
        ok = isinstance(value, bool)
    elif base == "dict[str, Any]":
        ok = isinstance(value, dict)
    elif base.startswith("tuple["):
        item = base.removeprefix("tuple[").removesuffix(", ...]")
        if not isinstance(value, list):
            ok = False
        else:
            return tuple(_check(v, item, f"{where}[]") for v in value)
    else:  # pragma: no cover - a programming error in this module
        raise AssertionError(f"unsupported field type {type_text}")
    if not ok:
        raise UsageError(
            f"invalid value for {where}: expected {type_text}, got {type(value).__name__}",
            "check the request against docs/protocol.md",
        )
    return value


def parse_request(message: object) -> tuple[object, Request]:
    """Validate a decoded request object; returns (request id, request).

    Raises ProtocolError for a malformed envelope (the id is then unknown)
    and UsageError for bad parameters.
    """
    if not isinstance(message, dict):
        raise ProtocolError("a request must be a JSON object", 'send {"id", "method", "params"}')
    request_id = message.get("id")
    method = message.get("method")
    params = message.get("params", {})
    if not isinstance(method, str):
        raise ProtocolError("a request needs a string 'method'", f"known: {', '.join(METHODS)}")
    cls = METHODS.get(method)
    if cls is None:
        raise ProtocolError(
            f"unknown message {method!r}: is the daemon up to date?",
            f"known methods: {', '.join(METHODS)}",
        )
    if not isinstance(params, dict):
        raise UsageError(f"'params' of {method} must be an object")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - set(fields))
    if unknown:
        raise UsageError(
            f"unknown parameter(s) for {method}: {', '.join(unknown)}",
            f"known: {', '.join(fields) or 'none'}",
        )
    values: dict[str, object] = {}
    for name, spec in fields.items():
        if name in params:
            values[name] = _check(params[name], str(spec.type), f"{method}.{name}")
        elif spec.default is dataclasses.MISSING:
            raise UsageError(f"missing parameter {method}.{name}")
    return request_id, cls(**values)  # type: ignore[arg-type]


def request_params(request: Request) -> dict[str, Any]:
    """The `params` object that encodes `request` (tuples become lists)."""
    return {
        f.name: list(v) if isinstance(v := getattr(request, f.name), tuple) else v
        for f in dataclasses.fields(request)
    }


_SPEC_TYPES: Final = {f.name: str(f.type) for f in dataclasses.fields(JobSpec)}
_SPEC_WIRE_TYPES: Final = {
    **_SPEC_TYPES,
    "command": "tuple[str, ...]",
    "env": "dict[str, Any]",
    "after": "tuple[str, ...]",
    "signal": "tuple[float, ...] | None",
}


def validate_spec(data: dict[str, Any], *, array: bool = False) -> JobSpec:
    """Check a submitted spec's types and values and build the JobSpec.

    Only facts visible without the filesystem are checked here; the daemon
    checks the cwd, the command and the GPU counts against the server.
    `array`: the spec is that of an array's tasks (`Submit.array`), whose
    `array_index` the daemon sets; a request never does.
    """
    unknown = sorted(set(data) - set(_SPEC_WIRE_TYPES))
    if unknown:
        raise UsageError(f"unknown job spec field(s): {', '.join(unknown)}")
    for name, type_text in _SPEC_WIRE_TYPES.items():
        if name in data:
            checked = _check(data[name], type_text, f"spec.{name}")
            if name == "signal" and checked is not None:
                if len(data[name]) != 2:
                    raise UsageError("spec.signal must be [signal, seconds]")
                _check(data[name][0], "int", "spec.signal[0]")  # 10.5 is no signal
    if data.get("array_index") is not None:
        raise UsageError(
            "spec.array_index is set by the daemon, for each task of an array",
            'give the indices as the submit request\'s "array" instead, e.g. "array": [0, 1, 2]',
        )
    if "command" not in data or "cwd" not in data:
        raise UsageError("a job spec needs 'command' and 'cwd'")
    if not data["command"]:
        raise UsageError(
            "empty command", "give the command after --, e.g. gpuq submit -- python x.py"
        )
    env = data.get("env") or {}
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError("spec.env must map strings to strings")
    try:
        spec = JobSpec.from_dict(data)
    except (ValueError, TypeError) as exc:
        raise UsageError(
            f"invalid job spec: {exc}", "dependencies look like ID or ID:ok|any|notok"
        ) from exc
    _check_ranges(spec, array)
    _check_os_strings(spec)
    _check_placement(spec)
    return spec


MAX_PLACEMENT_NAMES: Final = 256
"""The most names one of `--node`, `--exclude-node`, `--label` and `--gpu-type` may list."""
_PLACEMENT_RULES: Final = (
    ("nodes", "--node", re.compile(HOST_PATTERN), "a server name such as gpu2 (ssh alias)"),
    ("exclude_nodes", "--exclude-node", re.compile(HOST_PATTERN), "a server name such as gpu2"),
    ("labels", "--label", re.compile(LABEL_PATTERN), "a label such as a100 or fast-disk"),
    ("gpu_types", "--gpu-type", re.compile(LABEL_PATTERN), "a GPU type such as A100 or L4"),
)


def _check_placement(spec: JobSpec) -> None:
    """Node names and labels look like those of the config (never an option: no leading '-')."""
    for field_name, flag, pattern, example in _PLACEMENT_RULES:
        names: tuple[str, ...] = getattr(spec, field_name)
        if len(names) > MAX_PLACEMENT_NAMES:
            raise UsageError(f"{flag}: at most {MAX_PLACEMENT_NAMES} names, got {len(names)}")
        for name in names:
            if len(name) > 255 or not pattern.fullmatch(name):
                raise UsageError(
                    f"{flag}: invalid name {name!r}",
                    f"give {example}: letters, digits, '.', '_' and '-', not starting with '-'",
                )
    if spec.gpu_types and spec.gpus <= 0:
        raise UsageError(
            "--gpu-type picks GPUs; a job with --gpus 0 takes none",
            "drop --gpu-type, or ask for GPUs with --gpus N",
        )
    both = sorted(set(spec.nodes) & set(spec.exclude_nodes))
    if both:
        raise UsageError(
            f"--node and --exclude-node both name {', '.join(both)}",
            "name a server in one of them only",
        )


def _check_ranges(spec: JobSpec, array: bool) -> None:
    _check_node_count(spec)  # first: a client derives the default --gpus from --nodes
    if spec.gpus < 0:
        raise UsageError(
            f"--gpus must be 0 or more, got {spec.gpus}", "--gpus 0 runs a CPU-only job"
        )
    if spec.gpus_max is not None:
        if spec.gpus < 1 or spec.gpus_max < spec.gpus:
            raise UsageError(
                f"--gpus {spec.gpus}-{spec.gpus_max}: a range needs 1 <= MIN <= MAX",
                "e.g. --gpus 1-8 for a job that can use from 1 to 8 GPUs",
            )
        if spec.gpus_max > MAX_GPUS:
            raise UsageError(
                f"--gpus: at most {MAX_GPUS} GPUs, got {spec.gpus_max}",
                f"give a range such as --gpus 1-8 (MAX up to {MAX_GPUS})",
            )
        if spec.shares_gpu:
            raise UsageError(
                "--gpu-mem shares GPUs; a GPU range takes them whole",
                "drop --gpu-mem, or give a single count with --gpus N",
            )
    if spec.gpu_mem is not None and spec.gpu_mem <= 0:
        raise UsageError("--gpu-mem must be positive", "give a size such as --gpu-mem 6G, or auto")
    _check_multi_node(spec, array)
    if spec.shares_gpu and spec.gpus == 0:
        raise UsageError("--gpu-mem needs --gpus 1 or more", "drop --gpu-mem for a CPU-only job")
    if spec.retries < 0:
        raise UsageError("--retries must be 0 or more", "--retries 0 (the default) never retries")
    if spec.time_limit is not None and spec.time_limit <= 0:
        raise UsageError("--time must be positive", "give a limit such as --time 2h or 90s")
    if spec.time_limit is not None and spec.time_limit >= MAX_DURATION:
        raise UsageError(
            f"--time must be less than {MAX_DURATION_TEXT}", "give a limit such as --time 2h or 7d"
        )
    if spec.array_parallel is not None and spec.array_parallel <= 0:
        raise UsageError(
            "the array limit after % must be positive", "e.g. --array 0-99%4 runs 4 at once"
        )
    if any(dep.job_id not in INT_RANGE for dep in spec.after):
        raise UsageError("spec.after: job id out of range", "integers must fit in 64 bits")
    if spec.begin is not None and spec.begin >= MAX_BEGIN:
        raise UsageError("--begin must be before the year 10000", "e.g. --begin now+10m")
    if spec.signal is not None and spec.signal.signal not in signal.valid_signals():
        raise UsageError(f"--signal: no signal number {spec.signal.signal}", "e.g. USR1@120")
    if spec.signal is not None and not 0 <= spec.signal.seconds < MAX_DURATION:
        raise UsageError(
            f"--signal: the time before the limit must be 0 or more and less than "
            f"{MAX_DURATION_TEXT}, got {spec.signal.seconds:g}",
            "e.g. USR1@120: SIGUSR1 120 seconds before the time limit",
        )
    if any(dep.kind not in DependencyKind for dep in spec.after):  # pragma: no cover
        raise UsageError("unknown dependency kind")


def _check_node_count(spec: JobSpec) -> None:
    """`--nodes N` names from 1 to `MAX_NODES` servers."""
    if spec.node_count < 1 or spec.node_count > MAX_NODES:
        raise UsageError(
            f"--nodes must be from 1 to {MAX_NODES}, got {spec.node_count}",
            "--nodes 1 (the default) runs on one server",
        )


def _check_multi_node(spec: JobSpec, array: bool) -> None:
    """`--nodes N`: N servers, each with the same whole number of whole GPUs; no array."""
    if not spec.multi_node:
        return
    if spec.gpus_max is not None:
        raise UsageError(
            "--nodes runs a fixed number of processes; a GPU range resizes the job",
            f"give a single count, e.g. --nodes {spec.node_count} --gpus {spec.gpus}",
        )
    if spec.shares_gpu:
        raise UsageError(
            "--nodes takes whole GPUs on each server; --gpu-mem shares one",
            "drop --gpu-mem from a multi-node job",
        )
    if spec.gpus < spec.node_count:
        raise UsageError(
            f"--nodes {spec.node_count} needs a GPU on each server, got --gpus {spec.gpus}",
            f"give --gpus {spec.node_count} or a multiple of it (CPU-only jobs run on one server)",
        )
    if spec.gpus % spec.node_count:
        per = max(1, spec.gpus // spec.node_count)
        raise UsageError(
            f"--gpus {spec.gpus} cannot be split evenly over --nodes {spec.node_count}",
            f"give a multiple of {spec.node_count}, e.g. --gpus {per * spec.node_count} "
            f"for {per} GPU(s) on each server",
        )
    if array:
        raise UsageError("an array task cannot span servers", "submit --nodes jobs one by one")


def _check_os_strings(spec: JobSpec) -> None:
    """Strings handed to the OS (argv, paths, environment) cannot hold NUL or bad names.

    The cwd is absolute: the daemon runs in /, so a relative one would be
    taken from there, not from where the client was.
    """
    texts = {
        "command": spec.command,
        "cwd": (spec.cwd,),
        "name": (spec.name,),
        "output": (spec.output,),
        "error": (spec.error or "",),
        "notify": (spec.notify or "",),
        "env": (*spec.env, *spec.env.values()),
    }
    for name, values in texts.items():
        if any("\0" in text for text in values):
            raise UsageError(f"spec.{name} contains a NUL character", "the OS cannot pass it on")
    if any("=" in key for key in spec.env):
        raise UsageError("spec.env: a variable name cannot contain '='")
    if not os.path.isabs(spec.cwd):  # the daemon's own is /, not the client's
        raise UsageError(
            f"spec.cwd must be an absolute path, got {spec.cwd!r}",
            "send the job's working directory in full, as gpuq submit does",
        )


def parse_states(names: tuple[str, ...]) -> frozenset[JobState]:
    """Job states from their names; raises UsageError listing valid names."""
    known = {state.value: state for state in JobState}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UsageError(f"unknown job state {unknown[0]!r}", f"states: {', '.join(known)}")
    return frozenset(known[name] for name in names)


@dataclass(frozen=True, slots=True)
class ActionOutcome:
    """Per-job result of a bulk action such as cancel or hold."""

    id: int
    ok: bool
    message: str = ""
    state: str | None = None
    code: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON encoding used in action replies (`code`: the error code, if not ok)."""
        return {
            "id": self.id,
            "ok": self.ok,
            "message": self.message,
            "state": self.state,
            "code": self.code,
        }
