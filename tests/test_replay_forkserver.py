"""The trace jobs' fork server and launcher (gpuq/replay/forkserver.py, launcher.py).

Real processes: a server that has imported torch, launchers started as the
daemon starts a job, real signals.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.replay.forkserver import ForkServer, launcher_command
from tests.daemon_harness import wait_for

pytestmark = [pytest.mark.torch]

NCF = ["--app", "ncf", "--batch-size", "32768", "--speedup", "1e4"]
LONG = ["--app", "cifar10", "--batch-size", "128", "--speedup", "1"]


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    with ForkServer() as running:
        yield running


def children(server: ForkServer) -> list[int]:
    """The processes the server has forked and not reaped."""
    assert server.process is not None
    pid = server.process.pid
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in text.split()]


def launch(server_path: Path | str, arguments: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        launcher_command(sys.executable, str(server_path), arguments),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def test_a_forked_trace_job_runs_to_the_end_and_its_output_is_the_launchers(
    server: ForkServer, tmp_path: Path
) -> None:
    job = launch(server.path, NCF, tmp_path)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    assert out.startswith("trace job ncf done: 76 simulated seconds")


def test_the_launcher_exits_with_the_jobs_status(server: ForkServer, tmp_path: Path) -> None:
    job = launch(server.path, [*NCF, "--tick", "0"], tmp_path)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 2  # argparse's, from the forked job
    assert "must be positive" in err


def test_a_signal_to_the_launcher_reaches_the_job(server: ForkServer, tmp_path: Path) -> None:
    job = launch(server.path, LONG, tmp_path)
    wait_for(lambda: children(server), 60, 0.05, "the job to be forked")
    job.send_signal(signal.SIGTERM)  # outside gpuq the job keeps SIGTERM's default: it dies
    job.communicate(timeout=60)
    assert job.returncode == 128 + signal.SIGTERM
    wait_for(lambda: not children(server), 60, 0.05, "the job to be reaped")


def test_a_killed_launcher_takes_its_job_with_it(server: ForkServer, tmp_path: Path) -> None:
    job = launch(server.path, LONG, tmp_path)
    [child] = wait_for(lambda: children(server), 60, 0.05, "the job to be forked")
    job.kill()  # as the daemon kills a job's process group
    job.communicate(timeout=60)
    wait_for(lambda: not Path(f"/proc/{child}").exists(), 60, 0.05, f"job {child} to end")


def test_without_a_server_the_launcher_runs_the_job_itself(tmp_path: Path) -> None:
    job = launch(tmp_path / "no.sock", NCF, tmp_path)
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    assert out.startswith("trace job ncf done: 76 simulated seconds")


def test_a_stopped_server_lets_its_jobs_finish_and_then_exits(tmp_path: Path) -> None:
    with ForkServer() as stopping:
        job = launch(stopping.path, [*LONG[:-1], "2000"], tmp_path)  # a few seconds
        wait_for(lambda: children(stopping), 60, 0.05, "the job to be forked")
    assert not stopping.path.exists()  # new launchers run their jobs themselves
    out, err = job.communicate(timeout=120)
    assert job.returncode == 0, err
    assert out.startswith("trace job cifar10 done")
    assert stopping.wait(60) == 0
