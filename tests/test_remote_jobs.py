"""Jobs on another server: placed by the head, run by that server's daemon, seen at the head.

A head and gpu2 in network namespaces (tests/cluster_harness.py): a 3-GPU
job can only run on gpu2. Root only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon import jobfiles
from tests.cluster_harness import Cluster, head_and_gpu2
from tests.daemon_harness import listed, submit_cli, wait_for

CONTROL_JOB = Path(__file__).resolve().parent / "control_job.py"
"""A small deterministic PyTorch loop with gpuq.runner (tests/test_control_runner.py)."""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Cluster]:
    with head_and_gpu2(tmp_path) as cluster:
        yield cluster


def test_the_head_shows_the_other_servers_gpus(lab: Cluster) -> None:
    gpus = lab.head.call("gpus")["gpus"]
    assert sorted(gpu["node"] for gpu in gpus) == ["gpu2", "gpu2", "gpu2", "head", "head"]
    assert {gpu["name"] for gpu in lab.remote_gpus()} == {"Fake L4"}


def test_a_job_too_big_for_the_head_runs_on_gpu2_with_its_exit_code_and_output(
    lab: Cluster,
) -> None:
    job_id = submit_cli(
        lab.head,
        "--gpus",
        "3",
        "--",
        "sh",
        "-c",
        'echo "on $GPUQ_NODE with $CUDA_VISIBLE_DEVICES"; echo oops >&2; exit 3',
    )
    job = lab.head.wait_state(job_id, "failed", timeout=30)
    assert job["exit_code"] == 3 and job["node"] == "gpu2"
    remote_uuids = {gpu["uuid"] for gpu in lab.remote_gpus()}
    assert set(job["gpu_uuids"]) == remote_uuids

    # gpu2's daemon ran it, in a directory of the head's own, and kept its output there.
    assert jobfiles.read_json(lab.hosted_dir(job_id) / jobfiles.EXIT) is not None
    assert not (lab.head.state_dir / "jobs" / str(job_id)).exists()
    assert job["stdout"].startswith(str(lab.gpu2.state_dir))

    out = lab.head.cli("logs", str(job_id))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"on gpu2 with {','.join(job['gpu_uuids'])}\n"
    err = lab.head.cli("logs", "--stderr", str(job_id))
    assert err.stdout == "oops\n"
    [row] = listed(lab.head, "--all")
    assert row["node"] == "gpu2" and row["state"] == "failed"


def test_logs_follow_a_remote_job_until_it_ends(lab: Cluster) -> None:
    job_id = submit_cli(
        lab.head, "--gpus", "3", "--", "sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.3; done"
    )
    followed = lab.head.cli("logs", "-f", str(job_id))
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == "1\n2\n3\n"
    assert lab.head.job(job_id)["state"] == "succeeded"


def test_logs_of_a_remote_job_keep_characters_whole_across_reads(lab: Cluster) -> None:
    # 100,000 three-byte characters: each node.read of 256 KiB ends inside one.
    bar = "\u2588"
    program = f"import sys; sys.stdout.write({bar!r} * 100_000 + '\\n')"
    job_id = submit_cli(lab.head, "--gpus", "3", "--", sys.executable, "-c", program)
    lab.head.wait_state(job_id, "succeeded", timeout=60)
    out = lab.head.cli("logs", str(job_id))
    assert out.returncode == 0, out.stderr
    assert out.stdout == bar * 100_000 + "\n"
    assert lab.head.cli("logs", "-f", str(job_id)).stdout == out.stdout


def test_a_remote_job_is_cancelled_there(lab: Cluster) -> None:
    job_id = submit_cli(lab.head, "--gpus", "3", "--", "sleep", "300")
    lab.head.wait_state(job_id, "running", timeout=30)
    child = wait_for(
        lambda: jobfiles.read_json(lab.hosted_dir(job_id) / jobfiles.CHILD), what="child record"
    )
    assert lab.head.cli("cancel", str(job_id)).returncode == 0
    job = lab.head.wait_state(job_id, "cancelled", timeout=30)
    assert job["node"] == "gpu2"
    with pytest.raises(ProcessLookupError):
        os.killpg(int(child["pgid"]), 0)


def test_a_remote_job_is_suspended_and_resumed_there(lab: Cluster) -> None:
    job_id = submit_cli(lab.head, "--gpus", "3", "--", "sh", "-c", "sleep 2; exit 5")
    lab.head.wait_state(job_id, "running", timeout=30)
    child = wait_for(
        lambda: jobfiles.read_json(lab.hosted_dir(job_id) / jobfiles.CHILD), what="child record"
    )
    suspended = lab.head.cli("suspend", str(job_id))
    assert suspended.returncode == 0, suspended.stderr
    lab.head.wait_state(job_id, "suspended", timeout=30)
    wait_for(lambda: _state_of(int(child["pid"])) == "T", what="the job to stop on gpu2")

    resumed = lab.head.cli("resume", str(job_id))
    assert resumed.returncode == 0, resumed.stderr
    job = lab.head.wait_state(job_id, "failed", timeout=30)
    assert job["exit_code"] == 5 and job["node"] == "gpu2"


def test_a_runner_on_gpu2_reports_to_the_head_and_checkpoints_there(lab: Cluster) -> None:
    job_id = lab.head.submit(
        [sys.executable, str(CONTROL_JOB), "--step-delay", "0.05"],
        gpus=3,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    sample = wait_for(
        lambda: lab.head.call("show", id=job_id)["metrics"], timeout=60, what="relayed metrics"
    )
    assert sample["step"] >= 1 and lab.head.job(job_id)["node"] == "gpu2"

    suspended = lab.head.cli("suspend", str(job_id))
    assert suspended.stdout == f"job {job_id}: suspending\n", suspended.stderr
    job = lab.head.wait_state(job_id, "suspended", timeout=60)
    assert job["exit_code"] == 75 and job["gpu_uuids"] == []
    assert job["reason"].startswith("suspended (checkpoint mode) at step ")
    assert list((lab.hosted_dir(job_id) / "checkpoints").glob("ckpt-*.pt"))

    assert lab.head.cli("resume", str(job_id)).returncode == 0
    done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=120)
    out = lab.head.cli("logs", str(job_id)).stdout
    assert done["state"] == "succeeded", out
    assert done["node"] == "gpu2" and "resumed from step" in out


def test_a_runner_job_of_a_lost_server_is_requeued_and_runs_once_at_a_time(
    lab: Cluster, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    job_id = lab.head.submit(
        [sys.executable, str(CONTROL_JOB), "--step-delay", "0.05", "--gate", f"2={gate}"],
        gpus=3,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    wait_for(lambda: lab.head.call("show", id=job_id)["metrics"], timeout=60, what="metrics")
    child = jobfiles.read_json(lab.hosted_dir(job_id) / jobfiles.CHILD)
    assert child is not None

    lab.net.cut("gpu2")
    lab.head.wait_state(job_id, "queued", timeout=30)
    requeued = lab.head.call("show", id=job_id)["events"][-1]["reason"]
    assert requeued.startswith("server gpu2 is down (")
    assert requeued.endswith(": requeued to run elsewhere")

    lab.net.mend("gpu2")  # only gpu2 fits it: the old attempt is stopped, a new one starts
    wait_for(lambda: not _alive(int(child["pgid"])), timeout=30, what="the stale attempt to stop")
    job = lab.head.wait_state(job_id, "running", timeout=60)
    assert job["attempts"] == 2 and job["node"] == "gpu2"
    gate.touch()
    assert lab.head.wait_state(job_id, "succeeded", "failed", timeout=120)["state"] == "succeeded"


def test_a_hung_server_is_down_with_why_and_the_head_schedules_on(lab: Cluster) -> None:
    gpu2 = lab.gpu2.process
    assert gpu2 is not None
    os.kill(gpu2.pid, signal.SIGSTOP)  # its daemon hangs: ssh connects, nothing answers
    try:
        down = wait_for(
            lambda: (s := lab.head.call("status")["servers"][0])["state"] == "down" and s,
            timeout=30,
            what="gpu2 down",
        )
        assert "did not answer within" in down["reason"]
        local = submit_cli(lab.head, "--gpus", "1", "--", "true")
        assert lab.head.wait_state(local, "succeeded", timeout=30)["node"] == "head"
    finally:
        os.kill(gpu2.pid, signal.SIGCONT)
    wait_for(lambda: lab.head.call("status")["servers"][0]["state"] == "up", what="gpu2 up")


def _state_of(pid: int) -> str:
    """The process's state letter (T: stopped), from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def test_gpu2_does_not_place_its_own_jobs_on_gpus_lent_to_the_head(lab: Cluster) -> None:
    remote = submit_cli(lab.head, "--gpus", "3", "--", "sleep", "300")
    lab.head.wait_state(remote, "running", timeout=30)
    own = lab.gpu2.submit(["true"], gpus=1)
    waiting = wait_for(lambda: (job := lab.gpu2.job(own))["reason"] and job, what="a reason")
    assert waiting["state"] == "queued"  # every GPU of gpu2 is lent
    lab.head.cli("cancel", str(remote))
    lab.gpu2.wait_state(own, "succeeded", timeout=30)


def test_a_restarted_head_adopts_its_remote_jobs(lab: Cluster) -> None:
    job_id = submit_cli(lab.head, "--gpus", "3", "--", "sh", "-c", "sleep 3; exit 7")
    lab.head.wait_state(job_id, "running", timeout=30)
    lab.head.kill()
    lab.start_head()
    job = lab.head.wait_state(job_id, "failed", timeout=30)
    assert job["exit_code"] == 7  # the true outcome, from gpu2
    shown = json.loads(lab.head.cli("show", "--json", str(job_id)).stdout)
    reasons = [event["reason"] for event in shown["events"]]
    assert not any("lost" in reason for reason in reasons)


def test_a_server_cut_off_loses_its_jobs_and_stops_them_when_it_returns(lab: Cluster) -> None:
    lost = submit_cli(lab.head, "--node", "gpu2", "--", "sleep", "300")
    again = submit_cli(lab.head, "--node", "gpu2", "--requeue", "--", "sh", "-c", "sleep 300")
    for job_id in (lost, again):
        lab.head.wait_state(job_id, "running", timeout=30)
    children = [child_of(lab, job_id) for job_id in (lost, again)]
    lab.net.cut("gpu2")
    job = lab.head.wait_state(lost, "lost", timeout=30)
    assert job["reason"].startswith("server gpu2 is down")
    lab.head.wait_state(again, "queued", timeout=30)  # --requeue: it waits for a GPU of gpu2
    requeued = lab.head.call("show", id=again)["events"][-1]["reason"]
    assert requeued.startswith("server gpu2 is down") and requeued.endswith(
        "requeued to run elsewhere"
    )
    wait_for(lambda: lab.remote_gpus() == [], what="gpu2's GPUs to leave the head's view")

    lab.net.mend("gpu2")  # the attempts ran on: the head superseded them, so they are stopped
    for child in children:
        pgid = int(child["pgid"])
        wait_for(partial(stopped, pgid), timeout=30, what=f"stale attempt {pgid} to stop")
    job = lab.head.wait_state(again, "running", timeout=30)
    assert job["attempts"] == 2 and job["node"] == "gpu2"
    assert lab.head.job(lost)["state"] == "lost"


def child_of(lab: Cluster, job_id: int) -> dict[str, Any]:
    """The record of the job's command on gpu2, once its shim wrote it."""
    record: dict[str, Any] = wait_for(
        lambda: jobfiles.read_json(lab.hosted_dir(job_id) / jobfiles.CHILD), what="child record"
    )
    return record


def stopped(pgid: int) -> bool:
    """True once no process of the group is left."""
    return not _alive(pgid)


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
