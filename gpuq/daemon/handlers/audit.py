"""audit: the lab daemon's audit log; an admin sees everyone's entries, a user their own."""

from __future__ import annotations

import pwd
from typing import Any

from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.errors import NotFoundError, PermissionDenied, UsageError
from gpuq.protocol import Audit

MAX_ENTRIES = 100_000


def handle(state: DaemonState, request: Audit, caller: Caller) -> dict[str, Any]:
    """The newest `limit` entries, oldest first, narrowed as the request and the caller say."""
    if not state.config.lab.enabled:
        raise UsageError(
            "this daemon keeps no audit log: it is a personal daemon",
            "the audit log is a lab daemon's ([lab] enabled = true)",
        )
    if not 0 < request.limit <= MAX_ENTRIES:
        raise UsageError(f"limit must be from 1 to {MAX_ENTRIES}")
    uid = None if caller.admin else caller.uid
    if request.user is not None:
        try:
            wanted = pwd.getpwnam(request.user).pw_uid
        except KeyError:
            raise NotFoundError(f"no user {request.user!r} on this server") from None
        if uid is not None and wanted != uid:
            raise PermissionDenied(
                f"only the lab's admins may read another user's audit entries (you are "
                f"{caller.name})",
                "leave out --user to read your own",
            )
        uid = wanted
    entries = state.store.audit(uid=uid, since=request.since, limit=request.limit)
    return {"entries": [entry.to_dict() for entry in entries]}
