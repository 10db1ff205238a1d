"""A migration's copy that fails replaces nothing, and the job still ends as if never moved.

A head and gpu2 in network namespaces (tests/cluster_harness.py); the job is
tests/big_state_job.py, whose checkpoint is 128 MiB. It starts on the head
(gpu2's GPUs are taken first) and is moved to gpu2 while:

- gpu2's disk is full where the checkpoint would land (a small tmpfs): the
  copy fails, the job waits with the reason, its checkpoint on the head is
  untouched, and it is placed again and resumes from it;
- the link to gpu2 is cut while rsync runs (its rate capped with tc so the
  copy lasts seconds): the copy fails, and the job resumes from its
  checkpoint where it is.

Root only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq import ckptfile
from tests.cluster_harness import Cluster, head_and_gpu2
from tests.daemon_harness import mounted_tmpfs, submit_cli, wait_for

JOB = Path(__file__).resolve().parent / "big_state_job.py"

pytestmark = [pytest.mark.torch]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Cluster]:
    with shared_mounts(tmp_path), head_and_gpu2(tmp_path) as cluster:
        yield cluster


@contextlib.contextmanager
def shared_mounts(root: Path) -> Iterator[None]:
    """Mounts made below `root` later reach every mount namespace made meanwhile.

    Each server's sshd runs in a mount namespace of its own (`ip netns exec`
    makes one), where rsync lands: a full disk made for gpu2's daemon must
    be full for it too.
    """
    if os.geteuid() != 0:
        pytest.skip("mounts need root")
    subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(root)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def start_on_head(lab: Cluster, gate: Path) -> int:
    """The big job, running on the head with its runner connected; gpu2 free again."""
    filler = submit_cli(lab.head, "--node", "gpu2", "--gpus", "3", "--", "sleep", "300")
    lab.head.wait_state(filler, "running", timeout=30)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    job_id = lab.head.submit(
        [sys.executable, str(JOB), "--gate", str(gate)],
        gpus=1,
        env={**environ, "OMP_NUM_THREADS": "1"},
    )
    wait_for(lambda: lab.head.call("show", id=job_id)["metrics"], timeout=90, what="metrics")
    assert lab.head.job(job_id)["node"] == "head"
    assert lab.head.cli("cancel", str(filler)).returncode == 0
    lab.head.wait_state(filler, "cancelled", timeout=30)
    return job_id


def copy_failure(lab: Cluster, job_id: int) -> str:
    """The event saying the copy failed (waited for)."""
    reason: str = wait_for(
        lambda: next(
            (
                e["reason"]
                for e in lab.head.call("show", id=job_id)["events"]
                if e["reason"].startswith("could not copy its checkpoint from head: ")
            ),
            None,
        ),
        timeout=90,
        what="the copy to fail",
    )
    return reason


def head_checkpoints(lab: Cluster, job_id: int) -> list[Path]:
    return sorted((lab.head.state_dir / "jobs" / str(job_id) / "checkpoints").glob("ckpt-*.pt"))


def test_a_full_disk_on_the_target_fails_the_copy_and_the_job_resumes_from_its_checkpoint(
    lab: Cluster, tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    job_id = start_on_head(lab, gate)
    landing = lab.hosted_dir(job_id)
    landing.parent.mkdir(parents=True, exist_ok=True)
    with mounted_tmpfs(landing, "size=1m"):
        assert lab.head.cli("migrate", str(job_id), "--to", "gpu2").returncode == 0
        failed = copy_failure(lab, job_id)
        assert "rsync failed" in failed and "No space left on device" in failed
        assert failed.endswith("; placed again in 30s")
        assert lab.head.job(job_id)["state"] == "queued"
        [kept] = head_checkpoints(lab, job_id)[-1:]
        assert ckptfile.verify(kept) is None  # the source is untouched
        assert not (landing / "checkpoints").exists()  # nothing half-copied took its place
    lab.head.wait_state(job_id, "running", timeout=90)  # placed again: here, or copied there
    gate.touch()
    done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=120)
    assert done["state"] == "succeeded"
    assert "resumed from step" in lab.head.cli("logs", str(job_id)).stdout


def test_a_link_cut_during_the_copy_leaves_the_job_to_resume_where_it_is(
    lab: Cluster, tmp_path: Path
) -> None:
    if shutil.which("tc") is None:
        pytest.skip("tc is not installed (Debian: iproute2)")
    gate = tmp_path / "go"
    job_id = start_on_head(lab, gate)
    head = lab.net.servers["head"]
    shaped = subprocess.run(
        ["tc", "-n", head.netns, "qdisc", "add", "dev", head.veth, "root"]
        + ["tbf", "rate", "200mbit", "burst", "256kb", "latency", "100ms"],
        capture_output=True,
        text=True,
        check=False,
    )
    if shaped.returncode != 0:
        pytest.skip(f"cannot cap the link's rate: {shaped.stderr.strip()}")
    assert lab.head.cli("migrate", str(job_id), "--to", "gpu2").returncode == 0
    incoming = lab.hosted_dir(job_id) / "checkpoints.incoming"
    wait_for(
        lambda: incoming.is_dir() and any(p.stat().st_size > 0 for p in incoming.iterdir()),
        timeout=60,
        interval=0.005,
        what="rsync to start writing",
    )
    lab.net.cut("gpu2")
    try:
        failed = copy_failure(lab, job_id)
        assert "rsync failed" in failed
    finally:
        lab.net.mend("gpu2")
    gate.touch()
    done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=180)
    output = lab.head.cli("logs", str(job_id)).stdout
    assert done["state"] == "succeeded", output
    assert "resumed from step" in output
