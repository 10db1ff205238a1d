"""The head SIGKILLed mid-placement and mid-migration: after a restart, every job accounted for.

A head and gpu2 in network namespaces (tests/cluster_harness.py). The head
runs with `GPUQ_CRASH_POINT` (`gpuq.daemon.faults.CLUSTER_POINTS`, and the
start every job passes) and kills itself there; started again without it,
it must finish each job exactly once, with its true outcome: a start on
gpu2 that never reached gpu2 is queued again, one that did is adopted, and
a migration cut anywhere restarts from the job's checkpoint. Root only.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.daemon.faults import CLUSTER_POINTS
from tests.cluster_harness import Cluster, head_and_gpu2
from tests.daemon_harness import wait_for

JOB = Path(__file__).resolve().parent / "control_job.py"

pytestmark = [pytest.mark.torch]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Cluster]:
    with head_and_gpu2(tmp_path) as cluster:
        yield cluster


def restart_with_crash(lab: Cluster, point: str) -> None:
    lab.head.stop()
    lab.start_head({"GPUQ_CRASH_POINT": point})
    wait_for(lambda: len(lab.remote_gpus()) == 3, what="gpu2's GPUs at the head")


def crashed_and_restarted(lab: Cluster) -> None:
    process = lab.head.process
    assert process is not None
    assert process.wait(timeout=90) == -9  # it killed itself at the point
    lab.start_head()


@pytest.mark.parametrize("point", ["starting-committed", CLUSTER_POINTS[0]])
def test_a_start_on_gpu2_cut_by_a_crash_ends_once_with_its_true_outcome(
    lab: Cluster, point: str
) -> None:
    restart_with_crash(lab, point)
    job_id = lab.head.submit(["sh", "-c", "sleep 1; exit 4"], gpus=3)
    crashed_and_restarted(lab)
    job = lab.head.wait_state(job_id, "failed", timeout=60)
    assert job["exit_code"] == 4 and job["node"] == "gpu2"
    assert job["attempts"] == 1  # a start that never reached gpu2 is not an attempt


@pytest.mark.parametrize("point", CLUSTER_POINTS[1:])
def test_a_migration_cut_by_a_crash_still_resumes_from_the_checkpoint(
    lab: Cluster, point: str, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    restart_with_crash(lab, point)
    job_id = lab.head.submit(
        [sys.executable, str(JOB), "--step-delay", "0.05", "--gate", f"2={gate}"],
        gpus=1,
        env={**environ, "OMP_NUM_THREADS": "1"},
    )
    wait_for(lambda: lab.head.call("show", id=job_id)["metrics"], timeout=60, what="metrics")
    here = lab.head.job(job_id)["node"]
    other = "gpu2" if here == "head" else "head"
    assert lab.head.cli("migrate", str(job_id), "--to", other).returncode == 0
    crashed_and_restarted(lab)

    job = lab.head.wait_state(job_id, "running", timeout=90)
    gate.touch()
    done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=120)
    output = lab.head.cli("logs", str(job_id)).stdout
    assert done["state"] == "succeeded", output
    assert "resumed from step" in output
    assert job["attempts"] == 2  # the cut start was not counted
