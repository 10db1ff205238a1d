"""The default policy, `gpuq`, moves and packs live, each action with its reason in `gpuq show`.

Moves: two fake GPUs of 16G, two gpuq.runner jobs (tests/control_job.py,
real PyTorch on the CPU) asking 4G each, one per GPU; a job that needs a
whole GPU arrives. gpuq moves the runner job of GPU 0 onto GPU 1 (its
checkpoint, then a restart on exactly GPU 1) rather than leave the whole
job waiting, the whole job starts on GPU 0 once it is free, and the moved
job ends bit for bit as a run never moved.

Packing: one fake GPU on which a job computing alone shows 30% utilization
and 8G, and two whole-GPU runner jobs (tests/pack_job.py) whose steps take
`share_slowdown` (2.8) times longer while both compute on it. The second
job waits behind the first, so the two take turns; measured alone, light,
and fitting together, they are packed; measured packed at 2.8 times slower
steps, 0.71 of what time-slicing gives, they are unpacked, take turns
again, and are never packed together again.
"""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Static

from gpuq.tui.app import GpuqTop
from gpuq.tui.detail import JobDetailScreen
from gpuq.tui.source import DaemonSource
from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.test_control_runner import job_env, same_state
from tests.test_live_moves import (
    ENDED,
    TWO_GPUS,
    gpu,
    one_share_job_per_gpu,
    reasons,
    reference,
)
from tests.test_live_packing import first, pack_job
from tests.test_live_timeslice import wait_all
from tests.test_tui_app import SIZE, select, until

pytestmark = [pytest.mark.torch]

MOVES = '[scheduler]\npolicy = "gpuq:move_after=2"\ninterval = 0.5\n'
PACKS = '[scheduler]\npolicy = "gpuq:quantum=2"\ninterval = 0.5\n'
ONE_LIGHT_GPU = (
    '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 1\n'
    'utilization = 30\nshare_slowdown = 2.8\njob_memory = "8G"\n'
)


def history_in_top(daemon: DaemonHarness, job_id: int) -> str:
    """The history `gpuq top` shows in a finished job's detail view, as plain text."""
    shown: list[str] = []

    async def main() -> None:
        app = GpuqTop(DaemonSource(daemon.config), interval=0.2, reconnect_delays=(0.1, 0.3))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.connected, "the first snapshot")
            await pilot.press("a")  # finished jobs too
            await select(pilot, app, job_id)
            await pilot.press("enter")
            screen = await until(
                pilot, lambda: isinstance(app.screen, JobDetailScreen) and app.screen, "the detail"
            )
            await until(pilot, lambda: screen.job is not None and screen.events, "the history")
            console = Console(width=1000, file=io.StringIO(), record=True)  # no wrapping
            console.print(screen.query_one("#history", Static).content)
            shown.append(console.export_text())
            await pilot.press("escape", "q")

    asyncio.run(main())
    return shown[0]


def test_gpuq_moves_a_share_job_so_a_whole_gpu_job_gets_a_gpu_and_says_why(
    tmp_path: Path,
) -> None:
    with (
        reference(tmp_path) as plain,
        running_daemon(tmp_path / "d", gpus_toml=TWO_GPUS, extra_toml=MOVES) as daemon,
    ):
        assert daemon.call("status")["policy"] == "gpuq"
        first_job, second = one_share_job_per_gpu(daemon, tmp_path)
        whole = daemon.submit(["sleep", "1"], gpus=1, name="whole")
        moved = f"moved to GPU 1: frees GPU 0 for job {whole}"
        wait_for(
            lambda: f"{moved} (checkpoint requested)" in reasons(daemon, first_job),
            timeout=120,
            what="the first job's move",
        )
        for job_id in (whole, first_job, second):
            assert daemon.wait_state(job_id, *ENDED, timeout=180)["state"] == "succeeded"
        assert plain.wait(timeout=180) == 0

        log = reasons(daemon, first_job)
        assert f"starting on {gpu(daemon, 1)} ({moved})" in log, log
        assert daemon.job(first_job)["attempts"] == 2
        assert daemon.job(second)["attempts"] == 1
        started = next(r for r in reasons(daemon, whole) if r.startswith("starting on"))
        assert started == f"starting on {gpu(daemon, 0)}: next in the queue at priority 0"
        shown = daemon.cli("show", str(first_job))
        assert moved in shown.stdout, shown.stdout
        top = history_in_top(daemon, first_job)
        assert f"{moved} (checkpoint requested)" in top and f"({moved})" in top, top
    same_state(tmp_path / "reference.pt", tmp_path / "first.pt")


def test_gpuq_packs_two_light_jobs_and_unpacks_them_when_their_steps_say_it_does_not_pay(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path, gpus_toml=ONE_LIGHT_GPU, extra_toml=PACKS) as daemon:
        ids = [daemon.submit(pack_job(150), gpus=1, env=job_env()) for _ in "ab"]
        packed = first(daemon, ids, r"packed with job (\d+): trial on \S+ \(utilization", 180)
        unpacked = first(
            daemon, ids, r"unpacked from job \d+: packed throughput (\d\.\d+) of time-sliced", 180
        )
        assert float(unpacked.group(1)) < 1.0, "2.8x slower steps: 2/2.8 of time-slicing"
        jobs = wait_all(daemon, ids, timeout=300)
        assert [job["state"] for job in jobs] == ["succeeded"] * 2
        assert int(packed.group(1)) in ids
        for job_id in ids:
            log = reasons(daemon, job_id)
            trial = next(
                i for i, r in enumerate(log) if re.search(r"packed with job \d+: trial", r)
            )
            assert any("quantum ended" in r or "its turn" in r for r in log[:trial]), (
                "measured alone, in its turns, before the trial"
            )
            undone = next(i for i, r in enumerate(log) if "unpacked from job" in r)
            assert undone > trial
            assert not any(re.search(r"packed with job \d+: trial", r) for r in log[undone:]), (
                "a failed pair is never packed again"
            )
        for job_id in ids:
            for shown in (daemon.cli("show", str(job_id)).stdout, history_in_top(daemon, job_id)):
                assert re.search(r"packed with job \d+: trial on", shown), shown
                assert re.search(r"unpacked from job \d+: packed throughput 0\.\d+", shown), shown
