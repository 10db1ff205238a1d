"""The per-job control channel between the daemon and `gpuq.runner`.

The daemon listens on one Unix socket per running job (its path is in
``GPUQ_CONTROL_SOCKET``, see `gpuq.env`); the runner in the job connects to it
from a background thread. Framing is the client protocol's: one JSON object
per line (`gpuq.wire`), bounded by `MAX_CONTROL_BYTES`. Every message is an
object with a ``type``; the dataclasses below are the whole vocabulary, and
`parse_message` turns a decoded object into one of them or raises
`ProtocolError`, so neither side ever handles untyped input.

A session, newest message last::

    runner -> {"type": "hello", "version": 1, "job_id": 7, "attempt": 1, "pid": 4242,
               "features": ["checkpoint", "park", "metrics", "resize"]}
    daemon -> {"type": "welcome", "version": 1, "metrics_interval": 5.0}
    runner -> {"type": "metrics", "sample": {"time": ..., "step": 120, ...}}
    daemon -> {"type": "suspend", "mode": "checkpoint"}
    runner -> {"type": "ack", "request": "suspend", "ok": true,
               "detail": {"mode": "checkpoint", "step": 121, "bytes": ..., "seconds": ...}}
    (the job exits with SUSPEND_EXIT_CODE; the daemon records it as suspended)

The daemon's end is `gpuq.daemon.control` (sockets) and
`gpuq.daemon.suspend` (what the messages do); the runner's is
`gpuq.runner.control`. The runner reconnects when the daemon restarts (the
daemon re-creates the socket when it re-adopts the job); a message it
cannot parse is logged and skipped, never fatal to the training job. The
daemon closes a connection that sends anything malformed, oversized or not
a runner's message. A checkpoint-mode suspend counts only when the job
exits with `SUSPEND_EXIT_CODE` and `ACK_FILE` names the job and attempt;
the `Ack` over the socket is for the event log. This module is part of the
shared core: stdlib only, imported by both the daemon and the runner.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from gpuq.errors import ProtocolError

CONTROL_VERSION: Final = 1
"""Version of the control-channel vocabulary; sent in `Hello` and `Welcome`."""
MAX_CONTROL_BYTES: Final = 256 * 1024
"""Longest control message line, in bytes; longer ones close the channel."""
SUSPEND_EXIT_CODE: Final = 75
"""Exit status of a job that saved a checkpoint and stopped because gpuq asked it to."""
ACK_FILE: Final = "suspended.json"
"""Written into the checkpoint directory by a job that suspended in checkpoint mode."""
OOM_FILE: Final = "out-of-memory.json"
"""Written into the checkpoint directory by a runner job that dies of CUDA out-of-memory."""

ControlSuspendMode = Literal["checkpoint", "park"]
CONTROL_SUSPEND_MODES: Final = get_args(ControlSuspendMode)
Feature = Literal["checkpoint", "park", "metrics", "resize"]
FEATURES: Final = get_args(Feature)
AckedRequest = Literal["suspend", "resume", "checkpoint", "resize"]
ACKED_REQUESTS: Final = get_args(AckedRequest)


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """What the runner measured over the last reporting interval.

    Every field but `time` and `step` is optional: a job without CUDA has no
    memory figures, one without the goodput machinery no gradient statistics.
    Times are seconds, memory bytes, batch sizes samples.
    """

    time: float
    """Unix time the sample was taken (the job's clock)."""
    step: int
    """Iterations completed so far, across restarts."""
    epoch: int = 0
    step_seconds: float | None = None
    """Mean wall time of one iteration over the interval."""
    samples_per_second: float | None = None
    batch_size: int | None = None
    """Global batch size: per-replica batch x accumulation steps x replicas."""
    local_batch_size: int | None = None
    accumulation_steps: int | None = None
    replicas: int | None = None
    memory_min_bytes: int | None = None
    """Smallest `memory_allocated` seen at an iteration boundary (where gpuq suspends)."""
    memory_peak_bytes: int | None = None
    """Largest per-iteration peak of allocated memory."""
    loss: float | None = None
    grad_sqr: float | None = None
    """Estimated squared norm of the true gradient (Pollux's |G|^2)."""
    grad_var: float | None = None
    """Estimated gradient variance, the trace of the covariance (Pollux's tr(Sigma))."""
    gain: float | None = None
    """AdaScale gain of the current batch size, in [1, batch_size / initial]."""
    efficiency: float | None = None
    """Statistical efficiency of the current batch size relative to the initial one."""
    goodput: float | None = None
    """Predicted goodput at the current configuration (samples/s x efficiency)."""
    progress: float | None = None
    """Scale-invariant progress: samples processed, weighted by efficiency."""
    perf_params: tuple[float, ...] | None = None
    """Fitted throughput model (`gpuq.goodput.PerfParams` fields, in order), if any."""
    batch_limits: tuple[int, ...] | None = None
    """An adaptive loader's bounds: (initial total batch M0, largest total batch, fewest and
    most samples per GPU), with which the fitted model predicts goodput for any GPU count."""


@dataclass(frozen=True, slots=True)
class Hello:
    """Runner -> daemon, first on every connection: who is talking."""

    version: int
    job_id: int
    attempt: int
    pid: int
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Welcome:
    """Daemon -> runner, the answer to `Hello`: how often to send metrics."""

    version: int
    metrics_interval: float = 5.0


@dataclass(frozen=True, slots=True)
class Metrics:
    """Runner -> daemon: one metrics sample."""

    sample: MetricsSample


@dataclass(frozen=True, slots=True)
class SuspendRequest:
    """Daemon -> runner: suspend at the next iteration boundary."""

    mode: str = "checkpoint"


@dataclass(frozen=True, slots=True)
class ResumeRequest:
    """Daemon -> runner: end a park (state back to the device), or withdraw a pending request."""


@dataclass(frozen=True, slots=True)
class CheckpointRequest:
    """Daemon -> runner: save a checkpoint at the next boundary and keep training."""


@dataclass(frozen=True, slots=True)
class ResizeRequest:
    """Daemon -> runner: the job's allocation changes; checkpoint and exit to restart on it."""

    gpus: int


@dataclass(frozen=True, slots=True)
class Ack:
    """Runner -> daemon: a request was honoured (or refused, with `ok` false).

    A checkpoint or park suspend is acknowledged once the state is safe; a
    suspend the job cannot honour (no `gpuq.runner.State`) is refused at once.
    """

    request: str
    ok: bool = True
    detail: dict[str, Any] = field(default_factory=dict)
    """E.g. ``bytes`` and ``seconds`` of a suspend, or ``error`` when refused."""


Message = (
    Hello
    | Welcome
    | Metrics
    | SuspendRequest
    | ResumeRequest
    | CheckpointRequest
    | ResizeRequest
    | Ack
)

MESSAGE_TYPES: Final[dict[str, type[Message]]] = {
    "hello": Hello,
    "welcome": Welcome,
    "metrics": Metrics,
    "suspend": SuspendRequest,
    "resume": ResumeRequest,
    "checkpoint": CheckpointRequest,
    "resize": ResizeRequest,
    "ack": Ack,
}
MESSAGE_NAMES: Final = {cls: name for name, cls in MESSAGE_TYPES.items()}


def to_dict(message: Message) -> dict[str, Any]:
    """The JSON object for `message`, with its ``type``; `None` fields of a sample are left out."""
    body: dict[str, Any] = {"type": MESSAGE_NAMES[type(message)]}
    if isinstance(message, Metrics):
        sample = dataclasses.asdict(message.sample)
        body["sample"] = {k: v for k, v in sample.items() if v is not None}
        if message.sample.perf_params is not None:
            body["sample"]["perf_params"] = list(message.sample.perf_params)
        return body
    for f in dataclasses.fields(message):
        value = getattr(message, f.name)
        body[f.name] = list(value) if isinstance(value, tuple) else value
    return body


def sample_to_dict(sample: MetricsSample) -> dict[str, Any]:
    """A sample as the JSON object the daemon stores and the client protocol returns."""
    body = to_dict(Metrics(sample))["sample"]
    assert isinstance(body, dict)
    return body


def parse_message(obj: object) -> Message:
    """Validate one decoded JSON value into a control message, or raise `ProtocolError`."""
    if not isinstance(obj, dict):
        raise ProtocolError("control message must be a JSON object", "see gpuq/control.py")
    kind = obj.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(
            f"unknown control message type {kind!r}",
            f"known types: {', '.join(MESSAGE_TYPES)}; is the runner up to date?",
        )
    fields = {k: v for k, v in obj.items() if k != "type"}
    if cls is Metrics:
        return Metrics(parse_sample(fields.get("sample")))
    kwargs = _typed_fields(cls, fields, where=f"{kind} message")
    message = cls(**kwargs)
    _check_values(message)
    return message


def parse_sample(obj: object) -> MetricsSample:
    """Validate a metrics sample; every number must be finite and counts non-negative."""
    if not isinstance(obj, dict):
        raise ProtocolError("metrics message needs a 'sample' object", "see gpuq/control.py")
    kwargs = _typed_fields(MetricsSample, obj, where="metrics sample")
    for name, value in kwargs.items():
        numbers = value if isinstance(value, tuple) else (value,)
        for number in numbers:
            if isinstance(number, float) and not math.isfinite(number):
                raise ProtocolError(f"metrics sample: {name} is not finite", "send finite numbers")
            if isinstance(number, int | float) and number < 0 and name not in {"loss"}:
                raise ProtocolError(
                    f"metrics sample: {name} is negative", "send non-negative values"
                )
    return MetricsSample(**kwargs)


_ANNOTATIONS: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
}


def _typed_fields(cls: type, fields: dict[str, Any], where: str) -> dict[str, Any]:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        raise ProtocolError(
            f"{where}: unknown field(s) {', '.join(unknown)}", "see gpuq/control.py"
        )
    kwargs: dict[str, Any] = {}
    for name, f in known.items():
        if name not in fields:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ProtocolError(f"{where}: missing field {name!r}", "see gpuq/control.py")
            continue
        kwargs[name] = _coerce(fields[name], str(f.type), f"{where}: {name}")
    return kwargs


def _coerce(value: object, type_text: str, where: str) -> object:
    base = type_text.removesuffix(" | None")
    if value is None and base != type_text:
        return None
    if base.startswith("tuple["):
        item = "float" if "float" in base else "int" if "int" in base else "str"
        if not isinstance(value, list):
            raise ProtocolError(f"{where} must be a list", "see gpuq/control.py")
        return tuple(_coerce(v, item, where) for v in value)
    if base.startswith("dict["):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} must be an object", "see gpuq/control.py")
        return value
    allowed = _ANNOTATIONS[base]
    if isinstance(value, bool) and base != "bool" or not isinstance(value, allowed):
        raise ProtocolError(f"{where} must be {base}", "see gpuq/control.py")
    return float(value) if base == "float" else value  # type: ignore[arg-type]


def _check_values(message: Message) -> None:
    if isinstance(message, SuspendRequest) and message.mode not in CONTROL_SUSPEND_MODES:
        raise ProtocolError(
            f"unknown suspend mode {message.mode!r}", f"modes: {', '.join(CONTROL_SUSPEND_MODES)}"
        )
    if isinstance(message, Ack) and message.request not in ACKED_REQUESTS:
        raise ProtocolError(
            f"ack for unknown request {message.request!r}",
            f"requests: {', '.join(ACKED_REQUESTS)}",
        )
    if isinstance(message, ResizeRequest) and message.gpus < 0:
        raise ProtocolError("resize to a negative number of GPUs", "send gpus >= 0")
    if isinstance(message, Welcome) and not message.metrics_interval > 0:
        raise ProtocolError("metrics_interval must be positive", "send seconds > 0")
