"""A job's attempts and migrations, read from its event history (pure).

An attempt begins at each `starting`; it runs while the job is `running` or
`suspending` (a stop- or park-mode suspend pauses it without ending it), and
it ends when the job last stops running in it: the event that ended it (an
exit, a retry, a checkpoint suspend, a cancel) gives its state and reason.
`gpuq show` prints one line per attempt.

A migration (`gpuq migrate`) leaves a known trail of events, from which
`migrations` gives the time of each phase: drain (from the request until
the job stopped at an iteration boundary), save (its checkpoint, as the
runner measured it), copy (to the target, checked), start (the new
attempt's launch there) and restore + first step (until its first metrics
sample).
"""

from __future__ import annotations

import re
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


MIGRATING = "migrating to "
_SAVED = re.compile(r"checkpoint saved at step \d+ \([^()]* in (?P<seconds>[\d.]+)s\)")
_COPIED = re.compile(r"^checkpoint copied from (?P<source>\S+) to (?P<target>\S+): ")


@dataclass(frozen=True, slots=True)
class Migration:
    """One migration and how long each phase took (None: not reached, or not known)."""

    source: str | None
    target: str
    requested: float
    drain: float | None = None
    save: float | None = None
    copy: float | None = None
    start: float | None = None
    first_step: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON encoding (the `migrations` of `gpuq show --json`)."""
        return {
            "from": self.source,
            "to": self.target,
            "requested": self.requested,
            "drain": self.drain,
            "save": self.save,
            "copy": self.copy,
            "start": self.start,
            "first_step": self.first_step,
        }


def migrations(events: Sequence[JobEvent], sample_times: Sequence[float]) -> list[Migration]:
    """Every migration in `events`, with its phases; `sample_times`: the job's metrics samples."""
    found: list[Migration] = []
    for index, event in enumerate(events):
        if event.state is not JobState.SUSPENDING or not event.reason.startswith(MIGRATING):
            continue
        target = event.reason.removeprefix(MIGRATING).split(",")[0].split(" ")[0]
        found.append(_phases(events[index:], target, sample_times))
    return found


def _phases(events: Sequence[JobEvent], target: str, sample_times: Sequence[float]) -> Migration:
    """The phases of the migration whose request is `events[0]`."""
    requested = events[0].time
    saved = starting = copied = running = None
    save = None
    source = None
    for event in events[1:]:
        if saved is None:
            match = _SAVED.search(event.reason)
            if match is None:
                if event.state not in (JobState.SUSPENDING, JobState.RUNNING):
                    break  # it ended otherwise: withdrawn, cancelled, failed
                continue
            saved, save = event.time, float(match["seconds"])
        elif starting is None and event.state is JobState.STARTING:
            starting = event.time
        elif copied is None and (match := _COPIED.search(event.reason)):
            copied, source = event.time, match["source"]
        elif starting is not None and event.state is JobState.RUNNING:
            running = event.time
            break
    drain = None if saved is None or save is None else max(0.0, saved - requested - save)
    begun = copied or starting
    first = next((t for t in sample_times if running is not None and t >= running), None)
    return Migration(
        source,
        target,
        requested,
        drain,
        save,
        None if copied is None or starting is None else copied - starting,
        None if running is None or begun is None else running - begun,
        None if first is None or running is None else first - running,
    )
