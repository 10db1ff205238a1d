"""The queue table: a line-rendered view of thousands of jobs.

Textual's DataTable re-renders every visible cell after any change and
re-measures every new row, which costs a tenth of a second per update at
5,000 rows. This widget keeps the shown ids in order, the text of each row,
and one rendered line per (row text, highlight, width) in a cache, so an
update re-renders only the rows whose text changed. Column widths grow to
fit what was shown and never shrink while the app runs, so rows do not jump
sideways; the last column (the reason) takes the remaining width. The NODE
column is hidden until the app shows it (jobs on several servers). A new row
count updates the scrollbar and repaints the table, without a layout of the
whole screen (the table's height does not depend on its rows).
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpuq.tui.model import (
    COLUMN_TITLES,
    COLUMNS,
    NODE_COLUMN,
    TIME_COLUMN,
    Job,
    QueueModel,
    RowChanges,
    row_cells,
    time_cell,
)

STATE_STYLES: Final = {
    "running": "bold green",
    "starting": "green",
    "suspending": "magenta",
    "suspended": "magenta",
    "queued": "yellow",
    "held": "dark_orange",
    "succeeded": "dim green",
    "failed": "bold red",
    "cancelled": "dim",
    "lost": "red",
}
RIGHT_ALIGNED: Final = frozenset({"id", "time", "priority"})
MIN_WIDTHS: Final = {column: len(COLUMN_TITLES[column]) for column in COLUMNS}
MAX_WIDTHS: Final = {"user": 12, "name": 28, "gpus": 9, "memory": 7, "node": 16}


class JobTable(ScrollView, can_focus=True):
    """The queue, one line per shown job; see the module docstring."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "jobtable--header",
        "jobtable--cursor",
        "jobtable--even",
    }
    DEFAULT_CSS = """
    JobTable { height: 1fr; background: $surface; }
    JobTable > .jobtable--header { background: $panel; text-style: bold; }
    JobTable > .jobtable--cursor { background: $primary 60%; text-style: bold; }
    JobTable > .jobtable--even { background: $boost; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "Up", show=False),
        Binding("down,j", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "jump(0)", "First", show=False),
        Binding("end", "jump(-1)", "Last", show=False),
        Binding("enter", "select", "Detail", show=False),
    ]

    class RowSelected(Message):
        """Enter, or a click on the highlighted row: open this job."""

        def __init__(self, job_id: int) -> None:
            super().__init__()
            self.job_id = job_id

    class HeaderSelected(Message):
        """A click on a column title."""

        def __init__(self, column: str) -> None:
            super().__init__()
            self.column = column

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self.order: list[int] = []
        self._index: dict[int, int] = {}
        self._cells: dict[int, tuple[str, ...]] = {}
        self._row_memo: dict[int, tuple[Job, tuple[str, ...]]] = {}
        self._widths = dict(MIN_WIDTHS)
        self._lines: LRUCache[Any, Strip] = LRUCache(2000)
        self.cursor_row = 0
        self.columns: tuple[str, ...] = tuple(c for c in COLUMNS if c != NODE_COLUMN)
        """The columns shown, in order (`show_column`)."""

    # Queries

    @property
    def row_count(self) -> int:
        """How many jobs are shown."""
        return len(self.order)

    def has_row(self, job_id: int) -> bool:
        """Whether `job_id` is shown."""
        return job_id in self._index

    def row_index(self, job_id: int) -> int | None:
        """Where `job_id` is shown, or None."""
        return self._index.get(job_id)

    def cell(self, job_id: int, column: str) -> str:
        """The text of one cell."""
        return self._cells[job_id][COLUMNS.index(column)]

    def show_column(self, column: str, shown: bool) -> None:
        """Show or hide one column (the NODE column, shown with several servers)."""
        columns = tuple(c for c in COLUMNS if c in self.columns or (shown and c == column))
        if not shown:
            columns = tuple(c for c in columns if c != column)
        if columns != self.columns:
            self.columns = columns
            self._lines.clear()
            self.refresh()

    def selected_job_id(self) -> int | None:
        """The job under the cursor, or None when the table is empty."""
        return self.order[self.cursor_row] if self.order else None

    # Updates from the model

    def load(self, model: QueueModel, now: float) -> None:
        """Show the model's visible jobs, keeping the cursor on its job."""
        keep = self.selected_job_id()
        order = model.visible_ids(now)
        jobs = model.jobs
        self._cells = {job_id: self._row(jobs[job_id], now) for job_id in order}
        if len(self._row_memo) > 2 * len(jobs):
            self._row_memo = {i: memo for i, memo in self._row_memo.items() if i in jobs}
        self._grow_widths(self._cells.values())
        self._set_order(order)
        self.keep_cursor_on(keep)

    def apply(self, model: QueueModel, changes: RowChanges, now: float) -> None:
        """Take added, updated and removed rows; re-sort only when the order may change."""
        keep = self.selected_job_id()
        for job_id in changes.removed:
            self._cells.pop(job_id, None)
        touched = [*changes.updated, *changes.added]
        for job_id in touched:
            self._cells[job_id] = self._row(model.jobs[job_id], now)
        self._grow_widths(self._cells[job_id] for job_id in touched)
        if changes.reorder or changes.removed:
            self._set_order(model.visible_ids(now))
        else:
            self.refresh()
        self.keep_cursor_on(keep)

    def resort(self, model: QueueModel, now: float) -> None:
        """Order the rows as the model sorts them now."""
        keep = self.selected_job_id()
        self._set_order(model.visible_ids(now))
        self.keep_cursor_on(keep)

    def refresh_times(self, model: QueueModel, now: float) -> None:
        """Update the TIME cell of the rows on screen (run and wait times tick)."""
        top = int(self.scroll_y)
        for job_id in self.order[top : top + self.size.height]:
            job, cells = model.jobs.get(job_id), self._cells.get(job_id)
            if job is None or cells is None:
                continue
            value = row_cells(job, now)[TIME_COLUMN]
            if cells[TIME_COLUMN] != value:
                self._cells[job_id] = (*cells[:TIME_COLUMN], value, *cells[TIME_COLUMN + 1 :])
                self.refresh()

    def _set_order(self, order: list[int]) -> None:
        self.order = order
        self._index = {job_id: index for index, job_id in enumerate(order)}
        self._fit_virtual_size()
        self.cursor_row = min(self.cursor_row, max(0, len(order) - 1))
        self.refresh()

    def _row(self, job: Job, now: float) -> tuple[str, ...]:
        """`row_cells(job, now)`, reusing the cells made for this same job object.

        A filter change rebuilds thousands of rows, most of them unchanged since
        they were last shown; only a run or wait time (no end time yet) moves.
        """
        memo = self._row_memo.get(job["id"])
        if memo is None or memo[0] is not job:
            cells = row_cells(job, now)
            self._row_memo[job["id"]] = (job, cells)
            return cells
        cells = memo[1]
        if job.get("end_time") is None:
            value = time_cell(job, now)
            if value != cells[TIME_COLUMN]:
                cells = (*cells[:TIME_COLUMN], value, *cells[TIME_COLUMN + 1 :])
        return cells

    def _grow_widths(self, rows: Any) -> None:
        widths = self._widths
        columns = zip(*rows, strict=False)  # one tuple of values per column
        for column, values in zip(COLUMNS[:-1], columns, strict=False):
            longest = max(map(len, values), default=0)
            if longest > widths[column]:
                widths[column] = min(longest, MAX_WIDTHS.get(column, 40))

    # Cursor

    def keep_cursor_on(self, job_id: int | None) -> None:
        """Move the cursor to `job_id`'s row, if it is shown."""
        index = self._index.get(job_id) if job_id is not None else None
        if index is not None:
            self.move_cursor(index)

    def move_cursor(self, row: int) -> None:
        """Put the cursor on row `row` and scroll it into view."""
        if not self.order:
            return
        self.cursor_row = max(0, min(row, len(self.order) - 1))
        body = max(1, self.size.height - 1)
        if self.cursor_row < self.scroll_y:
            self.scroll_to(y=self.cursor_row, animate=False)
        elif self.cursor_row >= self.scroll_y + body:
            self.scroll_to(y=self.cursor_row - body + 1, animate=False)
        self.refresh()

    def action_move(self, delta: int) -> None:
        """Cursor up or down."""
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        """Cursor a screen up or down."""
        self.move_cursor(self.cursor_row + direction * max(1, self.size.height - 2))

    def action_jump(self, row: int) -> None:
        """Cursor to the first (0) or last (-1) row."""
        self.move_cursor(len(self.order) - 1 if row < 0 else row)

    def action_select(self) -> None:
        """Open the job under the cursor."""
        job_id = self.selected_job_id()
        if job_id is not None:
            self.post_message(self.RowSelected(job_id))

    def on_click(self, event: events.Click) -> None:
        """A click on a title sorts; on a row highlights it, and a second click opens it."""
        if event.y == 0:
            column = self._column_at(event.x)
            if column is not None:
                self.post_message(self.HeaderSelected(column))
            return
        row = int(self.scroll_y) + event.y - 1
        if 0 <= row < len(self.order):
            if row == self.cursor_row or event.chain > 1:
                self.move_cursor(row)
                self.action_select()
            else:
                self.move_cursor(row)

    def _column_at(self, x: int) -> str | None:
        left = 0
        for column in self.columns:
            right = left + self._widths[column] + 2
            if x < right or column == self.columns[-1]:
                return column
            left = right
        return None  # pragma: no cover - the last column takes the rest

    # Rendering

    def on_resize(self) -> None:
        """Keep the virtual height in step with the rows."""
        self._fit_virtual_size()

    def _fit_virtual_size(self) -> None:
        size = Size(self.size.width, len(self.order) + 1)
        if size == self.virtual_size:
            return
        if not self.container_size:
            self.virtual_size = size  # not laid out yet: the first layout takes it
            return
        # The table's height comes from the screen, not from its rows, so a new row
        # count moves only the scrollbar: update it and repaint the table rather than
        # lay out (and so repaint) the whole screen. Should a scrollbar appear or go,
        # Textual's own scrollbar reactives still ask for the layout that needs.
        self.set_reactive(JobTable.virtual_size, size)
        self._scroll_update(size)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        """Line 0 is the header; the rest are rows from the scroll position."""
        width = self.size.width
        if y == 0:
            return self._line(None, COLUMN_TITLES_ROW, "jobtable--header", width)
        row = int(self.scroll_y) + y - 1
        if row >= len(self.order):
            return Strip.blank(width, self.rich_style)
        job_id = self.order[row]
        cells = self._cells.get(job_id)
        if cells is None:
            return Strip.blank(width, self.rich_style)
        if row == self.cursor_row:
            component = "jobtable--cursor"
        else:
            component = "jobtable--even" if row % 2 else ""
        return self._line(job_id, cells, component, width)

    def _line(
        self, job_id: int | None, cells: tuple[str, ...], component: str, width: int
    ) -> Strip:
        base = self.rich_style
        row_style = base + self.get_component_rich_style(component) if component else base
        key = (job_id, cells, row_style, width, tuple(self._widths.values()))
        strip = self._lines.get(key)
        if strip is None:
            text = Text(no_wrap=True, overflow="ellipsis")
            used = 0
            for column, value in zip(COLUMNS, cells, strict=True):
                if column not in self.columns:
                    continue
                if column == self.columns[-1]:
                    size = max(0, width - used - 1)
                else:
                    size = self._widths[column]
                shown = value if len(value) <= size else value[: max(0, size - 1)] + "…"
                shown = shown.rjust(size) if column in RIGHT_ALIGNED else shown.ljust(size)
                style = STATE_STYLES.get(value, "") if column == "state" and job_id else ""
                text.append(" " + shown + " ", style=style)
                used += size + 2
            segments = [
                Segment(s.text, s.style) for s in text.render(self.app.console) if s.text != "\n"
            ]
            strip = Strip(segments).crop_extend(0, width, None).apply_style(row_style)
            self._lines[key] = strip
        return strip


COLUMN_TITLES_ROW: Final = tuple(COLUMN_TITLES[column] for column in COLUMNS)
