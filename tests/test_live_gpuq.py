"""The default policy, `gpuq`, run live on fake GPUs: a lab's queue with goodput.

A daemon with no policy configured runs `gpuq` (decisions every second).
Memory-share jobs are packed on one GPU as fifo packs them; a job of higher
priority is served before older ones; every job that waits says why; an
adaptive gpuq.runner job (tests/control_job.py, real PyTorch on the CPU) is
grown through its checkpoint once its model says a second GPU pays, then
shrunk back for a job of higher priority. Every start, resize and wait has
its reason in the event log, as `gpuq show` prints it. With a one-second
quantum, three runner jobs of one priority on two GPUs take turns, never two
computing on one GPU, and end bit for bit as a run never interrupted.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.test_control_runner import JOB, job_env, same_state
from tests.test_live_timeslice import assert_one_job_computes_per_gpu, events, wait_all

EVERY_SECOND = "[scheduler]\ninterval = 1\n"
SLEEP = ["sleep", "300"]


def reasons(daemon: DaemonHarness, job_id: int) -> list[str]:
    """The job's event log, oldest first."""
    return [event["reason"] for event in daemon.call("show", id=job_id)["events"]]


def waits(daemon: DaemonHarness, job_id: int, reason: str) -> str:
    """Wait until the queued job gives a reason starting with `reason`; returns it."""
    found: str = wait_for(
        lambda: (
            (job := daemon.job(job_id))["state"] == "queued"
            and (job.get("reason") or "").startswith(reason)
            and job["reason"]
        ),
        timeout=30,
        what=f"job {job_id} to wait with {reason!r}",
    )
    return found


def test_the_default_policy_is_gpuq(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as daemon:
        assert daemon.call("status")["policy"] == "gpuq"


def test_shares_are_packed_a_higher_priority_job_goes_first_and_every_wait_says_why(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path, extra_toml=EVERY_SECOND) as daemon:
        small = [daemon.submit(SLEEP, gpus=1, gpu_mem=6 * 1024**3) for _ in range(2)]
        gpus = [daemon.wait_state(i, "running")["gpu_uuids"] for i in small]
        assert gpus[0] == gpus[1], "both shares packed on one GPU"
        assert reasons(daemon, small[0])[1] == f"starting on {gpus[0][0]}: a 6.0G memory share"
        whole = daemon.submit(SLEEP, gpus=1)
        other = daemon.wait_state(whole, "running")["gpu_uuids"]
        assert other != gpus[0]
        big = daemon.submit(SLEEP, gpus=1, gpu_mem=36 * 1024**3)
        assert waits(daemon, big, "waiting for 36.0G on a shared GPU (largest free ")
        older = daemon.submit(SLEEP, gpus=1)
        urgent = daemon.submit(SLEEP, gpus=1, priority=5)
        # The whole-GPU job has no runner: it is neither preempted nor time-sliced.
        assert waits(daemon, older, "waiting for 1 free GPU (0 free)")
        assert waits(daemon, urgent, "waiting for 1 free GPU (0 free)")

        daemon.call("cancel", ids=[whole])
        assert daemon.wait_state(urgent, "running")["gpu_uuids"] == other
        assert f"starting on {other[0]}: next in the queue at priority 5" in reasons(daemon, urgent)
        assert waits(daemon, older, "waiting for 1 free GPU (0 free)")
        shown = daemon.cli("show", str(urgent))
        assert shown.returncode == 0, shown.stderr
        assert "next in the queue at priority 5" in shown.stdout


@pytest.mark.torch
def test_an_adaptive_runner_job_grows_for_goodput_and_shrinks_for_priority(
    tmp_path: Path,
) -> None:
    with running_daemon(tmp_path, extra_toml=EVERY_SECOND) as daemon:
        command = [sys.executable, str(JOB), "--epochs", "60", "--step-delay", "0.05"]
        adaptive = daemon.submit(command, gpus=1, gpus_max=2, env=job_env())

        def grown() -> bool:
            job = daemon.job(adaptive)
            return job["state"] == "running" and len(job["gpu_uuids"]) == 2

        wait_for(grown, timeout=240, interval=0.5, what="the adaptive job to run on 2 GPUs")
        log = reasons(daemon, adaptive)
        resized = [r for r in log if r.startswith("resized 1 -> 2 GPUs: goodput +")]
        assert resized, log
        assert any("checkpoint saved" in r for r in log), log

        urgent = daemon.submit(SLEEP, gpus=1, priority=5)
        freed = waits(daemon, urgent, "waiting for job ")
        assert freed == f"waiting for job {adaptive} to checkpoint and free its GPUs"
        daemon.wait_state(urgent, "running", timeout=60)
        wait_for(
            lambda: (
                daemon.job(adaptive)["state"] == "running"
                and len(daemon.job(adaptive)["gpu_uuids"]) == 1
            ),
            timeout=60,
            what="the adaptive job to run again on the GPU left",
        )
        shrunk = f"resized 2 -> 1 GPUs: shrunk for job {urgent} (priority 5 over 0)"
        assert any(r.startswith(shrunk) for r in reasons(daemon, adaptive))
        shown = daemon.cli("show", str(adaptive))
        assert shrunk in shown.stdout and "goodput +" in shown.stdout
        daemon.call("cancel", ids=[adaptive, urgent])


@pytest.mark.torch
def test_jobs_waiting_behind_their_own_priority_take_turns_and_end_bit_for_bit(
    tmp_path: Path,
) -> None:
    args = ["--epochs", "3", "--step-delay", "0.02"]
    alone = tmp_path / "alone.pt"
    subprocess.run(
        [sys.executable, str(JOB), *args, "--out", str(alone)], check=True, env=job_env()
    )
    config = '[scheduler]\npolicy = "gpuq:quantum=1"\ninterval = 0.5\n'
    with running_daemon(tmp_path / "d", extra_toml=config) as daemon:
        outs = [tmp_path / f"job{i}.pt" for i in range(3)]
        ids = [
            daemon.submit(
                [sys.executable, str(JOB), *args, "--out", str(out)], gpus=1, env=job_env()
            )
            for out in outs
        ]
        jobs = wait_all(daemon, ids, timeout=240)
        assert [job["state"] for job in jobs] == ["succeeded"] * 3
        log = [e["reason"] for i in ids for e in events(daemon, i)]
        assert any("time-sliced: its turn (1 s quantum)" in r for r in log), log
        assert any("quantum ended" in r for r in log), log
        for out in outs:
            same_state(alone, out)
        assert_one_job_computes_per_gpu(daemon, ids)
