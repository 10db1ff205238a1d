"""Dying of CUDA out-of-memory: the record the daemon reads to requeue the job.

Inside gpuq, `gpuq.runner.init()` installs an exception hook (`OomHook`,
removed again by `job.close()`). When an exception ends the script and it
is, or was caused by, a CUDA out-of-memory error (`torch.OutOfMemoryError`,
or a RuntimeError saying "CUDA out of memory"), the hook writes `OOM_FILE`
(``out-of-memory.json``) into the checkpoint directory, naming the job,
the attempt, the step and the error, and then lets Python print the
traceback and exit as usual (status 1). No status of its own: the record,
which names the attempt, is the proof, as ``suspended.json`` is for a
suspend. The daemon reads it when the job ends: a job that ran out of
memory while packed with another is requeued with more memory, not failed.

An out-of-memory error the script catches itself is its own business, and
one raised in another thread does not end the job; neither is recorded.
This module imports nothing heavy (the error is recognised by name).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from gpuq.control import OOM_FILE

if TYPE_CHECKING:
    from gpuq.runner.job import Job

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]
CUDA_OOM_TEXTS = ("CUDA out of memory", "CUDA error: out of memory")


def is_out_of_memory(error: BaseException | None) -> bool:
    """True if `error`, or an exception it was raised from, is a CUDA out-of-memory error."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        kind = type(error)
        if kind.__name__ == "OutOfMemoryError" and kind.__module__.startswith("torch"):
            return True
        if isinstance(error, RuntimeError) and any(t in str(error) for t in CUDA_OOM_TEXTS):
            return True
        error = error.__cause__ or error.__context__
    return False


def write_record(directory: Path, job: Job, error: BaseException) -> None:
    """Write `OOM_FILE` atomically: which job and attempt ran out of memory, at what step."""
    record = {
        "job_id": job.job_id,
        "attempt": job.attempt,
        "step": job.step,
        "error": str(error).splitlines()[0][:500] if str(error) else type(error).__name__,
    }
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{OOM_FILE}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(record, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / OOM_FILE)


class OomHook:
    """The exception hook of one job handle (module docstring)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self._previous: ExceptHook | None = None

    def install(self) -> None:
        """Chain in front of the current `sys.excepthook`; a stale record is removed first."""
        if self.job.checkpoint_dir is None:
            return
        (self.job.checkpoint_dir / OOM_FILE).unlink(missing_ok=True)
        self._previous = sys.excepthook
        sys.excepthook = self.hook

    def restore(self) -> None:
        """Put the previous hook back, if ours is still in place."""
        if self._previous is not None and sys.excepthook == self.hook:
            sys.excepthook = self._previous
        self._previous = None

    def hook(
        self, kind: type[BaseException], error: BaseException, trace: TracebackType | None
    ) -> None:
        """Record a CUDA out-of-memory death, then report the exception as before."""
        directory = self.job.checkpoint_dir
        if directory is not None and is_out_of_memory(error):
            try:
                write_record(directory, self.job, error)
            except OSError as exc:
                print(f"gpuq.runner: out-of-memory not recorded: {exc}", file=sys.stderr)
        (self._previous or sys.__excepthook__)(kind, error, trace)
