"""A job's attempts, read from its event history (pure).

An attempt begins at each `starting`; it runs while the job is `running` or
`suspending` (a stop- or park-mode suspend pauses it without ending it), and
it ends when the job last stops running in it: the event that ended it (an
exit, a retry, a checkpoint suspend, a cancel) gives its state and reason.
`gpuq show` prints one line per attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuq.models import JobEvent, JobState

RUNNING_STATES = frozenset({JobState.RUNNING, JobState.SUSPENDING})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt: when it started and ended, how long it ran, and how it ended."""

    number: int
    start_time: float | None
    end_time: float | None
    run_time: float
    state: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON encoding (the `attempts` of `gpuq show --json`)."""
        return {
            "attempt": self.number,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "run_time": self.run_time,
            "state": self.state,
            "reason": self.reason,
        }


def attempts(events: Sequence[JobEvent], now: float) -> list[Attempt]:
    """Every attempt in `events` (oldest first); the last may still be running."""
    found: list[Attempt] = []
    number = 0
    start: float | None = None
    since: float | None = None
    run = 0.0
    stop: JobEvent | None = None

    def close() -> None:
        if number:
            ongoing = since is not None
            found.append(
                Attempt(
                    number,
                    start,
                    None if ongoing or stop is None else stop.time,
                    run + (now - since if since is not None else 0.0),
                    "running" if ongoing or stop is None else stop.state.value,
                    "" if ongoing or stop is None else stop.reason,
                )
            )

    for event in events:
        if event.state is JobState.STARTING:
            close()
            number, start, since, run, stop = number + 1, None, None, 0.0, None
            continue
        if not number:
            continue
        if event.state in RUNNING_STATES:
            if since is None:
                since = event.time
                start = event.time if start is None else start
        elif since is not None or stop is None:
            if since is not None:
                run += max(0.0, event.time - since)
            since, stop = None, event
    close()
    return found
