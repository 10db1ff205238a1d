"""`gpuq top` driven by Textual's Pilot against a real daemon with fake GPUs.

Each test starts the app on the daemon's socket (through `DaemonSource`, the
code `gpuq top` runs), waits for what it expects by polling the app's state
with a timeout, acts with keys (or the mouse), and checks both the daemon's
own answer and what the view shows.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Static

from gpuq.protocol import METHODS
from gpuq.tui.app import GpuqTop
from gpuq.tui.detail import JobDetailScreen
from gpuq.tui.screens import ConfirmScreen, HelpScreen
from gpuq.tui.source import DaemonSource
from tests.daemon_harness import DaemonHarness, running_daemon

SIZE = (140, 45)


async def until(
    pilot: Pilot[Any], condition: Callable[[], Any], what: str, timeout: float = 20.0
) -> Any:
    """Let the app run until `condition()` is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await pilot.pause(0.05)


def run_app(
    daemon: DaemonHarness, scenario: Callable[[GpuqTop, Pilot[Any]], Awaitable[None]]
) -> None:
    """Run `scenario` against a `gpuq top` app connected to `daemon`."""

    async def main() -> None:
        app = GpuqTop(DaemonSource(daemon.config), interval=0.2, reconnect_delays=(0.1, 0.3))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected, "the first snapshot")
            await scenario(app, pilot)
            await pilot.press("q")

    asyncio.run(main())


def text_of(widget: Static) -> str:
    """The plain text a Static widget shows."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


def cell(app: GpuqTop, job_id: int, column: str) -> str:
    """The text of one cell of the queue table ("" when the job is not shown)."""
    return app.table.cell(job_id, column) if app.table.has_row(job_id) else ""


def shown_ids(app: GpuqTop) -> list[int]:
    """Job ids in table order."""
    return list(app.table.order)


async def select(pilot: Pilot[Any], app: GpuqTop, job_id: int) -> None:
    """Put the table cursor on `job_id`'s row with the arrow keys."""
    await until(pilot, lambda: app.table.has_row(job_id), f"job {job_id} shown")
    await pilot.press("home", *["down"] * (app.table.row_index(job_id) or 0))
    assert app.table.selected_job_id() == job_id


def test_the_views_fill_from_the_daemon(daemon: DaemonHarness) -> None:
    first = daemon.submit(["sleep", "300"], gpus=1)
    second = daemon.submit(["sleep", "300"], gpus=1)
    waiting = daemon.submit(["sleep", "300"], gpus=1)
    held = daemon.submit(["sleep", "300"], gpus=1, hold=True)
    daemon.wait_state(first, "running")
    daemon.wait_state(second, "running")

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.table.row_count == 4, "four jobs in the table")
        assert cell(app, first, "state") == "running"
        assert cell(app, waiting, "state") == "queued"
        assert cell(app, held, "state") == "held"
        assert "waiting" in cell(app, waiting, "reason")
        assert shown_ids(app)[:2] == sorted([first, second])  # running jobs sort first
        await until(pilot, lambda: len(app.board.gpus) == 2, "two GPUs")
        assert sorted(j for g in app.board.gpus for j in g["jobs"]) == sorted([first, second])
        panel = str(app.gpu_panel.render_board(120))
        assert "Fake A100" in panel and "whole" in panel
        status = text_of(app.query_one("#status", Static))
        assert "2 running" in status and "1 queued" in status and "1 held" in status

    run_app(daemon, scenario)


def test_filter_and_sort_the_queue(daemon: DaemonHarness) -> None:
    ids = [daemon.submit(["sleep", "300"], gpus=1, hold=True, name=f"job{i}") for i in range(4)]
    other = daemon.submit(["sleep", "300"], gpus=1, name="other")

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.table.row_count == 5, "five jobs")
        await pilot.press("slash")
        await pilot.press(*"state:held")
        await pilot.press("enter")
        await until(pilot, lambda: sorted(shown_ids(app)) == ids, "only the held jobs")
        await pilot.press("slash", "ctrl+a", "ctrl+k", *"name:other", "enter")
        await until(pilot, lambda: shown_ids(app) == [other], "only the job named other")
        await pilot.press("slash", "ctrl+a", "ctrl+k", "enter")
        await until(pilot, lambda: app.table.row_count == 5, "every job again")
        # A click on the ID header sorts by id; a second click reverses.
        await pilot.click("#jobs", offset=(2, 0))
        await until(pilot, lambda: shown_ids(app) == sorted(ids + [other]), "id order")
        await pilot.click("#jobs", offset=(2, 0))
        await until(pilot, lambda: shown_ids(app) == sorted(ids + [other])[::-1], "reversed")
        assert app.model.sort_column == "id" and app.model.reverse

    run_app(daemon, scenario)


def test_a_bad_filter_is_refused_with_a_hint(daemon: DaemonHarness) -> None:
    daemon.submit(["sleep", "300"], gpus=1, hold=True)

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.table.row_count == 1, "the job")
        await pilot.press("slash", *"colour:red", "enter")
        await until(pilot, lambda: app._notifications, "an error notification")
        message = next(iter(app._notifications)).message
        assert "unknown key 'colour'" in message and "state:" in message
        assert app.model.job_filter.text == "" and app.table.row_count == 1

    run_app(daemon, scenario)


def test_cancel_asks_first_then_reaches_the_daemon(daemon: DaemonHarness) -> None:
    job = daemon.submit(["sleep", "300"], gpus=1)
    daemon.wait_state(job, "running")

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await select(pilot, app, job)
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "no question")
        assert daemon.job(job)["state"] == "running"
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        daemon.wait_state(job, "cancelled")
        # Finished jobs leave the default view; `a` shows them.
        await until(pilot, lambda: not app.table.has_row(job), "the row to go")
        await pilot.press("a")
        await until(pilot, lambda: cell(app, job, "state") == "cancelled", "cancelled row")

    run_app(daemon, scenario)


def test_hold_release_and_priority_of_a_queued_job(daemon: DaemonHarness) -> None:
    blockers = [daemon.submit(["sleep", "300"], gpus=1) for _ in range(2)]
    for blocker in blockers:
        daemon.wait_state(blocker, "running")
    job = daemon.submit(["sleep", "300"], gpus=1)

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await select(pilot, app, job)
        await pilot.press("h")
        await until(pilot, lambda: cell(app, job, "state") == "held", "held in the view")
        assert daemon.job(job)["state"] == "held"
        await pilot.press("l")
        await until(pilot, lambda: cell(app, job, "state") == "queued", "queued again")
        await pilot.press("p", "ctrl+a", "ctrl+k", *"7", "enter")
        await until(pilot, lambda: cell(app, job, "priority") == "7", "priority 7 shown")
        assert daemon.job(job)["priority"] == 7

    run_app(daemon, scenario)


def test_suspend_and_resume_a_running_job(daemon: DaemonHarness) -> None:
    job = daemon.submit(["sleep", "300"], gpus=1)
    daemon.wait_state(job, "running")

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await select(pilot, app, job)
        await pilot.press("z")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
        await pilot.press("y")
        await until(pilot, lambda: cell(app, job, "state") == "suspended", "suspended row")
        assert daemon.job(job)["state"] == "suspended"
        await pilot.press("r")
        await until(pilot, lambda: cell(app, job, "state") == "running", "running row")
        assert daemon.job(job)["state"] == "running"

    run_app(daemon, scenario)


def test_retry_a_failed_job_and_report_a_refused_action(daemon: DaemonHarness) -> None:
    # Fails on its first attempt only, so the retried job stays running long enough to see.
    script = '[ "$GPUQ_ATTEMPT" = 1 ] && exit 1; exec sleep 300'
    job = daemon.submit(["sh", "-c", script], gpus=0)
    daemon.wait_state(job, "failed")

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await pilot.press("a")
        await select(pilot, app, job)
        await pilot.press("h")  # a failed job cannot be held: the daemon says why
        await until(pilot, lambda: app._notifications, "the refusal")
        assert "cannot" in next(iter(app._notifications)).message
        await pilot.press("t")
        await until(pilot, lambda: cell(app, job, "state") == "running", "the retried job")
        assert daemon.job(job)["attempts"] >= 1

    run_app(daemon, scenario)


def test_job_detail_shows_spec_history_and_output(daemon: DaemonHarness) -> None:
    job = daemon.submit(["sh", "-c", "echo hello-from-the-job; sleep 300"], gpus=1, name="talker")
    daemon.wait_state(job, "running")

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await select(pilot, app, job)
        await pilot.press("enter")
        screen = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "the detail"
        )
        assert screen.job_id == job
        await until(pilot, lambda: screen.job is not None and screen.events, "the job")
        facts = text_of(screen.query_one("#facts", Static))
        assert "echo hello-from-the-job" in facts and "talker" in text_of(
            screen.query_one("#title", Static)
        )
        assert [e["state"] for e in screen.events][-1] == "running"
        log = screen.query_one("#log")
        await until(pilot, lambda: "hello-from-the-job" in "\n".join(log.lines), "the output")
        await until(pilot, lambda: screen.metrics_supported is not None, "the metrics answer")
        assert screen.metrics_supported == ("metrics" in METHODS)
        # Actions apply to the job shown; the detail follows its state.
        await pilot.press("x", "y")
        await until(
            pilot,
            lambda: screen.job is not None and screen.job["state"] == "cancelled",
            "the detail to show the cancelled job",
        )
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, JobDetailScreen), "the queue")

    run_app(daemon, scenario)


def test_job_detail_follows_an_adaptive_jobs_sizing_note(tmp_path: Path) -> None:
    # Under pollux, a plain `--gpus 1-2` job alone on two GPUs is held on one to
    # explore; its speedup over a fair share doubles once a second job halves
    # that share, which changes the note without changing the job's record.
    config = '[scheduler]\npolicy = "pollux:population=16:generations=10"\ninterval = 1\n'
    note = "speedup {:.2f} over a fair share; 1 of 1-2 GPUs until its runner reports"
    with running_daemon(tmp_path / "d", extra_toml=config) as daemon:
        adaptive = daemon.submit(["sleep", "300"], gpus=1, gpus_max=2)
        daemon.wait_state(adaptive, "running")

        async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
            await select(pilot, app, adaptive)
            await pilot.press("enter")
            screen = await until(
                pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "the detail"
            )
            facts = screen.query_one("#facts", Static)
            await until(pilot, lambda: note.format(0.5) in text_of(facts), "the first note")
            other = daemon.submit(["sleep", "300"], gpus=1)
            daemon.wait_state(other, "running")
            await until(pilot, lambda: note.format(1.0) in text_of(facts), "the note after")
            daemon.call("cancel", ids=[adaptive])
            await until(pilot, lambda: "cancelled" in text_of(facts), "the cancelled job")
            assert "Sizing" not in text_of(facts)
            await pilot.press("escape")

        run_app(daemon, scenario)


def test_results_arriving_while_the_detail_closes_are_dropped(daemon: DaemonHarness) -> None:
    # A worker's result can land after the screen's widgets are removed and
    # before its on_unmount: it must be dropped, not crash the app.
    job = daemon.submit(["sleep", "300"], gpus=1, name="closing")
    daemon.wait_state(job, "running")

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await select(pilot, app, job)
        await pilot.press("enter")
        screen = await until(
            pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "the detail"
        )
        await until(pilot, lambda: screen.job is not None, "the job")
        await screen.query("#top, #log").remove()  # the widgets go first when a screen closes
        sample = {"time": 1.0, "step": 1, "epoch": 0, "loss": 0.5}
        screen.show_samples([sample])
        screen.show_samples(None)
        screen.show_job(dict(screen.job))
        screen._write_log("late output\n")
        screen._show_error("late error")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, JobDetailScreen), "the queue")

    run_app(daemon, scenario)


def test_help_and_command_palette(daemon: DaemonHarness) -> None:
    held = daemon.submit(["sleep", "300"], gpus=1, hold=True)
    daemon.submit(["sleep", "300"], gpus=1)

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await until(pilot, lambda: app.table.row_count == 2, "two jobs")
        await pilot.press("question_mark")
        help_screen = await until(
            pilot, lambda: isinstance(app.screen, HelpScreen) and app.screen, "the help"
        )
        assert ("x", "Cancel") in help_screen.sections["Queue and actions"]
        await pilot.press("escape")
        await pilot.press("ctrl+p")
        await pilot.press(*"only held", "enter")
        await until(pilot, lambda: shown_ids(app) == [held], "the palette's filter")

    run_app(daemon, scenario)


def test_banner_while_the_daemon_is_down_then_reconnects(daemon: DaemonHarness) -> None:
    job = daemon.submit(["sleep", "300"], gpus=1, hold=True)

    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        await select(pilot, app, job)
        banner = app.query_one("#banner")
        assert not banner.has_class("-shown")
        await asyncio.to_thread(daemon.stop)
        await until(pilot, lambda: banner.has_class("-shown"), "the banner")
        assert "Cannot reach the gpuq daemon" in text_of(app.query_one("#banner", Static))
        await asyncio.to_thread(daemon.start)
        await until(pilot, lambda: not banner.has_class("-shown"), "the banner to go")
        await until(pilot, lambda: app.connected, "the reconnection")
        assert cell(app, job, "state") == "held"
        await pilot.press("l")
        await until(pilot, lambda: cell(app, job, "state") in ("queued", "running"), "release")

    run_app(daemon, scenario)


def test_gpuq_top_without_a_terminal_points_to_the_json_commands(daemon: DaemonHarness) -> None:
    result = daemon.cli("top")
    assert result.returncode == 2
    assert "gpuq top needs a terminal" in result.stderr
    assert "gpuq ls --json" in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf"])
def test_gpuq_top_refuses_an_interval_that_is_not_a_positive_number(
    daemon: DaemonHarness, interval: str
) -> None:
    result = daemon.cli("top", "--interval", interval)
    assert result.returncode == 2
    assert f"--interval must be a positive number of seconds, got {interval}" in result.stderr
