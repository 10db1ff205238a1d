"""An adaptive DDP training job for the live resize test (tests/test_live_resize_ddp.py).

Run under ``torchrun`` (gloo, CPU), as gpuq runs an adaptive job with
``--nproc-per-node=gpuq``: one rank per GPU of the attempt. A small MLP
classifies generated points (noisy labels, so the gradient has noise to
measure), with `gq.State(lr_scaling="adascale")` and a
`gq.AdaptiveDataLoader` over the whole dataset, whose global batch the
runner tunes for goodput and splits across the ranks.

Fake GPUs compute nothing, so each micro-batch also sleeps
``--sample-seconds`` per sample of the rank's part, as a GPU's forward and
backward pass would take time in proportion to its batch, and in parallel
with the other ranks' (the ranks' real CPU work is small next to it, but
shares the machine's cores). Without it a toy model's step is all fixed
overhead and all-reduce, and more ranks could never pay: the policy would
rightly keep the job on one GPU.

The job keeps, in its checkpointed `gq.State`, the index of every sample it
took an optimizer step on (every rank's part, gathered), in order, with the
count at the end of each epoch and the pass over the data each belongs to
(an epoch is one pass at the initial batch, more when the tuner takes larger
batches: `gq.AdaptiveDataLoader`); samples of a step still accumulating are
kept apart until the step is taken, and dropped if a resume on another
number of ranks starts that step again. It also notes, at each attempt's
first whole batch (not half of a measured step), the world size with the
global and per-rank batch. With
``--out``, rank 0 writes all of it and the final validation loss there as
JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, TensorDataset

import gpuq.runner as gq

FEATURES, CLASSES = 16, 4


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Points around one centre per class; a fifth of the labels are random."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, CLASSES, (samples,), generator=gen)
    points = centres[labels] * 0.5 + torch.randn(samples, FEATURES, generator=gen)
    noisy = torch.rand(samples, generator=gen) < 0.2
    labels = torch.where(noisy, torch.randint(0, CLASSES, (samples,), generator=gen), labels)
    return points, labels


def indexed(points: torch.Tensor, labels: torch.Tensor) -> Dataset[Any]:
    """The dataset with each sample's index as a third field."""
    return TensorDataset(points, labels, torch.arange(len(labels)))


def parse_args() -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32, help="initial global batch (M0)")
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--sample-seconds", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=0, help="model init and data order")
    parser.add_argument("--out")
    return parser.parse_args()


def gathered(ids: torch.Tensor, world: int, most: int) -> list[int]:
    """Every rank's sample indices of this micro-batch (at most `most` each), rank 0's first."""
    if world == 1:
        return [int(i) for i in ids.tolist()]
    padded = torch.full((most,), -1, dtype=torch.int64)
    padded[: len(ids)] = ids
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)  # the ranks' parts differ by one sample at most: padded
    return [int(i) for i in torch.cat(parts).tolist() if i >= 0]


def main() -> None:
    """Train on every rank; rank 0 reports."""
    args = parse_args()
    torch.set_num_threads(1)
    job = gq.init()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # alike on every rank

    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, CLASSES))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    record: dict[str, Any] = {
        "trained": [],
        "passes": [],
        "pending": [],
        "epoch_ends": [],
        "attempts": [],
    }
    state = gq.State(model=model, optimizer=opt, lr_scaling="adascale", record=record)
    state.restore()
    loader = gq.AdaptiveDataLoader(
        indexed(*make_data(args.samples, 1)),
        batch_size=args.batch_size,
        max_batch_size=args.max_batch_size,
        seed=args.seed,
    )
    loss_fn = nn.CrossEntropyLoss()
    noted = False
    for _epoch in gq.epochs(args.epochs):
        for x, y, ids in loader:
            tuner = loader.tuner
            halves = tuner is not None and loader.accumulation_steps == 0
            first_of_step = tuner is None or tuner.gns.pending() == 0
            if first_of_step:
                record["pending"] = []  # a step begins (or a resize made it begin again)
            loss_fn(ddp(x), y).backward()
            time.sleep(args.sample_seconds * len(x))  # the fake GPU's compute
            opt.step()
            opt.zero_grad(set_to_none=True)
            # A measured step comes as two halves of its batch: note a whole one.
            absorbed = tuner is not None and tuner.gns.accumulated
            whole = not halves or (first_of_step and not absorbed)
            if not noted and whole:
                record["attempts"].append([world, loader.batch_size, len(x)])
                noted = True
            most = -(-loader.batch_size // world)  # the largest rank's part of this batch
            taken = record["pending"] + gathered(ids, world, most)
            if tuner is not None and tuner.gns.accumulated:  # absorbed: no step yet
                record["pending"] = taken
            else:
                record["trained"] = record["trained"] + taken
                record["passes"] = record["passes"] + [loader.pass_number] * len(taken)
                record["pending"] = []
            gq.step()
        record["epoch_ends"].append(len(record["trained"]))

    if rank == 0 and args.out:
        points, labels = make_data(args.samples // 2, 2)
        with torch.no_grad():
            val_loss = float(loss_fn(model(points), labels))
        summary = {**record, "val_loss": val_loss, "steps": job.step}
        Path(args.out).write_text(json.dumps(summary))
        print(f"finished at step {job.step}: val_loss {val_loss:.4f}", flush=True)
    print(f"rank {rank} pid {os.getpid()} done", flush=True)
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
