"""What the framework callbacks share: the boundary record, the acknowledgement, the exit.

The frameworks write their own checkpoints (a Lightning ``.ckpt`` file, a
Hugging Face ``checkpoint-<step>`` directory); this module measures the
boundary for `job.metrics`, writes ``suspended.json`` the way
`gpuq.runner.loop` does, and exits with `gpuq.runner.SUSPEND_EXIT_CODE`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from gpuq.runner import SUSPEND_EXIT_CODE
from gpuq.runner.job import Job, StepInfo, SuspendReport, write_acknowledgement


def record_boundary(job: Job, *, step: int, epoch: int, loss: Any) -> None:
    """Count a framework's optimizer step as a boundary: timing, memory, loss, step hooks."""
    import torch

    from gpuq.runner.state import cuda_in_use

    now = time.perf_counter()
    job.step, job.epoch = step, epoch
    seconds = None if job.boundary_time is None else now - job.boundary_time
    boundary = peak = None
    if cuda_in_use():
        boundary, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    if isinstance(loss, torch.Tensor):
        loss = loss.detach()
    job.record_step(StepInfo(step, epoch, seconds, boundary, peak, loss))
    job.boundary_time = now


def file_bytes(path: Path) -> int:
    """Size of a checkpoint file, or of every file under a checkpoint directory."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size


def acknowledge(job: Job, directory: Path, checkpoint: Path, seconds: float) -> SuspendReport:
    """Write ``suspended.json`` (`write_acknowledgement`) and tell the daemon."""
    report = SuspendReport("checkpoint", job.step, file_bytes(checkpoint), seconds)
    job.suspends.append(report)
    write_acknowledgement(directory, job, report, {"checkpoint": checkpoint.name})
    job.report_suspend(report)
    return report


def exit_suspended(job: Job, message: str) -> NoReturn:
    """Say what happened on stderr, restore the signal handlers and exit with code 75."""
    print(f"gpuq.runner: {message}", file=sys.stderr, flush=True)
    job.close()
    raise SystemExit(SUSPEND_EXIT_CODE)
