"""list: the queue and history, filtered."""

from __future__ import annotations

import time
from typing import Any

from gpuq.daemon.access import job_view
from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.errors import UsageError
from gpuq.models import JobState
from gpuq.protocol import ListJobs, parse_states


def handle(state: DaemonState, request: ListJobs, caller: Caller) -> dict[str, Any]:
    """Jobs matching every given filter, in id order.

    `unknown` names the ids asked for that are no job or array (never one, or
    removed by `gpuq clean`): the CLI lists the rest and exits 3 for them,
    while the TUI, which lists ids it saw earlier, just leaves them out.
    """
    if request.limit is not None and request.limit < 0:
        raise UsageError(
            f"list.limit must be 0 or more, got {request.limit}", "--limit N: the newest N"
        )
    ids = state.resolve_ids(request.ids)
    unknown = [i for i in ids if i not in state.active and state.store.get(i) is None]
    states: frozenset[JobState] | None = parse_states(request.states) if request.states else None
    if not request.include_done:
        unfinished = frozenset(s for s in JobState if not s.is_terminal)
        states = unfinished if states is None else states & unfinished
    if states is not None and all(not s.is_terminal for s in states) and not ids:
        jobs = sorted((j for j in state.active.values() if j.state in states), key=lambda j: j.id)
    else:
        jobs = state.store.jobs(states, ids)
    if request.user is not None:
        jobs = [j for j in jobs if j.spec.user == request.user]
    if request.name is not None:
        jobs = [j for j in jobs if request.name in j.spec.name]
    if request.limit is not None:
        jobs = jobs[-request.limit :] if request.limit > 0 else []
    now = time.time()
    return {
        "jobs": [
            job_view(state.config, caller, state.with_reason(j).to_dict(now=now)) for j in jobs
        ],
        "warnings": state.warnings(),
        "nodes": nodes(state),
        "unknown": unknown,
    }


def nodes(state: DaemonState) -> list[str]:
    """The servers jobs may run on: this daemon's node, then each `[[cluster.servers]]` host.

    `gpuq ls` shows its NODE column when there is more than one.
    """
    hosts = [server.host for server in state.config.cluster.servers]
    return list(dict.fromkeys([state.config.daemon.node_name, *hosts]))
