"""Train a small classifier with PyTorch Lightning, suspendable and resumable by gpuq.

`GpuqCallback` makes the end of each training batch an iteration boundary:
under gpuq, a suspend request (SIGUSR1, or `gpuq suspend`) saves a Lightning
checkpoint there and exits with code 75; started again, the script passes
`last_checkpoint()` as ``ckpt_path`` and Lightning continues from the next
step. Outside gpuq the callback does nothing. The data is generated from a
fixed seed, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import gpuq.runner as gq
import gpuq.runner.distributed as gq_dist
from gpuq.runner.integrations.lightning import GpuqCallback, last_checkpoint


class Classifier(pl.LightningModule):
    """An MLP with dropout, SGD with momentum and a step LR schedule."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(32, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 10)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Cross-entropy of one batch."""
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        """SGD, its learning rate decayed every epoch."""
        opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)]


class AskToSuspend(pl.Callback):
    """Request a suspend after a given step on rank 0, as `gpuq suspend` would (to try it)."""

    def __init__(self, job: gq.Job, step: int) -> None:
        self.job, self.step = job, step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        """Ask at the chosen step; GpuqCallback, next in the list, honours it."""
        if trainer.global_step == self.step and gq_dist.is_coordinator():
            self.job.request_suspend()


class SayWhereItStarts(pl.Callback):
    """Print the step training starts from (0, or the resumed one)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Once per fit."""
        print(f"training from step {trainer.global_step}", flush=True)


def make_data(samples: int, seed: int) -> TensorDataset:
    """Points around 10 random centres in 32 dimensions, labelled by their centre."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(10, 32, generator=gen) * 0.6
    labels = torch.randint(0, 10, (samples,), generator=gen)
    return TensorDataset(centres[labels] + torch.randn(samples, 32, generator=gen), labels)


def main(argv: list[str] | None = None) -> None:
    """Fit, resuming from the last suspend checkpoint if there is one."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1, help="processes (DDP under torchrun)")
    parser.add_argument("--suspend-at", type=int, help="request a suspend after this step")
    parser.add_argument("--out", help="save the final model and optimizer state here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    pl.seed_everything(args.seed, verbose=False)

    gpuq_callback = GpuqCallback()  # calls gq.init(): a no-op handle outside gpuq
    callbacks: list[pl.Callback] = [SayWhereItStarts()]
    if args.suspend_at is not None:
        callbacks.append(AskToSuspend(gpuq_callback.job, args.suspend_at))
    model = Classifier(args.hidden)
    # A loader with state_dict(): Lightning saves its position, so a resume is exact mid-epoch.
    data: Dataset[Any] = make_data(args.samples, args.seed)
    if args.devices > 1:
        data = gq_dist.shard(data)  # Lightning shards only plain DataLoaders itself
    loader = gq.AdaptiveDataLoader(data, args.batch_size, seed=1)
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        deterministic=True,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*callbacks, gpuq_callback],
    )
    checkpoint = last_checkpoint()  # None on a fresh start, and outside gpuq
    if checkpoint is not None:
        print(f"resuming from {checkpoint}", flush=True)
    trainer.fit(model, loader, ckpt_path=checkpoint)
    print(f"finished at step {trainer.global_step}", flush=True)
    if args.out and trainer.is_global_zero:
        optimizer = trainer.optimizers[0].state_dict()
        torch.save({"model": model.state_dict(), "optimizer": optimizer}, args.out)
    # Under torchrun, free the process group while Python is intact, so gloo's
    # threads do not end at interpreter shutdown (see gpuq.runner.distributed).
    del trainer
    gq_dist.destroy_process_groups()


if __name__ == "__main__":
    main(sys.argv[1:])
