"""`gpuq top`: the Textual app that watches and steers the daemon.

Threading model: thread workers do every blocking daemon call and post
messages (`gpuq.tui.messages`); handlers on the app own all state. The
subscriber worker loads a snapshot, then follows the daemon's event stream;
job events are coalesced and applied to the table as row diffs. A poller
fetches the GPUs every interval. When the daemon goes away a banner says so
and the subscriber reconnects with backoff.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer

from gpuq.errors import GpuqError, UsageError
from gpuq.textsafe import visible
from gpuq.tui.actions import JobActionsApp
from gpuq.tui.detail import JobDetailScreen
from gpuq.tui.gpumodel import GpuBoard, gpus_summary
from gpuq.tui.messages import (
    Connected,
    Disconnected,
    GpusSampled,
    JobChanged,
)
from gpuq.tui.model import COLUMN_TITLES, NODE_COLUMN, JobFilter, QueueModel, summary_line
from gpuq.tui.screens import HelpScreen, PromptScreen, binding_rows
from gpuq.tui.source import Source
from gpuq.tui.table import JobTable
from gpuq.tui.widgets import Banner, GpuPanel, StatusLine

RECONNECT_DELAYS: Final = (0.5, 1.0, 2.0, 5.0)
"""Seconds between reconnection attempts; the last one repeats."""
FLUSH_DELAY: Final = 0.05
"""Job events arriving within this many seconds are applied to the table together."""
FILTER_HELP: Final = "state:running,queued  user:ana  name:bert  gpus:2  node:gpu2  or free words"


class GpuqTop(JobActionsApp):
    """The `gpuq top` application; `source` is the daemon (or a replay of one)."""

    TITLE = "gpuq top"
    CSS = """
    #gpu-scroll { height: auto; max-height: 45%; border-bottom: solid $primary; }
    #gpu-scroll.-hidden { display: none; }
    """
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("slash", "filter", "Filter", key_display="/"),
        Binding("s", "sort_next", "Sort"),
        Binding("S", "sort_reverse", "Reverse sort", show=False, key_display="S"),
        Binding("a", "toggle_finished", "Finished"),
        Binding("c", "toggle_compact", "Compact", show=False),
        Binding("g", "toggle_gpus", "Hide/show GPUs", show=False),
        Binding("x", "cancel_job", "Cancel"),
        Binding("z", "suspend_job", "Suspend"),
        Binding("r", "resume_job", "Resume"),
        Binding("h", "hold_job", "Hold", show=False),
        Binding("l", "release_job", "Release", show=False),
        Binding("p", "priority_job", "Priority", show=False),
        Binding("t", "retry_job", "Retry", show=False),
    ]

    def __init__(
        self,
        source: Source,
        *,
        interval: float = 1.0,
        compact: bool = False,
        clock: Callable[[], float] = time.time,
        reconnect_delays: Sequence[float] = RECONNECT_DELAYS,
    ) -> None:
        super().__init__()
        self.source = source
        self.interval = interval
        self.compact = compact
        self.clock = clock
        self.reconnect_delays = tuple(reconnect_delays)
        self.model = QueueModel()
        self.board = GpuBoard()
        self.node = ""
        self.connected = False
        self.disconnect_reason: str | None = None
        self._pending: dict[int, dict[str, Any]] = {}
        self._flush_timer: Any = None
        self._stopping = threading.Event()
        self._heap_frozen = False

    def compose(self) -> ComposeResult:
        """Banner, status line, GPU panel, queue table and key footer."""
        yield Banner(id="banner")
        yield StatusLine(id="status")
        with VerticalScroll(id="gpu-scroll"):
            yield GpuPanel(id="gpus")
        yield JobTable(id="jobs")
        yield Footer()

    @property
    def table(self) -> JobTable:
        """The queue table of the main screen."""
        return self.query_one("#jobs", JobTable)

    @property
    def gpu_panel(self) -> GpuPanel:
        """The GPU panel of the main screen."""
        return self.query_one("#gpus", GpuPanel)

    def on_mount(self) -> None:
        """Start the workers and the once-a-second clock tick."""
        self.table.focus()
        self._update_status()
        self.subscriber()
        self.poller()
        self.set_interval(1.0, self._tick)

    def stop_workers(self) -> None:
        """Tell the workers to end and wake any blocked on the daemon."""
        self._stopping.set()
        self.source.close()

    def on_unmount(self) -> None:
        """However the app ends, let the worker threads finish."""
        self.stop_workers()
        if self._heap_frozen:
            gc.unfreeze()

    def _freeze_heap(self) -> None:
        """Keep Python's full garbage collections off the objects of the first snapshot.

        Thousands of job dicts live as long as the app; walking them in every full
        collection stalls a refresh by tens of milliseconds. Collect once, then freeze
        what is alive (it is unfrozen when the app ends).
        """
        gc.collect()
        gc.freeze()
        self._heap_frozen = True

    async def action_quit(self) -> None:
        """Stop the workers and leave."""
        self.stop_workers()
        self.exit()

    @work(thread=True, group="subscriber")
    def subscriber(self) -> None:
        """Load a snapshot, follow the event stream; on failure report and retry."""
        attempt = 0
        while not self._stopping.is_set():
            reason = "the daemon closed the event stream"
            try:
                self._post(Connected(self.source.snapshot()))
                attempt = 0
                stream = self.source.subscribe(("jobs", "gpus"))
                if self._stopping.is_set():
                    return
                resynced = False
                for event in stream:
                    if not resynced:
                        # The subscription is live now: catch up on what changed meanwhile.
                        resynced = True
                        self._post(Connected(self.source.snapshot()))
                    if event.get("type") == "job":
                        self._post(JobChanged(event["job"]))
            except GpuqError as exc:
                reason = exc.message
            if self._stopping.is_set():
                return
            delay = self.reconnect_delays[min(attempt, len(self.reconnect_delays) - 1)]
            attempt += 1
            self._post(Disconnected(reason, delay))
            self._stopping.wait(delay)

    @work(thread=True, group="poller")
    def poller(self) -> None:
        """Fetch the GPUs every interval while connected."""
        while not self._stopping.wait(self.interval):
            if not self.connected:
                continue
            try:
                self._post(GpusSampled(self.source.gpus()))
            except GpuqError:
                continue  # the subscriber reports the outage

    def on_connected(self, message: Connected) -> None:
        """Show the snapshot: a full load the first time, a diff afterwards."""
        snapshot = message.snapshot
        self.connected = True
        self.disconnect_reason = None
        self.node = snapshot.node
        self.query_one("#banner", Banner).hide()
        self.board.update_many(snapshot.gpu_samples)
        now = self.clock()
        self._show_nodes(snapshot.jobs)
        if not self.model.jobs:
            self.model.replace(snapshot.jobs)
            self.table.load(self.model, now)
            self._freeze_heap()
        else:
            changes = self.model.sync(snapshot.jobs, now)
            if not changes.empty:
                self.table.apply(self.model, changes, now)
        self._draw_gpus()
        self._update_status()

    def on_disconnected(self, message: Disconnected) -> None:
        """Show the banner; the worker is already waiting to retry."""
        self.connected = False
        self.disconnect_reason = message.reason
        self.query_one("#banner", Banner).show_message(
            f"Cannot reach the gpuq daemon: {message.reason}. Reconnecting automatically…"
        )
        self._update_status()

    def on_job_changed(self, message: JobChanged) -> None:
        """Queue the change; bursts are applied together."""
        job = message.job
        if message.refreshed:
            known = self._pending.get(job["id"]) or self.model.jobs.get(job["id"])
            if known is not None and known["state"] != job["state"]:
                return  # maybe older than the transition the stream delivered
        self._pending[job["id"]] = job
        if self._flush_timer is None:
            self._flush_timer = self.set_timer(FLUSH_DELAY, self.flush_jobs)

    def flush_jobs(self) -> None:
        """Apply the queued job changes to the model, the table and an open detail view."""
        self._flush_timer = None
        if not self._pending:
            return
        jobs = list(self._pending.values())
        self._pending.clear()
        now = self.clock()
        self._show_nodes(jobs)
        changes = self.model.apply(jobs, now)
        if not changes.empty:
            self.table.apply(self.model, changes, now)
        for screen in self.screen_stack:
            if isinstance(screen, JobDetailScreen):
                for job in jobs:
                    if job["id"] == screen.job_id:
                        screen.job_changed(job)
        on_gpus = {job_id for gpu in self.board.gpus for job_id in gpu.get("jobs", ())}
        if any(job["id"] in on_gpus for job in jobs):
            self._draw_gpus()  # a packed GPU may have become time-sliced
        self._update_status()

    def on_gpus_sampled(self, message: GpusSampled) -> None:
        """Append the sample to the GPU history and redraw the panel."""
        self.board.update(message.document)
        self._show_nodes(())
        self._draw_gpus()

    def _show_nodes(self, jobs: Iterable[dict[str, Any]]) -> None:
        """Show the queue's NODE column once jobs may run on several servers.

        That is: the daemon has servers or GPUs on several, or the jobs known
        (`model.nodes`, with `jobs` about to join them) ran on more than one.
        """
        nodes = self.model.nodes | ({str(job.get("node") or "") for job in jobs} - {""})
        several = self.board.several_nodes or len(nodes) > 1
        self.table.show_column(NODE_COLUMN, several)

    def _draw_gpus(self) -> None:
        jobs = self.model.jobs
        states = {
            job_id: jobs[job_id]["state"]
            for gpu in self.board.gpus
            for job_id in gpu.get("jobs", ())
            if job_id in jobs
        }
        self.gpu_panel.show_board(self.board, states, self.compact, self.clock())

    def _tick(self) -> None:
        self.table.refresh_times(self.model, self.clock())

    def _update_status(self) -> None:
        model = self.model
        arrow = "↑" if model.reverse else "↓"
        gpus = gpus_summary(self.board)
        self.query_one("#status", StatusLine).show_status(
            [
                f"gpuq top · {self.node}" if self.node else "gpuq top",
                "DISCONNECTED" if self.disconnect_reason else "",
                gpus,
                summary_line(model.counts()),
                f"shown {self.table.row_count}",
                f"sort {COLUMN_TITLES[model.sort_column].lower()}{arrow}",
                f"filter '{model.job_filter.text}'" if model.job_filter.text else "",
                "+finished" if model.show_finished else "",
            ]
        )

    # Selection and views

    def current_job_id(self) -> int | None:
        """The job actions apply to: the detail view's, or the one under the cursor."""
        if isinstance(self.screen, JobDetailScreen):
            return self.screen.job_id
        return self.table.selected_job_id()

    @on(JobTable.RowSelected)
    def open_detail(self, event: JobTable.RowSelected) -> None:
        """Enter (or a second click) on a row opens the job's detail view."""
        self.push_screen(JobDetailScreen(event.job_id, self.source, self.interval, self.clock))

    @on(JobTable.HeaderSelected)
    def sort_by_header(self, event: JobTable.HeaderSelected) -> None:
        """A click on a column header sorts by it; a second click reverses."""
        column = event.column
        if column == self.model.sort_column:
            self.model.reverse = not self.model.reverse
        else:
            self.model.sort_column, self.model.reverse = column, False
        self._resort()

    def _resort(self) -> None:
        self.table.resort(self.model, self.clock())
        self._update_status()

    def _reload(self) -> None:
        self.table.load(self.model, self.clock())
        self._update_status()

    def action_sort_next(self) -> None:
        """Sort by the next column."""
        columns = self.table.columns
        current = self.model.sort_column
        index = (columns.index(current) + 1) % len(columns) if current in columns else 0
        self.model.sort_column = columns[index]
        self._resort()

    def action_sort_reverse(self) -> None:
        """Reverse the sort order."""
        self.model.reverse = not self.model.reverse
        self._resort()

    def action_toggle_finished(self) -> None:
        """Show or hide jobs that have ended."""
        self.model.show_finished = not self.model.show_finished
        self._reload()

    def action_toggle_compact(self) -> None:
        """One line per GPU, for servers with many GPUs."""
        self.compact = not self.compact
        self._draw_gpus()

    def action_toggle_gpus(self) -> None:
        """Hide or show the GPU panel."""
        self.query_one("#gpu-scroll").toggle_class("-hidden")

    def action_filter(self) -> None:
        """Ask for a filter; an empty one shows every job again."""
        self.push_screen(
            PromptScreen("Filter jobs", self.model.job_filter.text, FILTER_HELP),
            callback=self.set_filter,
        )

    def set_filter(self, text: str | None) -> None:
        """Apply filter text (None: keep the current filter)."""
        if text is None:
            return
        try:
            self.model.job_filter = JobFilter.parse(text)
        except UsageError as exc:
            text = f"{visible(exc.message)}\n{visible(exc.hint or '')}"
            self.notify(text, severity="error", title="Filter", markup=False)
            return
        self._reload()

    def action_help(self) -> None:
        """The key help screen."""
        self.push_screen(
            HelpScreen(
                {
                    "Queue and actions": binding_rows(self.BINDINGS),
                    "Job detail": binding_rows(JobDetailScreen.BINDINGS),
                    "Everywhere": [("ctrl+p", "Command palette"), ("enter", "Open job detail")],
                }
            )
        )

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        """The command palette: Textual's commands plus every job action and view toggle."""
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            if isinstance(binding, Binding) and binding.action not in ("quit", "help"):
                method = getattr(self, f"action_{binding.action}")
                yield SystemCommand(binding.description, method.__doc__ or "", method)
        for column in self.table.columns:
            yield SystemCommand(
                f"Sort by {COLUMN_TITLES[column].lower()}",
                "Order the queue by this column",
                lambda column=column: self._sort_by(column),
            )
        for state in ("running", "queued", "held", "suspended", "failed"):
            yield SystemCommand(
                f"Show only {state} jobs",
                f"Filter the queue to state:{state}",
                lambda state=state: self.set_filter(f"state:{state}"),
            )
        yield SystemCommand("Clear the filter", "Show every job again", lambda: self.set_filter(""))

    def _sort_by(self, column: str) -> None:
        self.model.sort_column, self.model.reverse = column, False
        self._resort()
