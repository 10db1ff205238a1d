"""Placement constraints across real servers: a job goes only where `--node` lets it.

A head (two fake GPUs) and gpu2 (three) in network namespaces
(tests/cluster_harness.py). Root only.

- `--node gpu2` puts a one-GPU job on gpu2 though the head has free GPUs,
  and `--exclude-node gpu2` keeps one on the head;
- at submission a job is judged against its own servers' GPUs only;
- `gpuq migrate` refuses a server outside the job's constraint;
- a job for gpu2 waits, saying so, while gpu2 is down, and runs there once
  it is back.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster_harness import Cluster, head_and_gpu2
from tests.daemon_harness import submit_cli, wait_for


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Cluster]:
    with head_and_gpu2(tmp_path) as cluster:
        yield cluster


def test_a_job_runs_only_where_its_constraint_lets_it(lab: Cluster) -> None:
    there = submit_cli(lab.head, "--node", "gpu2", "--", "sh", "-c", "echo $GPUQ_NODE")
    here = submit_cli(lab.head, "--exclude-node", "gpu2", "--", "sh", "-c", "echo $GPUQ_NODE")
    assert lab.head.wait_state(there, "succeeded", timeout=30)["node"] == "gpu2"
    assert lab.head.wait_state(here, "succeeded", timeout=30)["node"] == "head"
    assert lab.head.cli("logs", str(there)).stdout.strip() == "gpu2"


def test_a_job_is_judged_against_its_own_servers_gpus(lab: Cluster) -> None:
    small = lab.head.cli("submit", "--node", "head", "--gpus", "3", "--", "true")
    assert small.returncode == 5, small.stderr
    assert "the job needs 3 GPUs; this server has 2" in small.stderr
    big = lab.head.cli("submit", "--node", "gpu2", "--gpus", "4", "--", "true")
    assert "the job needs 4 GPUs; gpu2 has 3" in big.stderr
    fits = submit_cli(lab.head, "--node", "gpu2", "--gpus", "3", "--", "true")
    assert lab.head.wait_state(fits, "succeeded", timeout=30)["node"] == "gpu2"


def test_migrate_refuses_a_server_outside_the_constraint(lab: Cluster) -> None:
    job_id = submit_cli(lab.head, "--node", "head", "--", "sleep", "300")
    lab.head.wait_state(job_id, "running", timeout=30)
    refused = lab.head.cli("migrate", str(job_id), "--to", "gpu2")
    assert refused.returncode == 2
    assert f"job {job_id} may not run on gpu2: it runs only on head" in refused.stderr


def test_a_job_for_a_server_that_is_down_waits_for_it(lab: Cluster) -> None:
    lab.net.cut("gpu2")
    wait_for(
        lambda: any(s["state"] == "down" for s in lab.head.call("status")["servers"]),
        timeout=60,
        what="gpu2 down",
    )
    job_id = submit_cli(lab.head, "--node", "gpu2", "--", "true")
    waiting = wait_for(
        lambda: (job := lab.head.job(job_id))["reason"].startswith("waiting for node gpu2") and job,
        what="the job to wait for gpu2",
    )
    assert waiting["state"] == "queued" and "down" in waiting["reason"]

    lab.net.mend("gpu2")
    assert lab.head.wait_state(job_id, "succeeded", timeout=60)["node"] == "gpu2"


def test_a_job_runs_only_where_its_working_directory_exists(tmp_path: Path) -> None:
    shared, private = tmp_path / "home", tmp_path / "local" / "work"
    with head_and_gpu2(tmp_path / "lab", hidden_on_gpu2=tmp_path / "local") as lab:
        shared.mkdir()
        private.mkdir(parents=True)  # on the head only: gpu2 sees an empty directory there
        here = lab.head.submit(["sh", "-c", "echo $GPUQ_NODE"], gpus=1, cwd=str(private))
        stuck = lab.head.submit(["true"], gpus=3, cwd=str(private))
        there = lab.head.submit(["true"], gpus=3, cwd=str(shared))

        assert lab.head.wait_state(here, "succeeded", timeout=30)["node"] == "head"
        assert lab.head.wait_state(there, "succeeded", timeout=30)["node"] == "gpu2"
        waiting = wait_for(
            lambda: "does not exist" in (job := lab.head.job(stuck))["reason"] and job,
            what="the job's reason",
        )
        assert waiting["state"] == "queued"
        assert waiting["reason"].endswith(
            f"(its working directory {private} does not exist on gpu2)"
        )
