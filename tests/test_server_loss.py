"""A server lost while it runs four runner jobs: they finish elsewhere, from their checkpoints.

The multi-server acceptance test for a lost server: a head and two other
servers in network namespaces (tests/cluster_harness.py `three_servers`:
2, 3 and 4 fake GPUs; a server silent 5 s is down), the head asking for a
safety checkpoint every 2 s (`cluster.checkpoint_every`). Four
tests/steady_job.py jobs run on gpu3 while the head and gpu2 are full;
each saves checkpoints that the head copies to itself. Then gpu3's link
goes down: the jobs are requeued within the timeout and a heartbeat, run
on the head and gpu2 once their GPUs free up, and resume from the copies.
When the link comes back, the attempts left running on gpu3 are stopped;
every job then finishes once, and its event log tells the story. A runner
job with nothing to save refuses the first safety checkpoint and is not
asked again. Root only.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon import jobfiles
from tests.cluster_harness import Lab3, three_servers
from tests.daemon_harness import submit_cli, wait_for
from tests.test_remote_jobs import stopped

JOB = Path(__file__).resolve().parent / "steady_job.py"

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab3]:
    with three_servers(tmp_path_factory.mktemp("lab"), 'checkpoint_every = "2s"') as servers:
        yield servers


def reasons(lab: Lab3, job_id: int) -> list[str]:
    return [event["reason"] for event in lab.head.call("show", id=job_id)["events"]]


def has_safety_copy(lab: Lab3, job_id: int) -> bool:
    return any(" copied here from gpu3 " in reason for reason in reasons(lab, job_id))


STATELESS = (
    "import time, gpuq.runner as gq\ngq.init()\nwhile True:\n    gq.step()\n    time.sleep(0.05)\n"
)
"""A runner job with no `gpuq.runner.State`: it has nothing to save."""


def test_a_job_with_nothing_to_save_is_asked_once_and_said_so(lab: Lab3) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    job_id = lab.head.submit(
        [sys.executable, "-c", STATELESS], gpus=1, nodes=["gpu2"], env=environ, name="stateless"
    )
    lab.head.wait_state(job_id, "running", timeout=60)
    refusal = "it refused a safety checkpoint (the script has no gpuq.runner.State)"

    def refusals() -> list[str]:
        return [r for r in reasons(lab, job_id) if r.startswith(refusal)]

    [said] = wait_for(refusals, timeout=60, what="the refusal")
    assert said.endswith("no copy is kept here, and if gpu2 is lost it starts over")
    time.sleep(3 * 2)  # three more periods: it is not asked again
    assert len(refusals()) == 1
    assert lab.head.cli("cancel", str(job_id)).returncode == 0
    lab.head.wait_state(job_id, "cancelled", timeout=30)


def test_jobs_of_a_lost_server_resume_elsewhere_from_their_copies_and_finish_once(
    lab: Lab3, tmp_path: Path
) -> None:
    fillers = [
        submit_cli(lab.head, "--node", "head", "--gpus", "2", "--", "sleep", "600"),
        submit_cli(lab.head, "--node", "gpu2", "--gpus", "3", "--", "sleep", "600"),
    ]
    for filler in fillers:
        lab.head.wait_state(filler, "running", timeout=30)
    gate = tmp_path / "go"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    jobs = [
        lab.head.submit(
            [sys.executable, str(JOB), "--gate", str(gate)],
            gpus=1,
            env={**environ, "OMP_NUM_THREADS": "1"},
            name=f"steady{index}",
        )
        for index in range(4)
    ]
    for job_id in jobs:
        assert lab.head.wait_state(job_id, "running", timeout=60)["node"] == "gpu3"
    for job_id in jobs:
        wait_for(partial(has_safety_copy, lab, job_id), timeout=120, what="a safety copy")
    gpu3_jobs = lab.daemons["gpu3"].state_dir / "hosted" / "head" / "jobs"
    children: list[dict[str, Any]] = [
        wait_for(partial(jobfiles.read_json, gpu3_jobs / str(job_id) / jobfiles.CHILD))
        for job_id in jobs
    ]

    lab.net.cut("gpu3")
    for job_id in jobs:
        lab.head.wait_state(job_id, "queued", timeout=30)
        [requeued] = [r for r in reasons(lab, job_id) if r.startswith("server gpu3 is down")]
        assert "requeued to run elsewhere, from its checkpoint at step " in requeued
    down = lab.head.call("status")["servers"][1]
    assert down["host"] == "gpu3" and down["state"] == "down"
    assert down["since"] - down["last_answer"] >= 5  # silent for `down_after` first

    for filler in fillers:
        assert lab.head.cli("cancel", str(filler)).returncode == 0
    placed = {}
    for job_id in jobs:
        job = lab.head.wait_state(job_id, "running", timeout=90)
        assert job["attempts"] == 2 and job["node"] in ("head", "gpu2"), job
        placed[job_id] = job["node"]
    assert set(placed.values()) == {"head", "gpu2"}  # two GPUs here, the others on gpu2

    lab.net.mend("gpu3")  # the attempts left there are superseded: gpu3's daemon stops them
    for child in children:
        pgid = int(child["pgid"])
        wait_for(partial(stopped, pgid), timeout=30, what=f"stale attempt {pgid} to stop")

    gate.touch()
    for job_id in jobs:
        done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=120)
        assert done["state"] == "succeeded" and done["attempts"] == 2, done
        output = lab.head.cli("logs", str(job_id)).stdout
        started = [line for line in output.splitlines() if line.startswith(("started", "resumed"))]
        assert started[-1].startswith("resumed from step ") and "on gpu3" not in started[-1]
        assert int(started[-1].split()[3]) > 0, output
        assert output.count("done at step") == 1, output
        story = reasons(lab, job_id)
        assert any(r.startswith("starting on gpu3") for r in story)
        assert any(" copied here from gpu3 " in r for r in story)
        assert any(r.startswith("server gpu3 is down") for r in story)
        node = placed[job_id]
        if node == "head":
            assert any("it resumes from its checkpoint at step" in r for r in story), story
        else:
            assert any(r.startswith("checkpoint copied from head to gpu2") for r in story), story
