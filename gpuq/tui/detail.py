r"""The job detail view: spec, history with reasons, live log tail, runner charts.

Data comes from thread workers (`show`, `metrics` polled every interval,
`logs` followed); they hand results to the UI thread with `call_from_thread`
and stop when the screen closes. `show` is fetched again whenever the job
changes and, while an adaptive job runs, every `SIZING_POLLS` intervals:
the policy's note on its GPU count changes as other jobs come and go.

Everything shown is plain `Text`, never markup, and user text goes through
`gpuq.textsafe.visible`: a job named `[bold]x` shows those brackets, and
ESC in a name or in the job's output is drawn as `\x1b` rather than sent to
the terminal (Textual passes ESC through `Log`, `Label` and `Static`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Label, Log, Static

from gpuq.errors import GpuqError
from gpuq.textsafe import visible
from gpuq.tui.model import ago, job_facts
from gpuq.tui.series import CHARTS, Sample, Series, build_series, merge_samples, plot_rows
from gpuq.tui.source import Source
from gpuq.tui.table import STATE_STYLES

W = TypeVar("W", bound=Widget)

LOG_TAIL_LINES = 200
SIZING_POLLS = 5
"""Intervals between fetches of a running adaptive job's sizing note (5 s at `top`'s 1 s)."""
LOG_LAYOUT_CHARACTERS = "\n\r\t"
"""Control characters the log view lays out itself (line ends, tabs); others are escaped."""


class Chart(Static):
    """One runner metric over time: a caption and a small bar chart."""

    DEFAULT_CSS = """
    Chart { height: 4; width: 1fr; padding: 0 1; }
    """

    def __init__(self, key: str) -> None:
        super().__init__("", id=f"chart-{key}")
        self.series: Series | None = None

    def show_series(self, series: Series) -> None:
        """Draw `series` at the widget's width."""
        self.series = series
        self.refresh_chart()

    def on_resize(self) -> None:
        """Redraw at the new width."""
        self.refresh_chart()

    def refresh_chart(self) -> None:
        """Redraw the caption and the bars."""
        if self.series is None:
            return
        text = Text(self.series.caption, style="bold")
        for row in plot_rows(self.series.values, max(10, self.size.width - 2), 3):
            text.append("\n" + row, style="cyan")
        self.update(text)


class JobDetailScreen(Screen[None]):
    """Everything about one job; Escape goes back to the queue."""

    DEFAULT_CSS = """
    JobDetailScreen #title { height: 1; padding: 0 1; background: $panel; text-style: bold; }
    JobDetailScreen #top { height: 1fr; }
    JobDetailScreen #facts-pane { width: 1fr; padding: 0 1; }
    JobDetailScreen #charts { width: 1fr; }
    JobDetailScreen #no-charts { color: $text-muted; padding: 1; }
    JobDetailScreen #log { height: 12; border-top: solid $primary; }
    """
    BINDINGS = [
        Binding("escape,backspace", "back", "Back"),
        Binding("e", "refresh_detail", "Reload"),
    ]

    def __init__(self, job_id: int, source: Source, interval: float, clock: Callable[[], float]):
        super().__init__()
        self.job_id = job_id
        self.source = source
        self.interval = interval
        self.clock = clock
        self.job: dict[str, Any] | None = None
        self.events: list[dict[str, Any]] = []
        self.sizing: str | None = None
        self.samples: list[Sample] = []
        self.metrics_supported: bool | None = None
        self._stop = threading.Event()
        self._log_stream: Any = None

    def compose(self) -> ComposeResult:
        """Title, facts and history beside the charts, the log tail below."""
        yield Label(f"Job {self.job_id}", id="title")
        with Horizontal(id="top"):
            with VerticalScroll(id="facts-pane"):
                yield Static("loading…", id="facts")
                yield Static("", id="history")
            with Vertical(id="charts"):
                yield Label("", id="no-charts")
                for spec in CHARTS:
                    yield Chart(spec.key)
        yield Log(id="log", max_lines=2000, auto_scroll=True)
        yield Footer()

    def on_mount(self) -> None:
        """Start loading the job, its metrics and its output."""
        self.load_job()
        self.poll_metrics()
        self.poll_sizing()
        self.follow_log()

    def _widget(self, selector: str, kind: type[W]) -> W | None:
        """The widget, or None once the screen is closing.

        A result a worker hands over with `call_from_thread` may arrive after
        the screen's widgets are removed and before its own `on_unmount`
        runs; it is dropped then (found with a loaded test machine).
        """
        if self._stop.is_set():
            return None
        try:
            return self.query_one(selector, kind)
        except NoMatches:
            return None

    def on_unmount(self) -> None:
        """Stop the workers: the poll loop and the log stream."""
        self._stop.set()
        if self._log_stream is not None:
            self._log_stream.interrupt()

    @work(thread=True, exclusive=True, group="detail-show")
    def load_job(self) -> None:
        """Fetch the job and its history."""
        try:
            result = self.source.show(self.job_id)
        except GpuqError as exc:
            self.app.call_from_thread(self._show_error, exc.message)
            return
        self.app.call_from_thread(
            self.show_job, result["job"], result.get("events", []), result.get("sizing")
        )

    @work(thread=True, group="detail-sizing")
    def poll_sizing(self) -> None:
        """Fetch `show` again every `SIZING_POLLS` intervals while the job is adaptive and running.

        Its sizing note follows the policy's decisions, which other jobs'
        arrivals and ends drive without this job's record changing.
        """
        while not self._stop.wait(self.interval * SIZING_POLLS):
            job = self.job
            if job is None or job.get("gpus_max") is None or job["state"] != "running":
                continue
            try:
                result = self.source.show(self.job_id)
            except GpuqError:
                continue
            sizing = result.get("sizing")
            if sizing != self.sizing:
                self.app.call_from_thread(self.show_job, result["job"], None, sizing)

    @work(thread=True, group="detail-metrics")
    def poll_metrics(self) -> None:
        """Fetch new metrics samples every interval until the screen closes."""
        since = 0.0
        while not self._stop.is_set():
            try:
                samples = self.source.metrics(self.job_id, since)
            except GpuqError:
                samples = []
            if samples is None:
                self.app.call_from_thread(self.show_samples, None)
                return
            if samples or since == 0.0:
                since = max([since, *(s["time"] for s in samples)])
                self.app.call_from_thread(self.show_samples, samples)
            self._stop.wait(self.interval)

    @work(thread=True, group="detail-log")
    def follow_log(self) -> None:
        """Stream the last lines of the job's output, then what it appends."""
        try:
            self._log_stream = self.source.logs(self.job_id, LOG_TAIL_LINES, True)
            if self._stop.is_set():
                return
            for event in self._log_stream:
                self.app.call_from_thread(self._write_log, str(event.get("data", "")))
        except GpuqError as exc:
            if not self._stop.is_set():
                self.app.call_from_thread(self._write_log, f"[log unavailable: {exc.message}]\n")

    def _write_log(self, text: str) -> None:
        log = self._widget("#log", Log)
        if log is not None:
            log.write(visible(text, keep=LOG_LAYOUT_CHARACTERS))

    def _show_error(self, message: str) -> None:
        facts = self._widget("#facts", Static)
        if facts is not None:
            facts.update(Text(visible(message), style="bold red"))

    def show_job(
        self,
        job: dict[str, Any],
        events: list[dict[str, Any]] | None = None,
        sizing: str | None = None,
    ) -> None:
        """Draw the job's facts and, when given, its history.

        `sizing` is the policy's note from `show`; a job change from the
        subscription carries none and keeps the last one while the job runs.
        """
        title_label = self._widget("#title", Label)
        facts_pane = self._widget("#facts", Static)
        history_pane = self._widget("#history", Static)
        if title_label is None or facts_pane is None or history_pane is None:
            return
        self.job = job
        if events is not None:
            self.events = events
            self.sizing = sizing
        elif sizing is not None:
            self.sizing = sizing
        if job["state"] != "running":
            self.sizing = None
        now = self.clock()
        title = Text(f"Job {job['id']}: {visible(job['name'])}  ")
        title.append(job["state"], style=STATE_STYLES.get(job["state"], ""))
        title_label.update(title)
        facts = Table.grid(padding=(0, 2))
        facts.add_column(style="bold")
        facts.add_column()
        for label, value in job_facts(job, now, self.sizing):
            facts.add_row(label, Text(value))  # Text: a command's "[x]" is not markup
        facts_pane.update(facts)
        history = Table(title="History", title_justify="left", box=None, padding=(0, 1))
        history.add_column("WHEN", no_wrap=True)
        history.add_column("STATE", no_wrap=True)
        history.add_column("REASON")
        for event in self.events:
            history.add_row(
                ago(event["time"], now),
                Text(event["state"], style=STATE_STYLES.get(event["state"], "")),
                Text(visible(event["reason"])),
            )
        history_pane.update(history)

    def show_samples(self, samples: list[Sample] | None) -> None:
        """Add samples to the charts; None means the daemon reports no metrics."""
        note = self._widget("#no-charts", Label)
        if note is None:
            return
        if samples is None:
            self.metrics_supported = False
            note.update("No runner metrics: this daemon does not report them.")
            for hidden in self.query(Chart):
                hidden.display = False
            return
        self.metrics_supported = True
        self.samples = merge_samples(self.samples, samples)
        if not self.samples:
            note.update("No runner metrics yet (jobs report them through gpuq.runner).")
            note.display = True
            return
        note.display = False
        for series in build_series(self.samples):
            chart = self._widget(f"#chart-{series.spec.key}", Chart)
            if chart is not None:
                chart.show_series(series)

    def job_changed(self, job: dict[str, Any]) -> None:
        """The subscription saw this job change: redraw and reload its history."""
        self.show_job(job)
        self.load_job()

    def action_back(self) -> None:
        """Back to the queue (the workers' late results are dropped from now on)."""
        self._stop.set()
        self.app.pop_screen()

    def action_refresh_detail(self) -> None:
        """Fetch the job again."""
        self.load_job()
