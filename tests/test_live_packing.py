"""`gandiva` packs live: two light runner jobs share a fake GPU while their step times say it pays.

One fake GPU whose jobs show 30% utilization each, and two gpuq.runner
jobs (`tests/pack_job.py`) that emulate their GPU work on it: each step
takes `share_slowdown` times longer while both compute on the GPU at once.
Gandiva time-slices the two, measures each alone, packs them (both light,
both fit), measures them packed, and keeps or undoes the pack by comparing
the packed throughput with time-slicing's. A job that runs out of memory
once packed is requeued with more memory and never packed with that
partner again.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.test_control_runner import job_env
from tests.test_live_timeslice import events, wait_all

JOB = Path(__file__).parent / "pack_job.py"
GANDIVA = '[scheduler]\npolicy = "gandiva:quantum=2"\ninterval = 0.5\n'
G = 1024**3


def one_gpu(share_slowdown: float) -> str:
    """One fake 40G GPU on which a job computing alone shows 30% utilization."""
    return (
        '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 1\n'
        f"utilization = 30\nshare_slowdown = {share_slowdown}\n"
    )


def pack_job(steps: int, *extra: str) -> list[str]:
    return [sys.executable, str(JOB), "--steps", str(steps), "--device-seconds", "0.2", *extra]


def reasons(daemon: DaemonHarness, job_id: int) -> list[str]:
    return [event["reason"] for event in events(daemon, job_id)]


def first(daemon: DaemonHarness, ids: list[int], pattern: str, timeout: float) -> re.Match[str]:
    """The first event reason of any of the jobs matching `pattern`, waited for."""

    def found() -> re.Match[str] | None:
        for job_id in ids:
            for reason in reasons(daemon, job_id):
                if match := re.search(pattern, reason):
                    return match
        return None

    match: re.Match[str] = wait_for(
        found, timeout=timeout, interval=0.5, what=f"an event matching {pattern!r}"
    )
    return match


pytestmark = [pytest.mark.torch]


def test_a_pack_slower_than_time_slicing_is_undone_with_its_measured_ratio(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path, gpus_toml=one_gpu(2.8), extra_toml=GANDIVA) as daemon:
        ids = [daemon.submit(pack_job(150), gpus=1, gpu_mem=12 * G, env=job_env()) for _ in "ab"]
        packed = first(daemon, ids, r"packed with job (\d+): trial", timeout=120)
        unpacked = first(
            daemon, ids, r"unpacked from job \d+: packed throughput (\d\.\d+) of time-sliced", 120
        )
        ratio = float(unpacked.group(1))
        assert ratio < 1.0, "2.8x slower steps: packing gives 2/2.8 of time-slicing"
        jobs = wait_all(daemon, ids, timeout=300)
        assert [job["state"] for job in jobs] == ["succeeded"] * 2
        assert [job["attempts"] for job in jobs] == [1, 1] or all(
            job["attempts"] == 1 + _checkpoints(daemon, job["id"]) for job in jobs
        )
        history = {job_id: reasons(daemon, job_id) for job_id in ids}
        assert int(packed.group(1)) in ids
        for job_id in ids:  # each was measured alone (time-sliced) before the trial
            log = history[job_id]
            trial = next(
                i for i, r in enumerate(log) if re.search(r"packed with job \d+: trial", r)
            )
            assert any("quantum ended" in r or "its turn" in r for r in log[:trial]), log
            undone = next(i for i, r in enumerate(log) if "unpacked from job" in r)
            assert undone > trial
            assert not any(re.search(r"packed with job \d+: trial", r) for r in log[undone:]), (
                "a failed pair is never packed again"
            )


def _checkpoints(daemon: DaemonHarness, job_id: int) -> int:
    return sum("checkpoint saved" in reason for reason in reasons(daemon, job_id))


def test_a_job_out_of_memory_once_packed_is_requeued_and_never_packed_with_its_partner(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path, gpus_toml=one_gpu(1.2), extra_toml=GANDIVA) as daemon:
        light = daemon.submit(pack_job(150), gpus=1, gpu_mem=12 * G, env=job_env())
        greedy = daemon.submit(
            pack_job(150, "--memory", "30G"), gpus=1, gpu_mem=12 * G, env=job_env()
        )
        ids = [light, greedy]
        requeued = first(daemon, [greedy], r"ran out of GPU memory packed with job (\d+)", 180)
        assert int(requeued.group(1)) == light
        jobs: list[dict[str, Any]] = wait_all(daemon, ids, timeout=300)
        assert [job["state"] for job in jobs] == ["succeeded"] * 2
        log = reasons(daemon, greedy)
        oom = next(i for i, r in enumerate(log) if "ran out of GPU memory" in r)
        assert "requeued, not as a retry" in log[oom]
        raised = re.search(r"memory need raised (\S+) -> (\S+);", log[oom])
        assert raised is not None and raised.group(1) != raised.group(2), log[oom]
        assert f"never packed with job {light} again" in log[oom]
        assert sum(re.search(r"packed with job \d+: trial", r) is not None for r in log) == 1, log
        assert any("quantum ended" in r for r in log[oom:]), "it took turns after the requeue"
        assert any(f"unpacked from job {greedy}" in r for r in reasons(daemon, light))


def outputs(daemon: DaemonHarness, job_id: int) -> str:
    return Path(daemon.job(job_id)["stdout"]).read_text()


@pytest.mark.parametrize(
    ("point", "share_slowdown"), [("pack-committed", 1.2), ("unpack-committed", 2.8)]
)
def test_a_daemon_killed_in_the_middle_of_a_pack_or_unpack_finishes_or_undoes_it(
    tmp_path: Path, point: str, share_slowdown: float
) -> None:
    """Killed between a pack's (or unpack's) intent and acting on it, the next daemon settles it.

    Both jobs end once each (one "done" line, attempts matching the
    checkpoints they restarted from), and the step cut off is finished or
    undone with a reason that says it happened after the restart.
    """
    harness = DaemonHarness(tmp_path, gpus_toml=one_gpu(share_slowdown), extra_toml=GANDIVA)
    try:
        killed = harness.start(extra_env={"GPUQ_CRASH_POINT": point})
        ids = [harness.submit(pack_job(150), gpus=1, gpu_mem=12 * G, env=job_env()) for _ in "ab"]
        assert killed.wait(timeout=240) == -9
        harness.start()
        jobs = wait_all(harness, ids, timeout=300)
        assert [job["state"] for job in jobs] == ["succeeded"] * 2
        for job in jobs:
            assert job["attempts"] == 1 + _checkpoints(harness, job["id"])
            assert outputs(harness, job["id"]).count("done at step 150") == 1
        history = [r for job_id in ids for r in reasons(harness, job_id)]
        assert any("re-adopted after daemon restart" in r for r in history)
        settled = [r for r in history if "after a daemon restart" in r and "pack" in r]
        assert settled, history
        if point == "pack-committed":
            assert re.search(
                r"packed with job \d+: trial.*\(finished after a daemon restart\)",
                ("\n".join(settled)),
            ) or any("not packed" in r or "before it joined" in r for r in settled), settled
        else:
            assert any(
                re.search(r"unpacked from job \d+: packed throughput 0\.\d+ of time-sliced", r)
                for r in settled
            ), settled
    finally:
        harness.close()
