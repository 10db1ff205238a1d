"""The queue table under updates: what it shows, and what repaint each update costs.

The app runs on a `ReplaySource` (no daemon) with a clock the test moves, so
each test can change jobs through the same handlers the event stream uses
and look at the table and at the screen's layout passes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.screen import Screen

from gpuq.tui.app import GpuqTop
from gpuq.tui.messages import JobChanged
from gpuq.tui.model import TIME_COLUMN, row_cells
from gpuq.tui.replay import ReplaySource, synthetic_lab
from tests.test_tui_model import job

NOW = 1_800_000_000.0
SIZE = (140, 45)


def run_top(
    n_jobs: int, scenario: Callable[[GpuqTop, Pilot[Any], list[float]], Awaitable[None]]
) -> None:
    """Run `scenario` on a replayed lab of `n_jobs`; the list holds the app's clock."""
    clock = [NOW]
    lab = synthetic_lab(n_jobs=n_jobs, n_gpus=2, now=NOW)
    app = GpuqTop(
        ReplaySource(lab), interval=3600, clock=lambda: clock[0], reconnect_delays=(3600,)
    )

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            while not app.connected:
                await pilot.pause(0.02)
            await pilot.pause()
            await scenario(app, pilot, clock)

    asyncio.run(main())


def change(app: GpuqTop, *jobs: dict[str, Any]) -> None:
    """Deliver job changes as the event stream does, and apply them now."""
    for changed in jobs:
        app.on_job_changed(JobChanged(changed))
    app.flush_jobs()


def count_layouts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the screen's layout passes from now on (one list entry per pass)."""
    layouts: list[int] = []
    original = Screen._refresh_layout

    def counted(screen: Screen[Any], *args: Any, **kwargs: Any) -> None:
        layouts.append(1)
        original(screen, *args, **kwargs)

    monkeypatch.setattr(Screen, "_refresh_layout", counted)
    return layouts


def test_a_new_row_count_moves_the_scrollbar_without_laying_out_the_screen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def scenario(app: GpuqTop, pilot: Pilot[Any], clock: list[float]) -> None:
        table = app.table
        assert table.show_vertical_scrollbar
        rows = table.row_count
        layouts = count_layouts(monkeypatch)
        change(app, job(90_001, "queued", user="zed"), job(90_002, "queued", user="zed"))
        await pilot.pause()
        assert table.row_count == rows + 2
        assert table.virtual_size.height == rows + 3  # the header line, then the rows
        assert table.vertical_scrollbar.window_virtual_size == rows + 3
        assert table.has_row(90_001) and table.has_row(90_002)
        assert layouts == []

    run_top(400, scenario)


def test_rows_outgrowing_the_table_bring_its_scrollbar(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(app: GpuqTop, pilot: Pilot[Any], clock: list[float]) -> None:
        table = app.table
        shown_before = table.show_vertical_scrollbar
        layouts = count_layouts(monkeypatch)
        change(app, *(job(90_000 + i, "queued") for i in range(table.size.height + 5)))
        await pilot.pause()
        assert (shown_before, table.show_vertical_scrollbar) == (False, True)
        assert layouts  # a scrollbar takes a column: that one needs a layout
        table.action_jump(-1)
        await pilot.pause()
        assert table.scroll_y > 0

    run_top(0, scenario)


def test_a_reloaded_row_shows_the_current_run_time() -> None:
    async def scenario(app: GpuqTop, pilot: Pilot[Any], clock: list[float]) -> None:
        running = job(90_001, "running", start_time=NOW - 60, user="zed")
        finished = job(90_002, "succeeded", start_time=NOW - 600, end_time=NOW - 300, user="zed")
        change(app, running, finished)
        app.set_filter("user:zed state:running,succeeded")
        assert app.table.cell(90_001, "time") == row_cells(running, NOW)[TIME_COLUMN]
        clock[0] = NOW + 7200
        app.set_filter("")
        app.set_filter("user:zed state:running,succeeded")
        for shown in (running, finished):
            assert app.table.cell(shown["id"], "time") == row_cells(shown, clock[0])[TIME_COLUMN]
        assert app.table.cell(90_001, "time") != row_cells(running, NOW)[TIME_COLUMN]

    run_top(50, scenario)


def test_columns_widen_to_the_longest_value_up_to_a_cap() -> None:
    async def scenario(app: GpuqTop, pilot: Pilot[Any], clock: list[float]) -> None:
        widths = app.table._widths
        name_width = widths["name"]
        change(app, job(90_001, "queued", name="n" * (name_width + 3)))
        assert widths["name"] == name_width + 3
        change(app, job(90_002, "queued", name="n" * 200))
        assert widths["name"] == 28
        change(app, job(90_003, "queued", name="short"))
        assert widths["name"] == 28  # widths never shrink while the app runs

    run_top(0, scenario)


def test_a_job_fetched_after_an_action_never_undoes_a_streamed_transition() -> None:
    async def scenario(app: GpuqTop, pilot: Pilot[Any], clock: list[float]) -> None:
        change(app, job(90_001, "running", start_time=NOW - 60, user="zed"))
        cancelled = job(90_001, "cancelled", start_time=NOW - 60, end_time=NOW, user="zed")
        app.on_job_changed(JobChanged(cancelled))
        # The action's own fetch ran before the kill landed, but arrives later.
        stale = job(90_001, "running", start_time=NOW - 60, user="zed")
        app.on_job_changed(JobChanged(stale, refreshed=True))
        app.flush_jobs()
        assert app.model.jobs[90_001]["state"] == "cancelled"
        assert not app.table.has_row(90_001)  # finished jobs leave the default view
        # A fetched copy in the known state does update it: a new priority has no event.
        change(app, job(90_002, "queued", user="zed"))
        app.on_job_changed(
            JobChanged(job(90_002, "queued", user="zed", priority=5), refreshed=True)
        )
        app.flush_jobs()
        assert app.model.jobs[90_002]["priority"] == 5

    run_top(0, scenario)
