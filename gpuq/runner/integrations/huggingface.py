"""Hugging Face ``Trainer``: suspend at a step boundary when gpuq asks, resume from there.

Add the callback, keep checkpoints in gpuq's directory, and resume from the
newest one::

    from gpuq.runner.integrations.huggingface import (
        GpuqTrainerCallback, checkpoint_dir, last_checkpoint)

    args = TrainingArguments(output_dir=checkpoint_dir("out"), ...)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[GpuqTrainerCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))

`checkpoint_dir` is ``GPUQ_CHECKPOINT_DIR`` inside gpuq and the given
directory outside it. The end of each optimizer step (``on_step_end``) is the
iteration boundary: the callback reports the step time and the last logged
loss to gpuq (`job.metrics`) and, when a suspend is pending, sets
``control.should_save``. The Trainer then writes ``checkpoint-<step>`` (model,
optimizer, scheduler, random generators, trainer state) and calls
``on_save``, where the callback writes ``suspended.json`` and exits with
`gpuq.runner.SUSPEND_EXIT_CODE`. ``resume_from_checkpoint`` makes the Trainer
restore all of it and skip the batches the interrupted epoch already used.

The callback does not set ``control.should_training_stop``: the Trainer saves
that flag in the checkpoint, and with ``restore_callback_states_from_checkpoint``
the resumed run would stop at once. It exits in ``on_save`` instead.

Under torchrun every rank runs the callback; the ranks agree on the suspend
at each step (`gpuq.runner.distributed`), so they all save the same step, and
rank 0 writes the acknowledgement once the checkpoint is on disk. A park
request is served as a checkpoint suspend: the Trainer's state is not where
the runner can park it. Outside gpuq (no ``GPUQ_JOB_ID``) the callback does
nothing.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from gpuq import env
from gpuq.runner import distributed
from gpuq.runner.integrations import _suspend
from gpuq.runner.job import Job, RunnerError, init

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
"""Names of the Trainer's checkpoint directories."""
COMPLETE_MARKER = "trainer_state.json"
"""The file the Trainer writes last into a checkpoint directory (before pruning old ones)."""


def checkpoint_dir(default: str | os.PathLike[str]) -> str:
    """Where the Trainer should write checkpoints: ``GPUQ_CHECKPOINT_DIR`` inside gpuq."""
    return env.checkpoint_dir() or os.fspath(default)


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest complete ``checkpoint-<step>`` in `output_dir`, for ``resume_from_checkpoint``.

    None on a fresh start. A directory without ``trainer_state.json`` (a save
    that was cut short) is passed over.
    """
    directory = Path(output_dir)
    if not directory.is_dir():
        return None
    found = []
    for path in directory.iterdir():
        match = CHECKPOINT_PATTERN.match(path.name)
        if match and (path / COMPLETE_MARKER).is_file():
            found.append((int(match.group(1)), path))
    return str(max(found)[1]) if found else None


class GpuqTrainerCallback(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Report each training step to gpuq and suspend through a Trainer checkpoint when asked."""

    def __init__(self, job: Job | None = None) -> None:
        self.job = job if job is not None else init()
        self.suspending = False
        """True from the step that agreed to suspend until the exit after its save."""
        self._loss: float | None = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """Tell gpuq the batch configuration."""
        if self.job.inside_gpuq and self.job.metrics is not None:
            self.job.metrics.update_batch(
                local_batch_size=args.per_device_train_batch_size,
                accumulation_steps=args.gradient_accumulation_steps,
                replicas=args.world_size,
            )

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Remember the latest training loss the Trainer logged (every ``logging_steps``)."""
        if logs and isinstance(logs.get("loss"), (int, float)):
            self._loss = float(logs["loss"])

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """The iteration boundary: measure, and ask the Trainer to save if gpuq wants a suspend."""
        job = self.job
        if not job.inside_gpuq:
            return
        _suspend.record_boundary(
            job, step=state.global_step, epoch=int(state.epoch or 0), loss=self._loss
        )
        if distributed.agree_on_suspend(job) is not None:  # a park request counts too
            self.suspending = True
            control.should_save = True

    def on_save(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        """After the suspend's checkpoint: acknowledge on rank 0, and exit on every rank."""
        if not self.suspending:
            return
        job = self.job
        if job.checkpoint_dir is None:
            raise RunnerError(
                "gpuq asked for a suspend but the job has no checkpoint directory",
                hint="gpuq sets GPUQ_CHECKPOINT_DIR for its jobs; is this a gpuq job?",
            )
        saved = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        seconds = 0.0 if job.boundary_time is None else time.perf_counter() - job.boundary_time
        if state.is_world_process_zero:
            report = _suspend.acknowledge(job, job.checkpoint_dir, saved, seconds)
            message = f"suspended at step {job.step}: {report.bytes} bytes saved in {saved}"
        else:
            message = f"rank {distributed.rank()} suspended at step {job.step} (rank 0 saved)"
        group = distributed.coordination_group()
        if group is not None:
            import torch.distributed as dist

            dist.barrier(group=group)  # the others leave once the acknowledgement is written
        _suspend.exit_suspended(job, message)
