"""One queue over three servers: forty mixed jobs, and the same commands for every job.

The multi-server acceptance test: a head and two other servers in network
namespaces (tests/cluster_harness.py `three_servers`: 2, 3 and 4 fake
GPUs), single-GPU, 4-GPU, 2-server and CPU-only jobs submitted at the head
through the real CLI. Root only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster_harness import Lab3, three_servers
from tests.daemon_harness import submit_cli, wait_for

REPORT = 'echo "ran on $GPUQ_NODE"; sleep {sleep}; exit {code}'
"""Each job says where it ran, works a little, and exits with the code it was given."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab3]:
    with three_servers(tmp_path_factory.mktemp("mixed")) as servers:
        yield servers


def _mix() -> list[tuple[list[str], int]]:
    """(submit options, exit code) of the forty jobs: 20 x 1 GPU, 6 x 4, 6 x 2 servers, 8 CPU."""
    kinds = [["--gpus", "1"]] * 20 + [["--gpus", "4"]] * 6
    kinds += [["--nodes", "2", "--gpus", "2"]] * 6 + [["--gpus", "0"]] * 8
    return [(options, index % 4) for index, options in enumerate(kinds)]


def test_forty_mixed_jobs_all_finish_with_their_exit_codes_spread_over_the_servers(
    lab: Lab3,
) -> None:
    submitted: dict[int, tuple[list[str], int]] = {}
    for index, (options, code) in enumerate(_mix()):
        command = REPORT.format(sleep=0.2 + (index % 5) / 10, code=code)
        job_id = submit_cli(lab.head, *options, "--", "sh", "-c", command)
        submitted[job_id] = (options, code)

    def ended() -> list[dict[str, object]] | None:
        listing = json.loads(lab.head.cli("ls", "--all", "--json").stdout)["jobs"]
        mine = [job for job in listing if job["id"] in submitted]
        done = all(job["state"] in ("succeeded", "failed") for job in mine)
        return mine if done and len(mine) == len(submitted) else None

    jobs = wait_for(ended, timeout=300, interval=0.5, what="all forty jobs ended")
    used: dict[str, set[str]] = {}
    for job in jobs:
        options, code = submitted[int(job["id"])]
        assert job["exit_code"] == code, job
        assert job["state"] == ("succeeded" if code == 0 else "failed"), job
        kind = " ".join(options)
        nodes = str(job["node"]).split(",")
        used.setdefault(kind, set()).update(nodes)
        if kind == "--nodes 2 --gpus 2":
            assert len(set(nodes)) == 2, job
        output = Path(str(job["stdout"])).read_text() if nodes[0] == "head" else None
        if output is not None:
            assert output == f"ran on {nodes[0]}\n"
    assert used["--gpus 4"] == {"gpu3"}  # the only server with four GPUs
    assert len(used["--gpus 1"]) >= 2  # twenty short jobs overflow any one server
    assert len(used["--nodes 2 --gpus 2"]) >= 2
    assert used["--gpus 0"] == {"head"}


@pytest.mark.parametrize("where", ["head", "gpu2", "gpu3"])
def test_the_job_commands_behave_the_same_wherever_the_job_runs(lab: Lab3, where: str) -> None:
    beat = 'i=0; while true; do i=$((i+1)); echo "beat $i on $GPUQ_NODE"; sleep 0.1; done'
    job_id = submit_cli(lab.head, "--node", where, "--", "sh", "-c", beat)
    lab.head.wait_state(job_id, "running", timeout=30)

    listed = json.loads(lab.head.cli("ls", "--json").stdout)["jobs"]
    assert [job["node"] for job in listed if job["id"] == job_id] == [where]
    shown = json.loads(lab.head.cli("show", str(job_id), "--json").stdout)
    assert shown["job"]["state"] == "running" and shown["job"]["node"] == where

    def logged() -> str:
        result = lab.head.cli("logs", str(job_id))
        assert result.returncode == 0, result.stderr
        return result.stdout if "beat 3" in result.stdout else ""

    assert wait_for(logged, timeout=30).startswith(f"beat 1 on {where}\nbeat 2 on {where}\n")

    suspended = lab.head.cli("suspend", str(job_id))
    assert suspended.returncode == 0, suspended.stderr
    lab.head.wait_state(job_id, "suspended", timeout=30)
    time.sleep(0.5)
    before = lab.head.cli("logs", str(job_id)).stdout
    time.sleep(1.0)
    assert lab.head.cli("logs", str(job_id)).stdout == before  # stopped: no new beats

    resumed = lab.head.cli("resume", str(job_id))
    assert resumed.returncode == 0, resumed.stderr
    lab.head.wait_state(job_id, "running", timeout=30)
    wait_for(lambda: len(lab.head.cli("logs", str(job_id)).stdout) > len(before), timeout=30)

    cancelled = lab.head.cli("cancel", str(job_id))
    assert cancelled.returncode == 0, cancelled.stderr
    job = lab.head.wait_state(job_id, "cancelled", timeout=60)
    assert job["reason"] == "cancelled by user" and job["node"] == where
    again = lab.head.cli("cancel", str(job_id))
    assert again.returncode != 0 and "cancelled" in again.stderr
