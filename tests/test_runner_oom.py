"""A runner job that dies of CUDA out-of-memory leaves a record naming its attempt.

See gpuq/runner/oom.py. The daemon reads the record to requeue a job that
ran out of memory while packed (gpuq/daemon/oom.py, tests/test_live_packing.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.control import OOM_FILE
from gpuq.runner.oom import is_out_of_memory

pytestmark = [pytest.mark.torch]

SCRIPT = """
import sys
import torch
import gpuq.runner as gq

job = gq.init()
job.step = 7
kind = sys.argv[1]
if kind == "oom":
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
if kind == "wrapped":
    try:
        raise RuntimeError("CUDA error: out of memory")
    except RuntimeError as exc:
        raise ValueError("the training step failed") from exc
raise ValueError("not about memory")
"""


def run(tmp_path: Path, kind: str, inside: bool = True) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    if inside:
        environ.update(
            GPUQ_JOB_ID="9", GPUQ_ATTEMPT="3", GPUQ_CHECKPOINT_DIR=str(tmp_path / "ckpt")
        )
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, kind], env=environ, capture_output=True, text=True
    )


@pytest.mark.parametrize("kind", ["oom", "wrapped"])
def test_a_job_dying_of_cuda_out_of_memory_records_its_attempt_and_step(
    tmp_path: Path, kind: str
) -> None:
    done = run(tmp_path, kind)
    assert done.returncode == 1, "the exit status is Python's own"
    assert "Traceback" in done.stderr, "the traceback is still printed"
    record = json.loads((tmp_path / "ckpt" / OOM_FILE).read_text())
    assert (record["job_id"], record["attempt"], record["step"]) == (9, 3, 7)
    assert "out of memory" in record["error"] or "failed" in record["error"]


def test_other_errors_leave_no_record_and_a_stale_one_is_removed(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / OOM_FILE).write_text('{"job_id": 9, "attempt": 2}')
    done = run(tmp_path, "other")
    assert done.returncode == 1 and "not about memory" in done.stderr
    assert not (tmp_path / "ckpt" / OOM_FILE).exists()


def test_outside_gpuq_nothing_is_written(tmp_path: Path) -> None:
    done = run(tmp_path, "oom", inside=False)
    assert done.returncode == 1
    assert not (tmp_path / "ckpt").exists()


class OutOfMemoryError(Exception):
    """Not torch's: a script's own error of the same name."""


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("shape mismatch"), False),
        (OutOfMemoryError("mine"), False),
        (MemoryError(), False),
    ],
)
def test_what_counts_as_cuda_out_of_memory(error: BaseException, expected: bool) -> None:
    assert is_out_of_memory(error) is expected


def test_torch_out_of_memory_counts_even_as_a_cause() -> None:
    import torch

    outer = KeyError("step")
    outer.__cause__ = torch.OutOfMemoryError("CUDA out of memory")
    assert is_out_of_memory(outer)
