"""A daemon with GPUs of two types: `--gpu-type` jobs on their type, adaptive jobs moved up.

Real daemon and jobs, fake GPUs: two "Fake L4" and two "Fake A100" on one
server, which the view splits into a node per type
(tests/test_gpu_type_placement.py for the rules). An adaptive trace job on
Sia's per-type tables starts on a T4 while the A100 is busy, and the
`gpuq` policy moves it to the A100 once that frees up, from its model on
the T4 and the types' prior speeds (tests/test_typed_view.py).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, submit_cli, wait_for

TWO_TYPES = (
    '[[gpus.fake]]\nname = "Fake L4"\nmemory = "24G"\ncount = 2\n'
    '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 2\n'
)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    with running_daemon(tmp_path, gpus_toml=TWO_TYPES) as harness:
        yield harness


def test_a_typed_job_runs_on_its_type_and_waits_for_it_while_others_are_free(
    daemon: DaemonHarness,
) -> None:
    gpus = json.loads(daemon.cli("gpus", "--json").stdout)["gpus"]
    types = {gpu["uuid"]: gpu["type"] for gpu in gpus}
    assert sorted(types.values()) == ["A100", "A100", "L4", "L4"]

    first = submit_cli(daemon, "--gpu-type", "a100", "--gpus", "2", "--", "sleep", "300")
    job = daemon.wait_state(first, "running", timeout=30)
    assert [types[uuid] for uuid in job["gpu_uuids"]] == ["A100", "A100"]
    assert "GPU type a100" in daemon.cli("show", str(first)).stdout

    second = submit_cli(daemon, "--gpu-type", "A100", "--", "true")
    time.sleep(1.5)  # several passes, with both L4s free all along
    assert daemon.job(second)["state"] == "queued"
    assert daemon.cli("cancel", str(first)).returncode == 0
    done = daemon.wait_state(second, "succeeded", timeout=30)
    assert [types[uuid] for uuid in done["gpu_uuids"]] == ["A100"]

    untyped = submit_cli(daemon, "--gpus", "2", "--", "true")
    assert daemon.wait_state(untyped, "succeeded", timeout=30)["state"] == "succeeded"


def test_a_type_that_cannot_be_had_is_refused_at_submission(daemon: DaemonHarness) -> None:
    wait_for(lambda: daemon.call("gpus")["gpus"], what="the GPUs sampled")

    def refused(*args: str, status: int = 2) -> str:
        result = daemon.cli("submit", *args, "--", "true")
        assert result.returncode == status, result.stderr
        return result.stderr

    # GPUs there are not: `resources` (5), as for --gpus 99; a bad option: `invalid` (2)
    assert "no GPU of type H100: the GPUs are A100 (" in refused("--gpu-type", "H100", status=5)
    three = refused("--gpu-type", "A100", "-g", "3", status=5)
    assert "needs 3 GPU(s) of type A100 on one server" in three
    assert "--gpu-type picks GPUs" in refused("--gpu-type", "A100", "--gpus", "0")
    assert "--gpu-type: invalid name '-x'" in refused("--gpu-type=-x")


T4_AND_A100 = (
    '[[gpus.fake]]\nname = "Fake T4"\nmemory = "16G"\ncount = 1\n'
    '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 1\n'
)
TRACE = [sys.executable, "-m", "gpuq.replay.tracejob", "--app", "cifar10", "--batch-size", "128"]
"""A trace job of cifar10 on Sia's tables: its speed is its GPU type's (`--tables sia`)."""


def test_an_adaptive_job_moves_to_the_faster_type_when_it_frees_up(tmp_path: Path) -> None:
    with running_daemon(tmp_path, gpus_toml=T4_AND_A100) as daemon:
        gpus = wait_for(lambda: daemon.call("gpus")["gpus"], what="the GPUs sampled")
        a100 = next(gpu["uuid"] for gpu in gpus if gpu["type"] == "A100")
        blocker = submit_cli(daemon, "--gpu-type", "A100", "--", "sleep", "600")
        daemon.wait_state(blocker, "running", timeout=30)
        argv = [*TRACE, "--speedup", "30", "--adaptive", "--tables", "sia"]
        trace = submit_cli(daemon, "--gpus", "1-2", "--", *argv)
        on_t4 = daemon.wait_state(trace, "running", timeout=60)
        assert on_t4["gpu_uuids"] != [a100]
        wait_for(
            lambda: (daemon.call("show", id=trace)["metrics"] or {}).get("perf_params"),
            timeout=120,
            what="the trace job's model on the T4",
        )
        assert daemon.cli("cancel", str(blocker)).returncode == 0
        moved = wait_for(
            lambda: (job := daemon.job(trace))["gpu_uuids"] == [a100] and job,
            timeout=120,
            what="the trace job on the A100",
        )
        assert moved["attempts"] == 2, "one move, through its checkpoint"
        done = daemon.wait_state(trace, "succeeded", "failed", timeout=300)
        reasons = [event["reason"] for event in daemon.call("show", id=trace)["events"]]
        assert done["state"] == "succeeded", "\n".join(reasons)
        assert any(r.startswith("moved to 1 GPU on ") and "A100" in r for r in reasons), reasons
        output = daemon.cli("logs", str(trace)).stdout
        assert "trace job cifar10 done" in output, output


def test_a_job_is_told_the_type_of_its_gpus(tmp_path: Path) -> None:
    with running_daemon(tmp_path, gpus_toml=T4_AND_A100) as daemon:
        wait_for(lambda: daemon.call("gpus")["gpus"], what="the GPUs sampled")
        typed = submit_cli(daemon, "--gpu-type", "A100", "--", "sh", "-c", "echo $GPUQ_GPU_TYPE")
        cpu = submit_cli(daemon, "--gpus", "0", "--", "sh", "-c", "echo x${GPUQ_GPU_TYPE}x")
        for job_id in (typed, cpu):
            daemon.wait_state(job_id, "succeeded", timeout=30)
        assert daemon.cli("logs", str(typed)).stdout == "A100\n"
        assert daemon.cli("logs", str(cpu)).stdout == "xx\n"
