"""The widgets of the main view around the queue table: GPU panel, banner, status line.

Each shows plain `Text`, never markup, with outside text (daemon messages, GPU
names, the filter) through `gpuq.textsafe.visible`: a `[/x]` in a filter would
otherwise stop the app with a markup error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from rich.text import Text
from textual.widgets import Static

from gpuq.textsafe import visible
from gpuq.tui.gpumodel import (
    GpuBoard,
    NodeGroup,
    gpu_mark,
    memory_segments,
    memory_text,
    node_state_text,
    sparkline,
    utilization_text,
)

MARK_STYLES: Final = {"time-sliced": "bold magenta", "whole": "cyan", "idle": "dim"}


class Banner(Static):
    """A red line across the top while the daemon is unreachable."""

    DEFAULT_CSS = """
    Banner { display: none; background: $error; color: $text; text-style: bold; padding: 0 1; }
    Banner.-shown { display: block; }
    """

    def show_message(self, text: str) -> None:
        """Show the banner with `text`."""
        self.update(Text(visible(text)))
        self.add_class("-shown")

    def hide(self) -> None:
        """Hide the banner."""
        self.remove_class("-shown")

    @property
    def shown(self) -> bool:
        """Whether the banner is visible."""
        return self.has_class("-shown")


class GpuPanel(Static):
    """Every GPU: memory bar by owner, utilization sparkline, mark and jobs.

    With several servers, each server's GPUs come under a line with its name
    and GPU count, or, for a server that is down, since when and why.
    """

    DEFAULT_CSS = """
    GpuPanel { height: auto; padding: 0 1; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__("", id=id)
        self.board = GpuBoard()
        self.job_states: Mapping[int, str] = {}
        self.compact = False
        self.now = 0.0
        self._lines = 0

    def show_board(
        self, board: GpuBoard, job_states: Mapping[int, str], compact: bool, now: float
    ) -> None:
        """Redraw from `board`; `job_states` tells which jobs are suspended; `now` for ages."""
        self.board = board
        self.job_states = job_states
        self.compact = compact
        self.now = now
        text = self.render_board(max(60, self.size.width - 2))
        lines = len(text.plain.splitlines())
        if lines != self._lines:
            # A fixed height spares every later layout from measuring the text.
            self.styles.height = lines
            self._lines = lines
        self.update(text, layout=False)

    def on_resize(self) -> None:
        """Redraw at the new width."""
        self.update(self.render_board(max(60, self.size.width - 2)))

    def render_board(self, width: int) -> Text:
        """The panel's text for a given width."""
        board = self.board
        if not board.several_nodes:
            if not board.gpus:
                return Text("No GPUs (CPU-only jobs run with --gpus 0).", style="dim")
            return Text("\n").join(self._gpu_lines(gpu, width) for gpu in board.gpus)
        lines = []
        for group in board.groups():
            lines.append(self._node_header(group, width))
            lines.extend(self._gpu_lines(gpu, width) for gpu in group.gpus)
        return Text("\n").join(lines)

    def _node_header(self, group: NodeGroup, width: int) -> Text:
        """`gpu2  4 GPUs`, or `gpu3  down for 5m: why` in red: one line, cut to `width`."""
        header = Text(visible(group.node or "?"), style="bold underline")
        state = group.server.get("state", "up") if group.server else "up"
        style = "bold red" if group.down else ("dim" if state == "up" else "yellow")
        detail = visible(node_state_text(group, self.now))
        header.append(f"  {detail}"[: max(0, width - header.cell_len)], style=style)
        return header

    def _gpu_lines(self, gpu: dict[str, Any], width: int) -> Text:
        mark = gpu_mark(gpu, self.job_states)
        jobs = ",".join(map(str, gpu.get("jobs", ()))) or "-"
        history = list(self.board.history.get(gpu["uuid"], ()))
        head = Text(f"{gpu['index']:>2} ", style="bold")
        name = visible(str(gpu["name"]))[:22].ljust(22)
        head.append(name + " ")
        mem = memory_text(gpu).rjust(12)
        util = utilization_text(gpu).rjust(4)
        if self.compact:
            bar_width = max(10, width - 80)
            line = head + self._bar(gpu, bar_width)
            line.append(f" {mem} ")
            line.append(sparkline(history, 10), style="cyan")
            line.append(f" {util} ")
            line.append(f"{mark:<12}", style=MARK_STYLES.get(mark, "bold yellow"))
            line.append(f" {jobs}"[: max(0, width - line.cell_len)])
            return line
        bar_width = max(10, width - 40)
        first = head + self._bar(gpu, bar_width)
        first.append(f" {mem}")
        second = Text(f"    util {util} ")
        second.append(sparkline(history, min(len(history), 30)).ljust(30), style="cyan")
        second.append("  ")
        second.append(f"{mark:<12}", style=MARK_STYLES.get(mark, "bold yellow"))
        second.append(f" jobs {jobs}"[: max(0, width - second.cell_len)])
        return Text("\n").join([first, second])

    @staticmethod
    def _bar(gpu: dict[str, Any], width: int) -> Text:
        parts = memory_segments(gpu, width)
        bar = Text()
        bar.append("█" * parts.gpuq, style="green")
        bar.append("█" * parts.foreign, style="yellow")
        bar.append("░" * parts.free, style="bright_black")
        return bar


class StatusLine(Static):
    """One line of context: server, counts, filter and sort."""

    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; padding: 0 1; }
    """

    def show_status(self, parts: Iterable[str]) -> None:
        """Show the parts separated by two spaces (one line: no new layout needed)."""
        self.update(Text(visible("  ".join(p for p in parts if p))), layout=False)
