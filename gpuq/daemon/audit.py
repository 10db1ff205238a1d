"""The lab daemon's audit log: every action by anyone, with uid, time and outcome.

Requests that change something (submit, the job actions, logs of a job,
migrate, clean, shutdown, reload, the bridge's node requests) are recorded
whatever their outcome; read-only ones (list, show, gpus, status, wait,
metrics, subscribe, audit) only when refused, so polling does not flood the
log. The uid is the kernel's (SO_PEERCRED), never the request's. A personal
daemon keeps no audit log: its one user is the only caller.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.errors import GpuqError
from gpuq.protocol import (
    METHOD_NAMES,
    Audit,
    DaemonStatus,
    Gpus,
    Hello,
    JobMetrics,
    ListJobs,
    Request,
    Show,
    Submit,
    Subscribe,
    Wait,
)

log = logging.getLogger("gpuq.daemon")

READ_ONLY: Final = (Hello, ListJobs, Show, Gpus, DaemonStatus, Wait, JobMetrics, Subscribe, Audit)
"""Requests recorded only when refused."""
_MAX_TARGET: Final = 200


def target(request: Request) -> str:
    """What the request acts on, briefly: job ids (a node request's too), or the command."""
    if isinstance(request, Submit):
        command = request.spec.get("command")
        words = [str(w) for w in command] if isinstance(command, list) else []
        return _clip(" ".join(words))
    ids = getattr(request, "ids", None)
    if isinstance(ids, tuple):
        return _clip(",".join(str(i) for i in ids))
    for field in ("id", "job"):
        job_id = getattr(request, field, None)
        if isinstance(job_id, int) and not isinstance(job_id, bool):
            return str(job_id)
    return ""


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TARGET else text[: _MAX_TARGET - 3] + "..."


def outcome(result: dict[str, Any]) -> tuple[bool, str]:
    """(ok, message) of a reply: a bulk action is ok only if it was for every id."""
    results = result.get("results")
    if isinstance(results, list):
        failed = [r for r in results if isinstance(r, dict) and not r.get("ok")]
        text = "; ".join(f"job {r.get('id')}: {r.get('message')}" for r in failed)
        return not failed, text
    ids = result.get("ids")
    if isinstance(ids, list) and ids:
        return True, "ids " + ",".join(str(i) for i in ids[:20])
    return True, ""


def record(
    state: DaemonState,
    caller: Caller,
    request: Request,
    result: dict[str, Any] | None,
    error: GpuqError | None,
) -> None:
    """Add the request to the audit log if lab mode asks for it; never raises."""
    if not state.config.lab.enabled:
        return
    if error is None and isinstance(request, READ_ONLY):
        return
    ok, message = (False, error.message) if error is not None else outcome(result or {})
    try:
        state.store.add_audit(
            time.time(),
            caller.uid,
            caller.name,
            METHOD_NAMES.get(type(request), type(request).__name__),
            target(request),
            ok,
            message,
        )
    except Exception:  # a full disk must not turn an answered request into an error
        log.exception("cannot write the audit log")
