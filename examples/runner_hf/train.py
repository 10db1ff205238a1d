"""Train a small classifier with the Hugging Face Trainer, suspendable and resumable by gpuq.

`GpuqTrainerCallback` makes the end of each optimizer step an iteration
boundary: under gpuq, a suspend request (SIGUSR1, or `gpuq suspend`) makes the
Trainer save ``checkpoint-<step>`` in ``GPUQ_CHECKPOINT_DIR`` and the job exit
with code 75; started again, ``resume_from_checkpoint=last_checkpoint(...)``
continues from the next step. Outside gpuq the callback does nothing. The
model is a plain PyTorch module and the data is generated from a fixed seed,
so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

import gpuq.runner.distributed as gq_dist
from gpuq.runner.integrations.huggingface import (
    GpuqTrainerCallback,
    checkpoint_dir,
    last_checkpoint,
)


class Points(Dataset[dict[str, torch.Tensor]]):
    """Points around 10 random centres in 32 dimensions, labelled by their centre."""

    def __init__(self, samples: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        centres = torch.randn(10, 32, generator=gen) * 0.6
        self.labels = torch.randint(0, 10, (samples,), generator=gen)
        self.points = centres[self.labels] + torch.randn(samples, 32, generator=gen)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.points[index], "labels": self.labels[index]}


class Classifier(nn.Module):
    """An MLP with dropout that returns its loss, as Trainer expects."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 10)
        )

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        """Logits and cross-entropy loss."""
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class AskToSuspend(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Request a suspend after a given step on rank 0, as `gpuq suspend` would (to try it)."""

    def __init__(self, callback: GpuqTrainerCallback, step: int) -> None:
        self.callback, self.step = callback, step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Ask at the chosen step; GpuqTrainerCallback, next in the list, honours it."""
        if state.global_step == self.step and gq_dist.is_coordinator():
            self.callback.job.request_suspend()


class SayWhereItStarts(TrainerCallback):  # type: ignore[misc, unused-ignore]
    """Print the step training starts from (0, or the resumed one)."""

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Once per process, at its first step."""
        if not getattr(self, "said", False):
            self.said = True
            print(f"training from step {state.global_step}", flush=True)


def main(argv: list[str] | None = None) -> None:
    """Train, resuming from the newest checkpoint if there is one."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default="hf-out", help="checkpoints, outside gpuq")
    parser.add_argument("--suspend-at", type=int, help="request a suspend after this step")
    parser.add_argument("--out", help="save the final model and optimizer state here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    gpuq_callback = GpuqTrainerCallback()  # calls gq.init(): a no-op handle outside gpuq
    callbacks: list[TrainerCallback] = [SayWhereItStarts()]
    if args.suspend_at is not None:
        callbacks.append(AskToSuspend(gpuq_callback, args.suspend_at))
    output_dir = checkpoint_dir(args.output_dir)  # GPUQ_CHECKPOINT_DIR inside gpuq
    training = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        learning_rate=3e-3,
        optim="adamw_torch",
        lr_scheduler_type="linear",
        logging_steps=4,
        save_strategy="no",  # only suspends save here; use "steps" for crash safety too
        save_total_limit=2,  # each suspend adds a checkpoint-<step>: keep the newest two
        seed=args.seed,
        full_determinism=True,
        use_cpu=True,
        report_to="none",
        disable_tqdm=True,
    )
    torch.manual_seed(args.seed)
    model = Classifier(args.hidden)
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Points(args.samples, args.seed),
        callbacks=[*callbacks, gpuq_callback],
    )
    checkpoint = last_checkpoint(output_dir)  # None on a fresh start
    if checkpoint is not None:
        print(f"resuming from {checkpoint}", flush=True)
    trainer.train(resume_from_checkpoint=checkpoint)
    print(f"finished at step {trainer.state.global_step}", flush=True)
    if args.out and trainer.is_world_process_zero():
        optimizer = trainer.optimizer.state_dict() if trainer.optimizer is not None else {}
        torch.save({"model": model.state_dict(), "optimizer": optimizer}, args.out)
    # Under torchrun, free the process group while Python is intact: the Trainer's
    # DDP wrapper holds it, and gloo's threads must not end at interpreter shutdown.
    del trainer
    gq_dist.destroy_process_groups()


if __name__ == "__main__":
    main(sys.argv[1:])
