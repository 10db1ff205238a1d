"""One error hierarchy for gpuq, rendered only at the CLI and TUI edges.

Library and daemon code raise a `GpuqError` subclass carrying a message and a
hint; the edge prints both to stderr and exits with the subclass's code. The
same codes travel over the wire as `error.code`, so a client can re-raise the
daemon's error as the right subclass (`from_wire`).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Process exit codes of the `gpuq` command (documented in the man pages)."""

    OK = 0
    FAILURE = 1  # generic failure, or `--wait`: the job failed
    USAGE = 2  # bad command line or invalid request
    NOT_FOUND = 3  # no such job
    CONFLICT = 4  # the job is in a state that does not allow the action
    UNAVAILABLE = 5  # daemon unreachable, or GPUs/resources impossible
    PROTOCOL = 6  # version mismatch or malformed reply
    STATE = 7  # state directory or database problem
    TIMEOUT = 8  # a wait ran out of time
    PERMISSION = 9  # the caller may not do this (lab mode: another user's job, admins only)


class GpuqError(Exception):
    """Base of every error gpuq raises on purpose: a message and a hint."""

    code: str = "error"
    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def to_wire(self) -> dict[str, Any]:
        """Encode as the `error` object of a protocol reply."""
        return {"code": self.code, "message": self.message, "hint": self.hint}

    def __str__(self) -> str:
        return self.message


class UsageError(GpuqError):
    """The request or command line is invalid."""

    code = "invalid"
    exit_code = ExitCode.USAGE


class NotFoundError(GpuqError):
    """A job (or other named thing) does not exist."""

    code = "not_found"
    exit_code = ExitCode.NOT_FOUND


class ConflictError(GpuqError):
    """The action does not apply to the job's current state."""

    code = "conflict"
    exit_code = ExitCode.CONFLICT


class ResourceError(GpuqError):
    """The request can never be satisfied by this server's GPUs."""

    code = "resources"
    exit_code = ExitCode.UNAVAILABLE


class DaemonUnavailable(GpuqError):
    """The daemon cannot be reached or started."""

    code = "unavailable"
    exit_code = ExitCode.UNAVAILABLE


class ProtocolError(GpuqError):
    """A message could not be understood (framing, version, schema)."""

    code = "protocol"
    exit_code = ExitCode.PROTOCOL


class StateError(GpuqError):
    """The state directory or database is unusable."""

    code = "state"
    exit_code = ExitCode.STATE


class GpuUnavailable(GpuqError):
    """NVML or the driver cannot be used."""

    code = "gpu_unavailable"
    exit_code = ExitCode.UNAVAILABLE


class WaitTimeout(GpuqError):
    """A wait for jobs ran out of time."""

    code = "timeout"
    exit_code = ExitCode.TIMEOUT


class PermissionDenied(GpuqError):
    """The caller may not do this: another user's job, or an action for admins only."""

    code = "permission"
    exit_code = ExitCode.PERMISSION


class ConfigError(UsageError):
    """The configuration file is invalid."""

    code = "config"


_BY_CODE: dict[str, type[GpuqError]] = {
    cls.code: cls
    for cls in (
        GpuqError,
        UsageError,
        NotFoundError,
        ConflictError,
        ResourceError,
        DaemonUnavailable,
        ProtocolError,
        StateError,
        GpuUnavailable,
        WaitTimeout,
        PermissionDenied,
        ConfigError,
    )
}


def from_wire(error: object) -> GpuqError:
    """Rebuild the error a daemon sent; unknown shapes become a ProtocolError."""
    if not isinstance(error, dict):
        return ProtocolError(f"malformed error from daemon: {error!r}")
    cls = _BY_CODE.get(str(error.get("code")), GpuqError)
    hint = error.get("hint")
    return cls(str(error.get("message", "unknown error")), hint if isinstance(hint, str) else None)
