"""Snapshots of `gpuq top`'s main views, drawn from recorded daemon payloads.

The app runs on a `ReplaySource` (fixed documents, no daemon) with a frozen
clock, a fixed terminal size and no periodic polling, so each picture is the
same on every run. Textual is pinned exactly; after a deliberate change,
review the diff and run `make snapshots` to accept the new pictures.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from textual.pilot import Pilot
from textual.widgets import Log

from gpuq.tui.app import GpuqTop
from gpuq.tui.detail import Chart, JobDetailScreen
from gpuq.tui.replay import Lab, ReplaySource, synthetic_cluster, synthetic_lab

NOW = 1_800_000_000.0
SIZE = (140, 45)


class SnapCompare(Protocol):
    """The `snap_compare` fixture of pytest-textual-snapshot."""

    def __call__(
        self,
        app: GpuqTop,
        press: tuple[str, ...] = (),
        terminal_size: tuple[int, int] = (80, 24),
        run_before: Callable[[Pilot[Any]], Awaitable[None]] | None = None,
    ) -> bool: ...


def top(source: ReplaySource) -> GpuqTop:
    """The app on a replay, with a frozen clock and no polling during the test."""
    return GpuqTop(source, interval=3600, clock=lambda: NOW, reconnect_delays=(3600,))


async def settle(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 20.0) -> None:
    """Let the app run until `condition()` holds (workers deliver in the background)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the app did not settle in time")
        await pilot.pause(0.05)
    await pilot.pause()


def test_empty_queue(snap_compare: SnapCompare) -> None:
    idle = synthetic_lab(n_jobs=0, n_gpus=2, now=NOW)
    app = top(ReplaySource(idle))

    async def loaded(pilot: Pilot[Any]) -> None:
        await settle(pilot, lambda: app.connected)

    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_busy_packed_gpus(snap_compare: SnapCompare) -> None:
    app = top(ReplaySource(synthetic_lab(n_jobs=60, n_gpus=4, now=NOW)))

    async def loaded(pilot: Pilot[Any]) -> None:
        await settle(pilot, lambda: app.connected and app.table.row_count > 0)

    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_several_servers_one_down(snap_compare: SnapCompare) -> None:
    lab = synthetic_cluster(
        60,
        {"gpu1": 2, "gpu2": 3, "gpu3": 2},
        {"gpu3": "ssh: connect to host gpu3 port 22: No route to host"},
        now=NOW,
    )
    app = top(ReplaySource(lab))

    async def loaded(pilot: Pilot[Any]) -> None:
        await settle(pilot, lambda: app.connected and app.table.row_count > 0)

    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_job_detail_with_charts(snap_compare: SnapCompare) -> None:
    app = top(ReplaySource(synthetic_lab(n_jobs=60, n_gpus=4, now=NOW)))

    async def detail(pilot: Pilot[Any]) -> None:
        await settle(pilot, lambda: app.connected and app.table.row_count > 0)
        await pilot.press("enter")

        def drawn() -> bool:
            screen = app.screen
            return (
                isinstance(screen, JobDetailScreen)
                and bool(screen.events)
                and all(chart.series is not None for chart in screen.query(Chart))
                and bool(screen.query_one("#log", Log).lines)
            )

        await settle(pilot, drawn)

    assert snap_compare(app, terminal_size=SIZE, run_before=detail)


def test_daemon_down(snap_compare: SnapCompare) -> None:
    app = top(ReplaySource(Lab(node="", jobs=[], gpu_samples=[]), down=True))

    async def banner(pilot: Pilot[Any]) -> None:
        await settle(pilot, lambda: app.disconnect_reason is not None)

    assert snap_compare(app, terminal_size=SIZE, run_before=banner)
