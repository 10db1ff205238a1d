"""A job whose batch size gpuq tunes for goodput: `python examples/runner_adaptive/train.py`.

The task: a small MLP learns labels drawn from a random teacher's softmax on
data it generates itself (nothing is downloaded). Its steps are cheap, so a
larger batch trains many more samples per second, and its labels are noisy,
so a larger batch loses little statistical efficiency: the kind of job where
Pollux's goodput (throughput x efficiency) pays.

Two things differ from a plain `gpuq.runner` script: ``lr_scaling`` in the
`gq.State`, and a ``max_batch_size`` above the ``batch_size`` of the loader.
The loader then measures step times and the gradient noise scale, picks the
batch size and gradient-accumulation steps with the best predicted goodput
between steps (only when that beats the current choice by 5%), and the
learning rate follows the rule. ``--lr-scaling none`` trains at the fixed
initial batch size, for comparison. Inside gpuq it also reports its batch
size and goodput to the daemon (`gpuq show ID`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from torch import nn

import gpuq.runner as gq

FEATURES, CLASSES = 32, 10


class Samples(torch.utils.data.Dataset[Any]):
    """Tensors fetched a whole batch at a time (``__getitems__``)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.tensor(indices)
        return self.x[index], self.y[index]


def keep(batch: Any) -> Any:
    """The identity collate function: `Samples.__getitems__` already returns a batch."""
    return batch


def make_data(samples: int, seed: int) -> tuple[Samples, tuple[torch.Tensor, torch.Tensor]]:
    """Training samples and a validation set, labelled by a random linear teacher."""
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator) * 0.5

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(count, FEATURES, generator=generator)
        labels = torch.multinomial(torch.softmax(x @ teacher, dim=1), 1, generator=generator)
        return x, labels.squeeze(1)

    return Samples(*draw(samples)), draw(4096)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--samples", type=int, default=32768)
    parser.add_argument("--batch-size", type=int, default=16, help="the initial batch size")
    parser.add_argument("--max-batch-size", type=int, default=512)
    parser.add_argument(
        "--lr-scaling", choices=("adascale", "sqrt", "linear", "none"), default="adascale"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train, printing the batch size and validation loss after each epoch."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    job = gq.init()
    print(f"job {job.job_id if job.inside_gpuq else '-'}: training on cpu", flush=True)
    data, (val_x, val_y) = make_data(args.samples, args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.85)
    rule = None if args.lr_scaling == "none" else args.lr_scaling
    state = gq.State(model=model, optimizer=opt, lr_scheduler=sched, lr_scaling=rule)
    if state.restore():
        print(f"resumed at step {job.step}", flush=True)
    loader = gq.AdaptiveDataLoader(
        data, batch_size=args.batch_size, max_batch_size=args.max_batch_size, collate_fn=keep
    )
    loss_fn = nn.CrossEntropyLoss()
    start = time.perf_counter()
    for epoch in gq.epochs(args.epochs):
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)
        sched.step()
        with torch.no_grad():
            val = float(loss_fn(model(val_x), val_y))
        batch = loader.batch_size * (loader.accumulation_steps + 1)
        elapsed = time.perf_counter() - start
        print(
            f"epoch {epoch}: batch {batch}, step {job.step}, "
            f"validation loss {val:.4f}, {elapsed:.1f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
