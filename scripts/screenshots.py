"""Draw the `gpuq top` screenshots in docs/screenshots/ (SVG, from Textual).

The app runs headless on recorded payloads (`gpuq.tui.replay.synthetic_lab`)
with a frozen clock, so the pictures are the same on every run. Run from the
repository root: `python scripts/screenshots.py` (or `make screenshots`).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from gpuq.tui.app import GpuqTop
from gpuq.tui.detail import Chart, JobDetailScreen
from gpuq.tui.replay import ReplaySource, synthetic_lab
from gpuq.tui.screens import HelpScreen

OUT = Path(__file__).resolve().parents[1] / "docs" / "screenshots"
NOW = 1_800_000_000.0
SIZE = (140, 45)


async def settle(pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Let the app run until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the app did not settle")
        await pilot.pause(0.05)
    await pilot.pause()


async def main_view(app: GpuqTop, pilot: Pilot[Any]) -> None:
    """The GPUs and the queue."""


async def detail_view(app: GpuqTop, pilot: Pilot[Any]) -> None:
    """The first job's detail, charts drawn."""
    await pilot.press("enter")

    def drawn() -> bool:
        screen = app.screen
        return (
            isinstance(screen, JobDetailScreen)
            and bool(screen.events)
            and all(chart.series is not None for chart in screen.query(Chart))
        )

    await settle(pilot, drawn)


async def help_view(app: GpuqTop, pilot: Pilot[Any]) -> None:
    """The key help."""
    await pilot.press("question_mark")
    await settle(pilot, lambda: isinstance(app.screen, HelpScreen))


async def compact_view(app: GpuqTop, pilot: Pilot[Any]) -> None:
    """Sixteen GPUs, one line each."""
    await pilot.press("c")
    await pilot.pause()


SHOTS: dict[str, tuple[Callable[[GpuqTop, Pilot[Any]], Awaitable[None]], int, int]] = {
    "top-main": (main_view, 60, 4),
    "top-detail": (detail_view, 60, 4),
    "top-help": (help_view, 60, 4),
    "top-compact": (compact_view, 400, 16),
}
"""Screenshot name: (how to get there, jobs, GPUs)."""


async def shoot(name: str) -> Path:
    """Draw one screenshot and return its path."""
    steps, n_jobs, n_gpus = SHOTS[name]
    lab = synthetic_lab(n_jobs=n_jobs, n_gpus=n_gpus, now=NOW)
    app = GpuqTop(ReplaySource(lab), interval=3600, clock=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, lambda: app.connected and app.table.row_count > 0)
        await steps(app, pilot)
        path = OUT / f"{name}.svg"
        path.write_text(app.export_screenshot(title=f"gpuq top ({name.removeprefix('top-')})"))
        await pilot.press("q")
    return path


def main() -> int:
    """Write every screenshot."""
    OUT.mkdir(parents=True, exist_ok=True)
    for name in SHOTS:
        print(asyncio.run(shoot(name)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
