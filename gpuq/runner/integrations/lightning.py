"""PyTorch Lightning: suspend a ``Trainer.fit`` at a batch boundary when gpuq asks.

Add the callback and pass `last_checkpoint()` as ``ckpt_path``::

    from gpuq.runner.integrations.lightning import GpuqCallback, last_checkpoint

    trainer = L.Trainer(max_epochs=10, callbacks=[GpuqCallback()])
    trainer.fit(model, loader, ckpt_path=last_checkpoint())  # None on a fresh start

The end of each training batch that ended with an optimizer step
(``on_train_batch_end``; with gradient accumulation, the last batch of each
accumulated step) is the iteration boundary. There the callback reports the
step time and loss to gpuq (`job.metrics`) and honours a pending suspend: it
saves ``gpuq-step<N>.ckpt`` in ``GPUQ_CHECKPOINT_DIR`` with the trainer's own
``save_checkpoint`` (written to a temporary name, fsynced and renamed; the
two newest are kept), writes ``suspended.json`` and exits with
`gpuq.runner.SUSPEND_EXIT_CODE`. Started again, ``last_checkpoint()`` names
that file and Lightning restores model, optimizers, schedulers and loop
progress from it; the callback's own state in the checkpoint puts back the
random generators (Python, NumPy, torch, CUDA), so dropout continues as in an
uninterrupted run.

An exact resume in the middle of an epoch also needs the data position: use a
loader with ``state_dict()``/``load_state_dict()``, such as
``gq.AdaptiveDataLoader``, which Lightning saves and restores itself. With a
plain ``DataLoader`` Lightning restarts the interrupted epoch's data from the
beginning (and warns so).

Under DDP the ranks agree at every boundary (`gpuq.runner.distributed`: on
the CPU, so a NCCL job's GPU stream is never waited for), so they all stop
after the same step; rank 0 writes the file. A park request is served as a
checkpoint suspend: Lightning's state is not where the runner can park it.
Outside gpuq (no ``GPUQ_JOB_ID``) the callback does nothing and adds nothing
to checkpoints.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from gpuq import env
from gpuq.runner import distributed
from gpuq.runner.integrations import _suspend
from gpuq.runner.job import Job, RunnerError, init

CHECKPOINT_PATTERN = re.compile(r"^gpuq-step(\d+)\.ckpt$")
"""Names of the checkpoints the callback writes."""
KEEP = 2
"""Suspend checkpoints kept: the newest and the one before it."""


def last_checkpoint(directory: str | os.PathLike[str] | None = None) -> str | None:
    """The newest suspend checkpoint (in ``GPUQ_CHECKPOINT_DIR`` by default), for ``ckpt_path``.

    None on a fresh start and outside gpuq, so ``trainer.fit(..., ckpt_path=last_checkpoint())``
    starts from scratch there.
    """
    found = _checkpoints(directory)
    return str(found[0][1]) if found else None


def _checkpoints(directory: str | os.PathLike[str] | None) -> list[tuple[int, Path]]:
    """(step, path) of the suspend checkpoints, newest first."""
    where = directory if directory is not None else env.checkpoint_dir()
    if where is None or not Path(where).is_dir():
        return []
    found = []
    for path in Path(where).iterdir():
        match = CHECKPOINT_PATTERN.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


class GpuqCallback(pl.Callback):  # type: ignore[misc, unused-ignore]
    """Report each training step to gpuq and suspend at a batch boundary when asked."""

    def __init__(self, job: Job | None = None) -> None:
        self.job = job if job is not None else init()
        self._last_step: int | None = None

    def state_dict(self) -> dict[str, Any]:
        """The random generators, so a resume draws what an uninterrupted run would."""
        from gpuq.runner.state import capture_rng

        return {"rng": capture_rng()} if self.job.inside_gpuq else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Put back the generators a suspend checkpoint saved."""
        from gpuq.runner.state import restore_rng

        if "rng" in state_dict:
            restore_rng(state_dict["rng"])

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Note the step training starts from (0, or the restored one)."""
        self._last_step = trainer.global_step

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """The iteration boundary: measure, then suspend if gpuq asked (agreed by all ranks)."""
        job = self.job
        if not job.inside_gpuq or trainer.global_step == self._last_step:
            return  # outside gpuq, or between the batches of one accumulated step
        self._last_step = trainer.global_step
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        _suspend.record_boundary(
            job, step=trainer.global_step, epoch=trainer.current_epoch, loss=loss
        )
        if job.metrics is not None:
            size = _batch_size(batch)
            if size is not None:
                job.metrics.update_batch(
                    local_batch_size=size,
                    accumulation_steps=trainer.accumulate_grad_batches,
                    replicas=trainer.world_size,
                )
        if distributed.agree_on_suspend(job) is not None:  # a park request counts too
            self._suspend(trainer)

    def _suspend(self, trainer: pl.Trainer) -> None:
        """Save through the trainer, acknowledge on rank 0, and exit on every rank."""
        job = self.job
        directory = job.checkpoint_dir
        if directory is None:
            raise _no_directory()
        start = time.perf_counter()
        final = directory / f"gpuq-step{trainer.global_step}.ckpt"
        temporary = directory / f".{final.name}.tmp-{os.getpid()}"
        trainer.save_checkpoint(temporary)  # every rank: the strategy decides who writes
        if trainer.is_global_zero:
            _fsync(temporary)
            os.replace(temporary, final)
            _fsync(directory)
            for _, old in _checkpoints(directory)[KEEP:]:
                old.unlink(missing_ok=True)
            report = _suspend.acknowledge(job, directory, final, time.perf_counter() - start)
            message = f"suspended at step {job.step}: {report.bytes} bytes saved"
        else:
            message = f"rank {trainer.global_rank} suspended at step {job.step} (rank 0 saved)"
        trainer.strategy.barrier("gpuq-suspend")
        _suspend.exit_suspended(job, message)


def _batch_size(batch: Any) -> int | None:
    """Samples in a batch: the length of its first tensor, if it has one."""
    import torch

    first = batch
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _no_directory() -> RunnerError:
    return RunnerError(
        "gpuq asked for a suspend but the job has no checkpoint directory",
        hint="gpuq sets GPUQ_CHECKPOINT_DIR for its jobs; is this a gpuq job?",
    )
