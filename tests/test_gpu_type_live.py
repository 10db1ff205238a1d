"""A daemon with GPUs of two types places a `--gpu-type` job on its type only.

Real daemon and jobs, fake GPUs: two "Fake L4" and two "Fake A100" on one
server, which the view splits into a node per type
(tests/test_gpu_type_placement.py for the rules).
"""

from __future__ import annotations

import json
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

    def refused(*args: str) -> str:
        result = daemon.cli("submit", *args, "--", "true")
        assert result.returncode == 2, result.stderr
        return result.stderr

    assert "no GPU of type H100: the GPUs are A100 (" in refused("--gpu-type", "H100")
    assert "needs 3 GPU(s) of type A100 on one server" in refused("--gpu-type", "A100", "-g", "3")
    assert "--gpu-type picks GPUs" in refused("--gpu-type", "A100", "--gpus", "0")
    assert "--gpu-type: invalid name '-x'" in refused("--gpu-type=-x")
