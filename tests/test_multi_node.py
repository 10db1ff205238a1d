"""Multi-node jobs (`--nodes N`): one part per server, started, stopped and ended together.

A restarted head adopts every part; a part whose server is lost ends the job.

Three servers in network namespaces (tests/cluster_harness.py
`three_servers`: head with 2 fake GPUs, gpu2 with 3, gpu3 with 4), every
daemon and so every part inside its own server's namespace. Root only.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster_harness import Lab3, three_servers
from tests.daemon_harness import submit_cli, wait_for

ALLREDUCE = Path(__file__).resolve().parent / "allreduce_job.py"

BEAT = 'while true; do echo x >> "beat-$GPUQ_JOB_ID-$NODE_RANK"; sleep 0.1; done'
"""A part that appends to a file of its own every tenth of a second until stopped."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab3]:
    with three_servers(tmp_path_factory.mktemp("multi")) as servers:
        yield servers


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _growing(path: Path, seconds: float = 1.0) -> bool:
    before = _size(path)
    time.sleep(seconds)
    return _size(path) > before


def test_a_two_server_pytorch_job_all_reduces_across_servers(lab: Lab3) -> None:
    job_id = submit_cli(
        lab.head,
        "--nodes", "2", "--gpus", "4", "-o", "allreduce-%j.log",
        "--env", "GLOO_SOCKET_IFNAME=eth0",
        "--", sys.executable, str(ALLREDUCE),
    )  # fmt: skip
    job = lab.head.wait_state(job_id, "succeeded", "failed", timeout=180)
    out = Path(job["stdout"])
    assert job["state"] == "succeeded", (out.read_text(), Path(f"{out}.part1").read_text())
    nodes = job["node"].split(",")
    assert len(nodes) == 2 and len(set(nodes)) == 2
    rank0, rank1 = out.read_text(), Path(f"{out}.part1").read_text()
    assert f"rank 0 of 2 on {nodes[0]}: sum 3" in rank0
    assert f"rank 1 of 2 on {nodes[1]}: sum 3" in rank1
    assert lab.head.cli("logs", str(job_id)).stdout == rank0
    assert lab.head.cli("logs", str(job_id), "--part", "1").stdout == rank1
    beyond = lab.head.cli("logs", str(job_id), "--part", "2")
    assert beyond.returncode == 2
    assert f"job {job_id} has 2 parts (0 to 1): there is no part 2" in beyond.stderr
    # Each part saw only its own server's two GPUs.
    by_node = {gpu["uuid"]: gpu["node"] for gpu in lab.head.call("gpus")["gpus"]}
    for text, node in ((rank0, nodes[0]), (rank1, nodes[1])):
        uuids = text.split("GPUs ")[1].split(",")[:2]
        assert [by_node[uuid.strip()] for uuid in uuids] == [node, node]


def test_one_part_failing_ends_the_whole_job_with_that_parts_reason(lab: Lab3) -> None:
    script = 'if [ "$NODE_RANK" = 1 ]; then sleep 1; exit 3; fi; exec sleep 300'
    job_id = submit_cli(lab.head, "--nodes", "2", "--gpus", "2", "--", "sh", "-c", script)
    job = lab.head.wait_state(job_id, "failed", timeout=60)
    part1 = job["node"].split(",")[1]
    assert job["exit_code"] == 3
    assert job["reason"] == f"part 1 on {part1}: exited with code 3"
    # The other part was stopped, not left running: the job ended well before its sleep.
    assert job["end_time"] - job["start_time"] < 300  # its sleep 300 was cut short


def test_cancel_suspend_and_resume_act_on_every_part(lab: Lab3) -> None:
    job_id = submit_cli(lab.head, "--nodes", "3", "--gpus", "3", "--", "sh", "-c", BEAT)
    lab.head.wait_state(job_id, "running", timeout=30)
    root = lab.head.root
    beats = [root / f"beat-{job_id}-{rank}" for rank in range(3)]
    wait_for(lambda: all(_size(beat) for beat in beats), timeout=30, what="every part beating")

    assert lab.head.cli("suspend", str(job_id)).returncode == 0
    lab.head.wait_state(job_id, "suspended", timeout=30)
    time.sleep(0.5)  # a beat already under way
    assert not any(_growing(beat) for beat in beats)

    assert lab.head.cli("resume", str(job_id)).returncode == 0
    lab.head.wait_state(job_id, "running", timeout=30)
    wait_for(lambda: all(_growing(beat, 0.5) for beat in beats), timeout=30, what="all resumed")

    assert lab.head.cli("cancel", str(job_id)).returncode == 0
    job = lab.head.wait_state(job_id, "cancelled", timeout=60)
    assert job["reason"] == "cancelled by user"
    time.sleep(0.5)
    assert not any(_growing(beat) for beat in beats)


def test_multi_node_requests_that_cannot_be_met_are_refused_at_submission(lab: Lab3) -> None:
    def refused(*args: str) -> str:
        result = lab.head.cli("submit", *args, "--", "true")
        assert result.returncode != 0
        return result.stderr

    too_many = lab.head.cli("submit", "--nodes", "4", "--", "true")
    assert too_many.returncode == 5  # `resources`: as more GPUs than there are
    assert "needs 4 servers; the known nodes are head, gpu2, gpu3" in too_many.stderr
    assert "--gpus 3 cannot be split evenly over --nodes 2" in refused("-N", "2", "-g", "3")
    assert "needs 4 GPU(s) on each of 2 servers" in refused("-N", "2", "-g", "8")
    assert "needs 3 GPU(s) on each of 3 servers" in refused("-N", "3", "-g", "9")
    assert "--nodes takes whole GPUs" in refused("--nodes", "2", "--gpu-mem", "1G")
    assert "a GPU range resizes" in refused("--nodes", "2", "--gpus", "2-4")


def test_a_multi_node_job_waits_for_a_part_on_each_server_and_says_so(lab: Lab3) -> None:
    blockers = [
        submit_cli(lab.head, "--node", node, "--gpus", str(count), "--", "sleep", "300")
        for node, count in (("gpu2", 2), ("gpu3", 3))
    ]
    for blocker in blockers:
        lab.head.wait_state(blocker, "running", timeout=30)
    job_id = submit_cli(lab.head, "--nodes", "2", "--gpus", "4", "--", "true")
    reason = wait_for(
        lambda: (
            "each of 2 servers" in (r := lab.head.call("show", id=job_id)["job"]["reason"]) and r
        ),
        timeout=30,
    )
    assert reason == "waiting for 2 free GPUs on each of 2 servers (free: head 2, gpu2 1, gpu3 1)"
    lab.head.cli("cancel", *map(str, blockers))
    assert lab.head.wait_state(job_id, "succeeded", timeout=60)["state"] == "succeeded"


def test_a_restarted_head_adopts_every_part_of_a_running_job(lab: Lab3) -> None:
    job_id = submit_cli(lab.head, "--nodes", "2", "--gpus", "2", "--", "sh", "-c", BEAT)
    lab.head.wait_state(job_id, "running", timeout=30)
    beats = [lab.head.root / f"beat-{job_id}-{rank}" for rank in range(2)]
    wait_for(lambda: all(_size(beat) for beat in beats), timeout=30, what="both parts beating")

    lab.head.kill()  # SIGKILL: the parts run on under their shims
    assert all(_growing(beat, 0.5) for beat in beats)
    with lab.net.inside("head"):
        lab.head.start()
    job = lab.head.wait_state(job_id, "running", timeout=60)
    assert job["attempts"] == 1  # adopted, not started again
    assert all(_growing(beat, 0.5) for beat in beats)
    assert lab.head.cli("cancel", str(job_id)).returncode == 0  # and it still acts on both
    lab.head.wait_state(job_id, "cancelled", timeout=60)
    time.sleep(0.5)
    assert not any(_growing(beat) for beat in beats)


def test_a_part_whose_server_is_lost_ends_the_job_and_stops_the_other_parts(lab: Lab3) -> None:
    job_id = submit_cli(
        lab.head, "--nodes", "2", "--gpus", "2", "--node", "gpu2,gpu3", "--", "sh", "-c", BEAT
    )
    lab.head.wait_state(job_id, "running", timeout=30)
    beats = [lab.head.root / f"beat-{job_id}-{rank}" for rank in range(2)]
    wait_for(lambda: all(_size(beat) for beat in beats), timeout=30, what="both parts beating")
    rank = lab.head.job(job_id)["node"].split(",").index("gpu3")

    lab.net.cut("gpu3")
    try:
        job = lab.head.wait_state(job_id, "lost", "failed", timeout=60)
        assert job["reason"].startswith(f"part {rank} on gpu3: server gpu3 is down"), job
        time.sleep(0.5)
        assert not _growing(beats[1 - rank])  # the part on gpu2 was stopped with it
    finally:
        lab.net.mend("gpu3")
    wait_for(lambda: len(lab.gpus_of("gpu3")) == 4, timeout=60, what="gpu3 back at the head")
    wait_for(lambda: not _growing(beats[rank], 0.5), timeout=30, what="gpu3's part stopped")
