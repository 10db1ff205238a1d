"""Output that cannot be written is a gpuq error, not a traceback.

`gpuq ls > /dev/full` (stdout on a full disk) says what failed, with a hint,
on stderr, exit status 1; the JSON error object with --json. A submission
whose id cannot be written names the job it queued, so it is not lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon

FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not FULL.exists(), reason="needs /dev/full")


def to_full(daemon: DaemonHarness, *args: str) -> subprocess.CompletedProcess[str]:
    """The real `gpuq ARGS` against `daemon`, its stdout on a device that is always full."""
    with FULL.open("w") as full:
        return subprocess.run(
            [sys.executable, "-m", "gpuq.cli.entry", *args],
            env=daemon.env,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
            cwd=daemon.root,
        )


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHarness]:
    with running_daemon(tmp_path_factory.mktemp("full")) as harness:
        yield harness


ERROR = (
    "gpuq: error: cannot write the output: No space left on device\n"
    "hint: free space where stdout goes, or send it elsewhere\n"
)


@pytest.mark.parametrize("args", [["ls"], ["gpus"], ["--help"], ["-V"], ["submit", "--help"]])
def test_a_command_whose_output_cannot_be_written_says_so(
    daemon: DaemonHarness, args: list[str]
) -> None:
    result = to_full(daemon, *args)
    assert (result.returncode, result.stderr) == (1, ERROR)


def test_with_json_the_error_is_the_json_error_object(daemon: DaemonHarness) -> None:
    result = to_full(daemon, "ls", "--json")
    assert result.returncode == 1
    assert json.loads(result.stderr)["error"]["message"] == (
        "cannot write the output: No space left on device"
    )


def test_a_submission_whose_id_cannot_be_written_names_the_job_it_queued(
    daemon: DaemonHarness,
) -> None:
    result = to_full(daemon, "submit", "-q", "--hold", "--gpus", "0", "--", "true")
    assert result.returncode == 1
    first = result.stderr.splitlines()[0]
    assert first.startswith("gpuq: error: job ")
    assert first.endswith(" was queued, but its id could not be written: No space left on device")
    job_id = int(first.split()[3])
    assert daemon.job(job_id)["state"] == "held"
    assert "hint: gpuq ls shows it" in result.stderr
    assert "Traceback" not in result.stderr
