"""How responsive the daemon is: its event loop's lag, and how long each decision takes.

Every client is served by one event loop, so nothing on it may run long;
the policy decides in a worker thread (`gpuq.daemon.scheduler.tick.decide`)
for that reason. Two records show whether that holds, in `gpuq daemon
status` (the `loop_lag` and `decisions` keys of the status reply):

- `LoopLag`: `watch_loop` sleeps `LAG_INTERVAL` again and again and records
  how late it wakes. Anything that holds the loop for d seconds makes a
  wake-up at least d - `LAG_INTERVAL` late, so the worst lateness over the
  last `LAG_WINDOW` seconds is the longest the loop was held, give or take
  one interval. Each wake-up costs about 80 us of CPU on a small VM: 0.4% of a core.
- `DecisionTimes`: the wall time of each decision, from the moment it is
  handed to the worker thread until its result is back, per policy (the
  policy may change on reload); the newest `DECISIONS_KEPT` are kept.

Times come from the monotonic clock (`time.perf_counter`); both records
are only read and written on the event loop.
"""

from __future__ import annotations

import asyncio
import gc
import math
import statistics
import time
from collections import deque
from typing import Any

LAG_INTERVAL = 0.02
"""Seconds between the loop watcher's wake-ups: the resolution of the lag it reports."""
LAG_WINDOW = 60.0
"""Seconds of wake-ups the reported loop lag covers."""
DECISIONS_KEPT = 100
"""Decisions per policy whose times are kept for the median and maximum."""


def nearest_rank(ordered: list[float], fraction: float) -> float:
    """The nearest-rank percentile of an ascending, non-empty list."""
    rank = math.ceil(round(fraction * len(ordered), 9))  # 0.99 * 100 is 99.00000000000001
    return ordered[min(len(ordered), max(1, rank)) - 1]


class LoopLag:
    """How late the watcher woke, over the last `window` seconds."""

    def __init__(self, window: float = LAG_WINDOW, interval: float = LAG_INTERVAL) -> None:
        self.window = window
        self.interval = interval
        self._wakeups: deque[tuple[float, float]] = deque()  # (woke at, seconds late)

    def record(self, woke_at: float, lateness: float) -> None:
        """Keep one wake-up, and forget those older than the window."""
        self._wakeups.append((woke_at, max(0.0, lateness)))
        self._forget(woke_at)

    def _forget(self, now: float) -> None:
        while self._wakeups and self._wakeups[0][0] < now - self.window:
            self._wakeups.popleft()

    def summary(self, now: float | None = None) -> dict[str, Any]:
        """`max` and `p99` lateness (seconds; 0 before any wake-up) over the window."""
        self._forget(time.perf_counter() if now is None else now)
        late = sorted(lateness for _, lateness in self._wakeups)
        return {
            "max": late[-1] if late else 0.0,
            "p99": nearest_rank(late, 0.99) if late else 0.0,
            "wakeups": len(late),
            "window": self.window,
            "interval": self.interval,
        }


async def watch_loop(lag: LoopLag, stop: asyncio.Event) -> None:
    """Sleep `lag.interval` at a time until `stop`, recording how late each wake-up is."""
    while not stop.is_set():
        due = time.perf_counter() + lag.interval
        await asyncio.sleep(lag.interval)
        woke = time.perf_counter()
        lag.record(woke, woke - due)


class DecisionTimes:
    """Each policy's decision times: how many, the last, and the newest few kept."""

    def __init__(self, kept: int = DECISIONS_KEPT) -> None:
        self.kept = kept
        self._times: dict[str, deque[float]] = {}
        self._counts: dict[str, int] = {}

    def record(self, policy: str, seconds: float) -> None:
        """Count one decision of `policy` that took `seconds`."""
        self._times.setdefault(policy, deque(maxlen=self.kept)).append(seconds)
        self._counts[policy] = self._counts.get(policy, 0) + 1

    def time(self, decision: asyncio.Future[Any], policy: str) -> None:
        """Record `decision`'s time from now until it returns (not if it fails or is cancelled)."""
        started = time.perf_counter()

        def done(future: asyncio.Future[Any]) -> None:
            if not future.cancelled() and future.exception() is None:
                self.record(policy, time.perf_counter() - started)

        decision.add_done_callback(done)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per policy: `count` of decisions, `last`, and `median` and `max` of the newest kept."""
        return {
            policy: {
                "count": self._counts[policy],
                "last": times[-1],
                "median": statistics.median(times),
                "max": max(times),
            }
            for policy, times in self._times.items()
        }


def freeze_heap() -> None:
    """Collect once, then keep what the daemon holds now out of the cyclic collector's walks.

    A full collection walks every tracked object and holds the event loop
    meanwhile: 25-57 ms each in a daemon with numpy, a policy and a thousand
    queued jobs. Modules, the configuration and the policy live as long as the
    daemon, so they are frozen once they exist (after the first scheduling
    pass, which imports what the policy needs); reference counting still
    frees anything among them that is dropped.
    """
    gc.collect()
    gc.freeze()
