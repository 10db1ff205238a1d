"""Checkpoints arriving from another server: checked against their own headers, then put in place.

Files are made with the runner's own writer (`gpuq.runner.checkpoint`) and
checked with the torch-free reader (`gpuq.ckptfile`) a daemon uses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpuq import ckptfile
from gpuq.cluster.ssh import rsync_argv
from gpuq.config import ClusterConfig
from gpuq.daemon import incoming
from gpuq.errors import StateError, UsageError
from gpuq.runner import checkpoint
from tests.daemon_harness import running_daemon

pytestmark = [pytest.mark.torch]


def written(directory: Path, step: int) -> Path:
    payload = {"step": step, "weights": torch.arange(1000, dtype=torch.float32) * step}
    return checkpoint.write_checkpoint(directory, step, payload).path


def test_a_sound_checkpoint_verifies_and_a_flipped_byte_does_not(tmp_path: Path) -> None:
    path = written(tmp_path, 3)
    assert ckptfile.verify(path) is None
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    assert ckptfile.verify(path) == "ckpt-3.pt: its SHA-256 does not match its header"


def test_a_truncated_checkpoint_is_named_with_what_is_missing(tmp_path: Path) -> None:
    path = written(tmp_path, 4)
    path.write_bytes(path.read_bytes()[:-100])
    problem = ckptfile.verify(path)
    assert problem is not None and "bytes of payload, its header says" in problem


def test_commit_puts_a_sound_copy_in_place_of_the_old_checkpoints(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    written(job_dir / "checkpoints", 1)  # an earlier stay on this server
    arrived = incoming.prepare(job_dir)
    assert arrived == job_dir / "checkpoints.incoming" and not list(arrived.iterdir())
    written(arrived, 8)
    (arrived / "suspended.json").write_text('{"mode": "checkpoint", "step": 8}')
    result = incoming.commit(job_dir)
    assert result["checkpoints"] == 1 and result["files"] == 2 and result["bytes"] > 1000
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == [
        "ckpt-8.pt",
        "suspended.json",
    ]
    assert not arrived.exists()


def test_a_damaged_copy_replaces_nothing(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    kept = written(job_dir / "checkpoints", 1)
    arrived = incoming.prepare(job_dir)
    path = written(arrived, 8)
    (arrived / "suspended.json").write_text('{"mode": "checkpoint", "step": 8}')
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(StateError, match="the copied checkpoints are unsound: ckpt-8.pt"):
        incoming.commit(job_dir)
    assert kept.exists() and not arrived.exists()


def test_a_copy_checked_at_its_source_is_checked_here_for_its_headers_and_lengths(
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "job"
    arrived = incoming.prepare(job_dir)
    path = written(arrived, 8)
    (arrived / "suspended.json").write_text('{"mode": "checkpoint", "step": 8}')
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    # A flipped byte is the source's check to find (rsync checks the transfer itself).
    assert ckptfile.verify(path, digest=False) is None
    assert ckptfile.verify(path) == "ckpt-8.pt: its SHA-256 does not match its header"
    path.write_bytes(bytes(data[:-1]))
    with pytest.raises(StateError, match="ckpt-8.pt: .* bytes of payload, its header says"):
        incoming.commit(job_dir, checked=True)
    arrived = incoming.prepare(job_dir)
    written(arrived, 8)
    (arrived / "suspended.json").write_text('{"mode": "checkpoint", "step": 8}')
    assert incoming.commit(job_dir, checked=True)["checkpoints"] == 1


def test_a_server_checks_the_checkpoints_it_holds_for_a_head_when_asked(tmp_path: Path) -> None:
    with running_daemon(tmp_path / "gpu2") as gpu2:
        held = gpu2.state_dir / "hosted" / "head" / "jobs" / "7" / "checkpoints"
        assert gpu2.call("node.check", head="head", job=7) == {"problems": []}
        sound, damaged = written(held, 3), written(held, 4)
        damaged.write_bytes(damaged.read_bytes()[:-1])
        assert gpu2.call("node.check", head="head", job=7)["problems"] == [
            f"ckpt-4.pt: {damaged.stat().st_size - ckptfile.HEADER.size} bytes of payload, "
            f"its header says {damaged.stat().st_size - ckptfile.HEADER.size + 1}"
        ]
        assert ckptfile.verify(sound) is None
        with pytest.raises(UsageError, match="invalid head node name '../head'"):
            gpu2.call("node.check", head="../head", job=7)


def test_a_safety_copy_is_known_by_its_record_while_its_checkpoint_is_there(
    tmp_path: Path,
) -> None:
    job_dir = tmp_path / "job"
    arrived = incoming.prepare(job_dir, incoming.SAFETY)
    written(arrived, 5)
    record = {"mode": "copy", "job_id": 3, "attempt": 1, "step": 5, "from": "gpu2", "time": 1.0}
    (arrived / "suspended.json").write_text(json.dumps(record))
    assert incoming.safety_copy(job_dir) is None  # not in place yet
    assert incoming.commit(job_dir, checked=True, arrived=incoming.SAFETY)["checkpoints"] == 1
    assert not (job_dir / incoming.INCOMING).exists()  # a migration's copy is another directory
    assert incoming.safety_copy(job_dir) == record
    (job_dir / "checkpoints" / "ckpt-5.pt").unlink()
    assert incoming.safety_copy(job_dir) is None
    suspended = {"mode": "checkpoint", "job_id": 3, "attempt": 1, "step": 5}
    written(job_dir / "checkpoints", 5)
    (job_dir / "checkpoints" / "suspended.json").write_text(json.dumps(suspended))
    assert incoming.safety_copy(job_dir) is None  # the job's own checkpoint, not a copy


def test_a_copy_without_the_checkpoint_the_job_saved_replaces_nothing(tmp_path: Path) -> None:
    job_dir = tmp_path / "job"
    kept = written(job_dir / "checkpoints", 1)
    incoming.prepare(job_dir)  # rsync wrote somewhere else: nothing arrived
    with pytest.raises(StateError, match=r"no suspended.json naming the checkpoint the job saved"):
        incoming.commit(job_dir)
    arrived = incoming.prepare(job_dir)
    written(arrived, 7)
    (arrived / "suspended.json").write_text('{"mode": "checkpoint", "step": 8}')
    with pytest.raises(StateError, match="ckpt-8.pt, the checkpoint the job saved, did not"):
        incoming.commit(job_dir)
    assert kept.exists()


def test_commit_without_a_copy_says_so(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="no checkpoints arrived"):
        incoming.commit(tmp_path)


def test_rsync_goes_over_gpuqs_batch_mode_ssh_with_paths_unexpanded() -> None:
    argv = rsync_argv("/a b", "gpu2:/c", ClusterConfig(ssh_config=Path("/cfg")), Path("/run"))
    assert argv[0] == "rsync" and "--protect-args" in argv and "--whole-file" in argv
    rsh = argv[argv.index("--rsh") + 1]
    assert rsh.startswith("ssh -F /cfg -T -o BatchMode=yes")
    assert "ControlPath=/run/ssh/ssh-%C" in rsh
    assert argv[-3:] == ["--", "/a b/", "gpu2:/c/"]
