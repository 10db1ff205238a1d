"""Who may do what on a daemon: the rules of lab mode, in one place.

On a personal daemon its one user owns everything, so every rule passes.
On a lab daemon (`[lab] enabled`) a user acts on their own jobs, admins on
all; anyone may list the queue, but another user's environment is never
sent, and with `[lab] hide_others` neither are the names, commands,
directories and output paths of other users' jobs. Shutdown and reload
are for admins only; the node requests of other servers' daemons for root
and `[lab] service_account` only, since they run jobs as any user.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gpuq.config import Config
from gpuq.daemon.identity import Caller
from gpuq.errors import PermissionDenied
from gpuq.models import Job

HIDDEN: Final = "-"
"""What a hidden name, command or path reads as."""
_HIDDEN_SPEC: Final = ("name", "cwd", "output", "error", "notify")


def require_admin(config: Config, caller: Caller, what: str) -> None:
    """Refuse a server-wide request from anyone but an admin of the lab."""
    if config.lab.enabled and not caller.admin:
        raise PermissionDenied(
            f"only the lab's admins may {what} (you are {caller.name})",
            "ask an admin (listed in [lab] admins of the daemon's config)",
        )


def require_priority(config: Config, caller: Caller, priority: int) -> None:
    """Refuse a priority above `[lab] max_priority` from anyone but an admin.

    Priority classes are strict, before fair share: a user free to raise
    their own would pass everyone else's jobs whatever their share.
    """
    limit = config.lab.max_priority
    if config.lab.enabled and not caller.admin and priority > limit:
        raise PermissionDenied(
            f"priority {priority} is above what users may give on this lab daemon ({limit}); "
            "only the lab's admins may give a higher one",
            f"use --priority {limit} or lower (a [defaults] priority in your config counts too), "
            "or ask an admin",
        )


def is_service_account(config: Config, caller: Caller) -> bool:
    """True when `caller` is the account other servers' lab daemons log in as."""
    account = config.lab.service_account
    return bool(account) and caller.name == account


def require_server(config: Config, caller: Caller, what: str) -> None:
    """Refuse another server's request unless it comes from root or the lab's service account.

    Admins are not enough: a node request runs a job as any user it names.
    """
    if config.lab.enabled and caller.uid != 0 and not is_service_account(config, caller):
        raise PermissionDenied(
            f"only root and the lab's service account may {what} (you are {caller.name})",
            "other servers' lab daemons log in as [lab] service_account of this daemon's config",
        )


def require_owner(config: Config, caller: Caller, job: Job, what: str) -> None:
    """Refuse an action on another user's job unless the caller is an admin."""
    if config.lab.enabled and not caller.may_act_on(job.spec.uid):
        raise PermissionDenied(
            f"job {job.id} belongs to {job.spec.user or job.spec.uid}: you ({caller.name}) "
            f"may not {what} it",
            "users act on their own jobs; an admin of the lab may act on any",
        )


def job_view(config: Config, caller: Caller, encoded: dict[str, Any]) -> dict[str, Any]:
    """A job object (`Job.to_dict`) as this caller may see it: redacted where it must be."""
    spec: Mapping[str, Any] = encoded.get("spec") or {}
    if not config.lab.enabled or caller.admin or caller.owns(spec.get("uid")):
        return encoded
    redacted = {**encoded, "spec": {k: v for k, v in spec.items() if k != "env"}}
    if config.lab.hide_others:
        redacted["name"] = HIDDEN
        redacted["stdout"] = redacted["stderr"] = HIDDEN
        redacted["spec"] = {
            **redacted["spec"],
            "command": [HIDDEN],
            **{k: HIDDEN for k in _HIDDEN_SPEC if redacted["spec"].get(k)},
        }
    return redacted
