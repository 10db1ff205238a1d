"""The daemon runs a real job on a fake GPU and records its true exit code."""

from __future__ import annotations

from tests.daemon_harness import DaemonHarness


def test_a_job_runs_and_its_exit_code_is_recorded(daemon: DaemonHarness) -> None:
    job_id = daemon.submit(["sh", "-c", "echo hello from $GPUQ_JOB_ID; exit 3"])
    job = daemon.wait_state(job_id, "failed")
    assert job["exit_code"] == 3
    assert job["gpu_uuids"] and job["gpu_uuids"][0].startswith("GPU-")
    out = daemon.cli("logs", str(job_id))
    assert out.stdout == f"hello from {job_id}\n"
