"""gpuq.daemon.timings: the event loop's lag and each policy's decision times."""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuq.daemon.timings import DecisionTimes, LoopLag, nearest_rank, watch_loop


@pytest.mark.parametrize(
    ("count", "fraction", "expected"),
    [(1, 0.99, 1), (100, 0.99, 99), (101, 0.99, 100), (1000, 0.99, 990), (10, 0.5, 5), (3, 1.0, 3)],
)
def test_nearest_rank(count: int, fraction: float, expected: int) -> None:
    assert nearest_rank([float(i) for i in range(1, count + 1)], fraction) == expected


def test_loop_lag_reports_max_and_p99_over_its_window_only() -> None:
    lag = LoopLag(window=10.0, interval=0.02)
    assert lag.summary(now=0.0) == {
        "max": 0.0,
        "p99": 0.0,
        "wakeups": 0,
        "window": 10.0,
        "interval": 0.02,
    }
    lag.record(0.0, 0.5)  # an old stall, forgotten once the window has passed it
    for i in range(1, 201):
        lag.record(5.0 + i / 100, 0.001 * (i % 100))
    lag.record(7.5, -0.001)  # a wake-up a hair early counts as on time
    summary = lag.summary(now=9.0)
    assert (summary["max"], summary["wakeups"]) == (0.5, 202)
    summary = lag.summary(now=10.5)
    assert summary["wakeups"] == 201
    assert summary["max"] == pytest.approx(0.099)
    assert summary["p99"] == pytest.approx(0.098)


def test_the_watcher_sees_a_blocked_loop() -> None:
    async def scenario() -> LoopLag:
        lag, stop = LoopLag(interval=0.01), asyncio.Event()
        watcher = asyncio.create_task(watch_loop(lag, stop))
        await asyncio.sleep(0.05)
        time.sleep(0.2)  # holding the loop is the point
        await asyncio.sleep(0.05)
        stop.set()
        await watcher
        return lag

    summary = asyncio.run(scenario()).summary()
    # the wake-up due within 0.01 s of the block's start came at least 0.19 s late
    assert summary["max"] >= 0.19
    assert summary["wakeups"] >= 3


def test_decision_times_per_policy_keep_the_newest() -> None:
    times = DecisionTimes(kept=3)
    assert times.summary() == {}
    for seconds in (5.0, 0.1, 0.3, 0.2):
        times.record("pollux", seconds)
    times.record("fifo", 0.01)
    assert times.summary() == {
        "pollux": {"count": 4, "last": 0.2, "median": 0.2, "max": 0.3},
        "fifo": {"count": 1, "last": 0.01, "median": 0.01, "max": 0.01},
    }


def test_a_decision_is_timed_until_it_returns_and_failures_are_not_counted() -> None:
    async def scenario() -> DecisionTimes:
        times = DecisionTimes()
        decided = asyncio.ensure_future(asyncio.to_thread(time.sleep, 0.05))
        times.time(decided, "gpuq")
        await decided
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        times.time(failed, "gpuq")
        failed.set_exception(ValueError("no decision"))
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        times.time(cancelled, "gpuq")
        cancelled.cancel()
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
        with pytest.raises(ValueError, match="no decision"):
            failed.result()
        return times

    summary = asyncio.run(scenario()).summary()
    assert summary["gpuq"]["count"] == 1
    assert summary["gpuq"]["last"] >= 0.05
