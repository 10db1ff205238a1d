"""Migration between servers: checkpoint at a step boundary, copy, check, resume there.

A head and gpu2 in network namespaces (tests/cluster_harness.py). The job
is tests/control_job.py, deterministic: moved from one server to the other
and back, it ends with the same parameters, bit for bit, as a run never
moved. Its gate holds it at step 3 until the test lets it finish, so it
cannot run out of work before it has been moved. Root only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cluster_harness import Cluster, head_and_gpu2
from tests.daemon_harness import wait_for

JOB = Path(__file__).resolve().parent / "control_job.py"

pytestmark = [pytest.mark.torch]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Cluster]:
    with head_and_gpu2(tmp_path) as cluster:
        yield cluster


def job_env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return {**environ, "OMP_NUM_THREADS": "1"}


def reasons(lab: Cluster, job_id: int) -> list[str]:
    return [event["reason"] for event in lab.head.call("show", id=job_id)["events"]]


def migrate(lab: Cluster, job_id: int, to: str) -> dict[str, Any]:
    """`gpuq migrate --json`, then wait until the job runs there from its checkpoint."""
    attempts = lab.head.job(job_id)["attempts"]
    done = lab.head.cli("migrate", "--json", str(job_id), "--to", to)
    assert done.returncode == 0, done.stderr
    migration: dict[str, Any] = json.loads(done.stdout)["migration"]
    job = wait_for(
        lambda: (
            (job := lab.head.job(job_id))["state"] == "running"
            and job["attempts"] == attempts + 1
            and job
        ),
        timeout=90,
        what=f"job {job_id} to run on {to}",
    )
    wait_for(  # its runner is back: it could be moved again
        lambda: lab.head.call("metrics", id=job_id, since=job["start_time"])["samples"],
        timeout=60,
        what="a sample of the new attempt",
    )
    return migration


def test_a_job_moved_to_gpu2_and_back_ends_as_if_never_moved(lab: Cluster, tmp_path: Path) -> None:
    reference, moved, gate = tmp_path / "reference.pt", tmp_path / "moved.pt", tmp_path / "go"
    plain = subprocess.run(
        [sys.executable, str(JOB), "--out", str(reference)],
        env=job_env(),
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=120,
    )
    assert plain.returncode == 0
    job_id = lab.head.submit(
        [sys.executable, str(JOB), "--out", str(moved), "--gate", f"3={gate}"],
        gpus=1,
        env=job_env(),
    )
    wait_for(lambda: lab.head.call("show", id=job_id)["metrics"], timeout=60, what="metrics")
    first = lab.head.job(job_id)["node"]
    other = "gpu2" if first == "head" else "head"

    there = migrate(lab, job_id, other)
    assert there["from"] == first and there["to"] == other
    job = lab.head.job(job_id)
    assert job["node"] == other and job["gpu_uuids"] == there["gpus"]
    log = reasons(lab, job_id)
    assert f"migrating to {other}, as asked" in " ".join(log)
    assert any(r.startswith(f"checkpoint copied from {first} to {other}: ") for r in log)
    assert any(r.endswith(", verified") for r in log), "\n".join(log)

    shown = lab.head.cli("show", str(job_id)).stdout
    assert "  Migrations:\n" in shown and f" {first} -> {other}: drain " in shown
    [phases] = lab.head.call("show", id=job_id)["migrations"]
    assert all(phases[key] is not None for key in ("drain", "save", "copy", "start"))

    back = migrate(lab, job_id, first)
    assert back["from"] == other
    gate.touch()
    done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=120)
    output = lab.head.cli("logs", str(job_id)).stdout
    assert done["state"] == "succeeded", output
    assert done["node"] == first and done["attempts"] == 3
    # Its output followed it: the first stay's, then each restart's, in one log.
    assert output.count("resumed from step") == 2 and output.count("done at step") == 1, output
    a, b = torch.load(reference), torch.load(moved)
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key


def test_migrate_refuses_what_it_cannot_do(lab: Cluster) -> None:
    unknown = lab.head.cli("migrate", "1", "--to", "nowhere")
    assert unknown.returncode == 3  # no job 1 yet
    job_id = lab.head.submit(["sleep", "300"], gpus=1, env=job_env())
    lab.head.wait_state(job_id, "running", timeout=30)
    here = lab.head.job(job_id)["node"]
    other = "gpu2" if here == "head" else "head"

    unknown = lab.head.cli("migrate", str(job_id), "--to", "nowhere")
    assert unknown.returncode == 2
    assert "unknown node 'nowhere'" in unknown.stderr and "gpuq cluster add" in unknown.stderr
    same = lab.head.cli("migrate", str(job_id), "--to", here)
    assert same.returncode == 4 and f"already runs on {here}" in same.stderr
    no_runner = lab.head.cli("migrate", str(job_id), "--to", other)
    assert no_runner.returncode == 4
    assert "its gpuq.runner is not connected" in no_runner.stderr
