"""`gpuq top` with 5,000 jobs and 16 GPUs: refresh render time and peak memory.

Targets: a refresh renders in under 50 ms, and the process stays under
200 MB. The app runs headless under Textual's Pilot on a `ReplaySource`
(recorded payloads: no daemon, so only the UI is measured), at a fixed
200x60 terminal. One *refresh* is what the app does on a live update: apply
a burst of changed jobs from the event stream, take a new GPU sample, tick
the run-time column, then lay out and render the screen (Textual's own
per-frame update, called synchronously so it is timed too). A *full redraw*
(a filter change: every row rebuilt) is timed as well. Each is reported as
the wall time of that synchronous work, and as the CPU time of the UI
thread (`time.thread_time`) until the app is idle again, which also counts
the table's deferred work (measuring new rows) and which a busy shared
machine inflates much less than wall time. Peak RSS is the process's
high-water mark. Run: `python -m bench.bench_tui [--cycles N]`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import resource
import statistics
import time
from typing import Any

from gpuq.tui.app import GpuqTop
from gpuq.tui.messages import GpusSampled, JobChanged
from gpuq.tui.replay import ReplaySource, synthetic_lab

TARGET_MS = 50.0
TARGET_RSS_MB = 200.0
NOW = 1_800_000_000.0


def peak_rss_mb() -> float:
    """The process's peak resident set size so far, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def render_now(app: GpuqTop) -> None:
    """Lay out and paint the screen now, as Textual's frame timer would."""
    app.screen._on_timer_update()


def changed_jobs(
    jobs: list[dict[str, Any]], rng: random.Random, count: int
) -> list[dict[str, Any]]:
    """`count` jobs with a new state and reason, as the event stream would send them."""
    out = []
    for job in rng.sample(jobs, count):
        changed = copy.copy(job)
        changed["state"] = rng.choice(("running", "queued", "held", "suspended"))
        changed["reason"] = f"changed at step {rng.randrange(10**6)}"
        out.append(changed)
    return out


def percentile(values: list[float], share: float) -> float:
    """The value below which `share` of `values` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def measure(n_jobs: int, n_gpus: int, cycles: int, burst: int) -> dict[str, Any]:
    """Run the app headless and time its refreshes."""
    lab = synthetic_lab(n_jobs=n_jobs, n_gpus=n_gpus, now=NOW)
    app = GpuqTop(ReplaySource(lab), interval=3600, clock=lambda: NOW)
    rng = random.Random(1)
    refresh_ms: list[float] = []
    refresh_cpu_ms: list[float] = []
    redraw_ms: list[float] = []
    redraw_cpu_ms: list[float] = []
    async with app.run_test(size=(200, 60)) as pilot:
        start = time.perf_counter()
        while app.table.row_count == 0:
            await pilot.pause(0.01)
        render_now(app)
        first_ms = (time.perf_counter() - start) * 1000
        for cycle in range(cycles):
            jobs = changed_jobs(list(app.model.jobs.values()), rng, burst)
            sample = lab.gpu_samples[cycle % len(lab.gpu_samples)]
            begin, begin_cpu = time.perf_counter(), time.thread_time()
            for job in jobs:
                app.on_job_changed(JobChanged(job))
            app.flush_jobs()
            app.on_gpus_sampled(GpusSampled(sample))
            app._tick()
            render_now(app)
            refresh_ms.append((time.perf_counter() - begin) * 1000)
            await pilot.pause()  # the table's deferred work (measuring new rows) runs here
            refresh_cpu_ms.append((time.thread_time() - begin_cpu) * 1000)
        for cycle in range(max(3, cycles // 10)):
            begin, begin_cpu = time.perf_counter(), time.thread_time()
            app.set_filter("" if cycle % 2 else "user:ana")
            render_now(app)
            redraw_ms.append((time.perf_counter() - begin) * 1000)
            await pilot.pause()
            redraw_cpu_ms.append((time.thread_time() - begin_cpu) * 1000)
        shown = app.table.row_count
        await pilot.press("q")
    return {
        "first_ms": first_ms,
        "refresh_ms": refresh_ms,
        "refresh_cpu_ms": refresh_cpu_ms,
        "redraw_ms": redraw_ms,
        "redraw_cpu_ms": redraw_cpu_ms,
        "rows": shown,
        "rss_mb": peak_rss_mb(),
    }


def main() -> None:
    """Print the medians and p95s against the targets, and the peak RSS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--burst", type=int, default=25, help="Jobs changed per refresh.")
    args = parser.parse_args()
    before = peak_rss_mb()
    result = asyncio.run(measure(args.jobs, args.gpus, args.cycles, args.burst))
    print(f"gpuq top, {args.jobs} jobs, {args.gpus} GPUs, 200x60 terminal, headless")
    print(f"  first snapshot shown: {result['first_ms']:.0f} ms")
    for label, kind in (
        (f"refresh ({args.burst} jobs changed + GPU sample)", "refresh"),
        (f"full redraw (filter change, up to {args.jobs} rows)", "redraw"),
    ):
        for clock in ("wall", "UI-thread CPU"):
            values = result[f"{kind}_ms" if clock == "wall" else f"{kind}_cpu_ms"]
            p95 = percentile(values, 0.95)
            print(
                f"  {label}, {clock}, {len(values)} runs: "
                f"median {statistics.median(values):.1f} ms, p95 {p95:.1f} ms "
                f"({p95 / TARGET_MS:.2f}x the {TARGET_MS:.0f} ms target)"
            )
    print(
        f"  peak RSS: {result['rss_mb']:.0f} MB ({before:.0f} MB before the app), "
        f"{result['rss_mb'] / TARGET_RSS_MB:.2f}x the {TARGET_RSS_MB:.0f} MB target"
    )


if __name__ == "__main__":
    main()
