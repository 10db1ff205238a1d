"""`gpuq show` says why a running adaptive job has the GPUs it has.

A plain job (no gpuq.runner) of `--gpus 1-2` alone on two fake GPUs starts
on one: `pollux` explores one GPU until a job's runner reports; `gpuq` also
knows the job offers no checkpoint to resize it through. The start's reason says so once,
in the history; `gpuq show` says it for as long as it holds (`sizing`,
"Sizing:"), and has nothing to say of a job that is not running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon_harness import running_daemon, wait_for

EXPLORING = "speedup 0.50 over a fair share; 1 of 1-2 GPUs until its runner reports"
UNRESIZABLE = (
    "kept on 1 of 1-2 GPUs: it is resized only through a gpuq.runner checkpoint"
    " and has offered none"
)


@pytest.mark.parametrize(
    ("policy", "note"),
    [("gpuq", UNRESIZABLE), ("pollux:population=16:generations=10", EXPLORING)],
    ids=["gpuq", "pollux"],
)
def test_show_says_what_holds_an_adaptive_job_on_one_gpu(
    tmp_path: Path, policy: str, note: str
) -> None:
    config = f'[scheduler]\npolicy = "{policy}"\ninterval = 1\n'
    with running_daemon(tmp_path / "d", extra_toml=config) as daemon:
        job_id = daemon.submit(["sleep", "60"], gpus=1, gpus_max=2)
        daemon.wait_state(job_id, "running")
        shown = wait_for(
            lambda: (reply := daemon.call("show", id=job_id))["sizing"] and reply,
            what="a sizing note",
        )
        assert shown["sizing"] == note
        starting = shown["events"][1]["reason"]
        assert starting.endswith(EXPLORING), starting  # the start said why once: one GPU to explore
        text = daemon.cli("show", str(job_id))
        assert text.returncode == 0, text.stderr
        assert f"  Sizing:     {note}\n" in text.stdout
        daemon.call("cancel", ids=[job_id])
        daemon.wait_state(job_id, "cancelled")
        assert daemon.call("show", id=job_id)["sizing"] is None
        assert "Sizing:" not in daemon.cli("show", str(job_id)).stdout


def test_a_rigid_job_has_no_sizing_note(tmp_path: Path) -> None:
    with running_daemon(tmp_path / "d") as daemon:
        job_id = daemon.submit(["sleep", "60"], gpus=1)
        daemon.wait_state(job_id, "running")
        assert daemon.call("show", id=job_id)["sizing"] is None
        daemon.call("cancel", ids=[job_id])
