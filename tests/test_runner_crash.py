"""Acceptance 2: SIGKILL during checkpoint writes never costs the last complete checkpoint.

The example job checkpoints after every step (a 2 MB state, so a write takes
milliseconds) and is SIGKILLed again and again: in odd rounds just after a
temporary checkpoint file appears, in even rounds at a random moment once it
has made progress. After every kill the newest ``ckpt-<step>.pt`` on disk must
verify on its own terms (header, length, sha256, step inside), and the next
start must resume from exactly that step. Finally the job runs to the end and
must match an uninterrupted run bit for bit.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import signal
import struct
import time
from functools import partial
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest
import torch

from gpuq.runner import checkpoint
from tests.daemon_harness import wait_for
from tests.test_runner_equivalence import (
    ARGS,
    assert_bitwise_equal,
    plain_environ,
    start_example,
)

ROUNDS = 20
BIG = [*ARGS, "--hidden", "4096", "--checkpoint-every", "1", "--log-every", "0"]

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def temporaries(directory: Path, pid: int | None = None) -> list[str]:
    """Partial checkpoint files (of process `pid` only, if given)."""
    pattern = f".ckpt-*.tmp-{pid if pid is not None else '*'}"
    return [p.name for p in directory.glob(pattern)] if directory.is_dir() else []


def newest_step(directory: Path) -> int:
    found = checkpoint.list_checkpoints(directory)
    return found[0][0] if found else 0


def writing(process: BaseProcess, directory: Path) -> bool:
    """True while `process` writes a checkpoint (or once it has ended, to fail fast)."""
    return bool(temporaries(directory, process.pid)) or not process.is_alive()


def progressed(process: BaseProcess, directory: Path, before: int) -> bool:
    """True once a checkpoint newer than `before` is complete (or the process has ended)."""
    return newest_step(directory) > before or not process.is_alive()


def verify_independently(path: Path) -> int:
    """Check a checkpoint file by the documented format, without the runner's reader."""
    raw = path.read_bytes()
    magic, version, length, digest = struct.unpack(">8sIQ32s", raw[:52])
    body = raw[52:]
    assert (magic, version, len(body)) == (b"GPUQCKPT", 1, length), path
    assert hashlib.sha256(body).digest() == digest, path
    step = torch.load(io.BytesIO(body), weights_only=True)["step"]
    assert path.name == f"ckpt-{step}.pt"
    return int(step)


def test_sigkill_at_random_points_never_loses_the_last_complete_checkpoint(
    tmp_path: Path,
) -> None:
    rng = random.Random(8128)
    reference = start_example(
        [*BIG, "--out", str(tmp_path / "reference.pt")], plain_environ(), tmp_path / "ref.log"
    )
    checkpoints = tmp_path / "ckpt"
    inside = plain_environ(job_id="9", checkpoint_dir=str(checkpoints))
    resume_from, killed_mid_write = 0, 0
    for round_ in range(ROUNDS):
        log = tmp_path / f"round-{round_}.log"
        before = newest_step(checkpoints)
        job = start_example(BIG, inside, log)
        if round_ % 2:
            wait_for(partial(writing, job, checkpoints), interval=0.0005)
            time.sleep(rng.uniform(0, 0.004))
        else:
            wait_for(partial(progressed, job, checkpoints, before))
            time.sleep(rng.uniform(0, 0.03))
        os.kill(job.pid, signal.SIGKILL)  # type: ignore[arg-type]
        job.join(30)
        assert job.exitcode == -signal.SIGKILL, log.read_text()
        killed_mid_write += bool(temporaries(checkpoints, job.pid))
        if resume_from:
            assert f"resumed from step {resume_from} " in log.read_text()
        files = checkpoint.list_checkpoints(checkpoints)
        # Pruning follows the rename, so a kill in between leaves one extra complete file.
        assert 1 <= len(files) <= checkpoint.KEEP + 1
        assert all(verify_independently(path) == step for step, path in files)
        assert files[0][0] >= before
        resume_from = files[0][0]

    last = tmp_path / "last.log"
    job = start_example([*BIG, "--out", str(tmp_path / "resumed.pt")], inside, last)
    job.join(120)
    assert job.exitcode == 0 and f"resumed from step {resume_from} " in last.read_text()
    assert temporaries(checkpoints) == [] and list(checkpoints.glob("*.corrupt")) == []
    assert len(checkpoint.list_checkpoints(checkpoints)) == checkpoint.KEEP
    assert killed_mid_write >= ROUNDS // 4, "the kills should land inside checkpoint writes"
    reference.join(120)
    assert reference.exitcode == 0
    assert_bitwise_equal(tmp_path / "reference.pt", tmp_path / "resumed.pt")
