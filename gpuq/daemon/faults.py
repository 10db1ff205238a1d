"""Named crash points, so tests can SIGKILL the daemon at an exact step.

Set `GPUQ_CRASH_POINT=NAME[:N]` in the daemon's environment and it kills
itself with SIGKILL the Nth time (default: first) it passes `crash_point(NAME)`.
Unset, each call is one dictionary lookup. The points mark the windows that
recovery must get right: between committing an intent and acting on it.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "submit-committed",  # jobs inserted, reply not yet sent
    "starting-committed",  # STARTING written, shim not yet spawned
    "shim-spawned",  # shim running, RUNNING not yet written
    "exit-observed",  # shim ended, final state not yet written
)
"""The points every job passes, each tested with a stream of jobs (tests/test_crash_recovery.py)."""
SCHEDULER_POINTS = (
    "preempt-committed",  # a preemption's intent written, request not yet sent
    "turn-committed",  # a turn's end (park or stop) written, not yet asked of the job
    "resume-committed",  # a turn's start written, the job not yet resumed
    "pack-committed",  # a pack's intent written, the guest not yet joining the GPU
    "unpack-committed",  # an unpack's intent written, the leaving job not yet asked to go
    "move-booked",  # a move's GPUs booked, the job not yet asked to checkpoint
    "move-committed",  # a move's checkpoint intent written, request not yet sent
    "move-checkpointed",  # a moved job checkpointed and queued, not yet restarted
)
"""The points of the scheduler's actions, each tested with its action (tests/test_live_*.py)."""
CLUSTER_POINTS = (
    "remote-launched",  # another server started an attempt, RUNNING not yet written
    "checkpoint-copying",  # a start on another node committed, its checkpoint not yet copied
    "checkpoint-copied",  # the checkpoint copied and put in place, the job not yet launched
)
"""The points of work across servers (tests/test_remote_crash.py)."""
_counts: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process if the environment asks for a crash here."""
    wanted = os.environ.get("GPUQ_CRASH_POINT")
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] >= int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
