"""The policy's memory across daemon restarts (Pollux's last population, for one).

Kept beside it, under keys of their own: the time-slicer's turns and the
book of packs (`gpuq.daemon.scheduler.packs`), whose every step is committed
before it is acted on (`commit_packs` raises when it cannot be written).

A policy that remembers (`Capabilities.remembers`, `Remembers`) gets back,
when the daemon starts or switches to it, what it saved before; after every
decision what it saves now is kept in the store (the `policy_state` table,
keyed by the policy as configured, options included), written only when it
changed. Memory that cannot be read back (another version's, a damaged
row) is dropped with a warning and the policy starts afresh: it only makes
decisions better, and a daemon must start. A full disk likewise only costs
the memory of the decisions it could not record.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING

from gpuq.errors import StateError
from gpuq.policies.interface import Remembers

if TYPE_CHECKING:  # the state calls `restore` when its policy changes
    from gpuq.daemon.state import DaemonState

log = logging.getLogger("gpuq.daemon")


def _remembering(state: DaemonState) -> Remembers | None:
    policy = state.policy
    if policy.capabilities.remembers and isinstance(policy, Remembers):
        return policy
    return None


def restore(state: DaemonState) -> bool:
    """Give the policy what it saved last time; True if it took it up."""
    policy = _remembering(state)
    state.policy_saved = None
    if policy is None:
        return False
    key = state.config.scheduler.policy
    text = state.store.policy_state(key)
    if text is None:
        return False
    try:
        saved = json.loads(text)
        policy.restore(saved if isinstance(saved, dict) else {})
    except ValueError as exc:  # JSONDecodeError included
        log.warning("policy %s: its saved memory is dropped (%s); starting afresh", key, exc)
        return False
    state.policy_saved = text
    log.info("policy %s: memory restored", key)
    return True


TURNS_SUFFIX = "#turns"
"""The time-slicer's turns are kept under the policy's key with this suffix."""


def restore_turns(state: DaemonState) -> bool:
    """Give the time-slicer its turns as last kept; True if it took them up."""
    state.slicer_saved = None
    if state.slicer is None:
        return False
    key = state.config.scheduler.policy + TURNS_SUFFIX
    text = state.store.policy_state(key)
    if text is None:
        return False
    try:
        saved = json.loads(text)
        state.slicer.restore(saved if isinstance(saved, dict) else {})
    except ValueError as exc:
        log.warning("time-slicing turns dropped (%s); starting afresh", exc)
        return False
    state.slicer_saved = text
    return True


def persist_turns(state: DaemonState) -> None:
    """Keep the time-slicer's turns, if they changed since they were last kept."""
    if state.slicer is None:
        return
    text = json.dumps(state.slicer.save(), sort_keys=True, separators=(",", ":"))
    if text == state.slicer_saved:
        return
    try:
        state.store.save_policy_state(
            state.config.scheduler.policy + TURNS_SUFFIX, text, time.time()
        )
    except StateError as exc:
        log.warning("time-slicing turns not kept: %s", exc)
        return
    state.slicer_saved = text


def persist(state: DaemonState) -> None:
    """Keep what the policy remembers now, if it changed since it was last kept."""
    policy = _remembering(state)
    if policy is None:
        return
    text = json.dumps(policy.save(), sort_keys=True, separators=(",", ":"))
    if text == state.policy_saved:
        return
    try:
        state.store.save_policy_state(state.config.scheduler.policy, text, time.time())
    except StateError as exc:
        log.warning("policy memory not kept: %s", exc)
        return
    state.policy_saved = text


PACKS_KEY = "#packs"
"""The book of packs is kept under this key, whatever the policy: packs outlive a switch."""


def restore_packs(state: DaemonState) -> bool:
    """Give the daemon its book of packs as last committed; True if there was one."""
    text = state.store.policy_state(PACKS_KEY)
    if text is None:
        return False
    try:
        saved = json.loads(text)
        state.packs.restore(saved if isinstance(saved, dict) else {})
    except ValueError as exc:
        log.warning("book of packs dropped (%s); packed jobs are unpacked as seen", exc)
        return False
    state.packs_saved = text
    return True


def commit_packs(state: DaemonState) -> None:
    """Commit the book of packs now, if it changed (StateError if it cannot be written)."""
    text = json.dumps(state.packs.save(), sort_keys=True, separators=(",", ":"))
    if text == state.packs_saved:
        return
    state.store.save_policy_state(PACKS_KEY, text, time.time())
    state.packs_saved = text
