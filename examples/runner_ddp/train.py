"""Train a small MLP with DistributedDataParallel under torchrun, suspendable by gpuq.

Run it with ``torchrun --nproc-per-node N train.py``. Every rank calls
``gq.step()`` at the end of each iteration; there the ranks agree on whether
gpuq asked for a suspend, so they all stop at the same step. Rank 0 writes
the checkpoint, every rank exits with code 75, and a new ``torchrun`` of the
same command continues from the next step on every rank. Outside gpuq the
runner does nothing and this is a plain DDP script. Its data is generated
from a fixed seed, so nothing is downloaded. The loader splits each global
batch across the ranks, so the job may also resume on another number of
ranks (``gpuq submit --gpus 1-4`` with ``--nproc-per-node=gpuq``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import gpuq.runner as gq
import gpuq.runner.distributed as gq_dist


def make_data(samples: int, features: int, classes: int, seed: int) -> TensorDataset:
    """Points around `classes` random centres, labelled by their centre (the same on all ranks)."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=gen) * 0.6
    labels = torch.randint(0, classes, (samples,), generator=gen)
    points = centres[labels] + torch.randn(samples, features, generator=gen)
    return TensorDataset(points, labels)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="global: split across ranks")
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agree-every", type=int, default=1, help="agree on suspends every N")
    parser.add_argument("--log-every", type=int, default=20, help="rank 0 prints every N steps")
    parser.add_argument("--out", help="rank 0 saves the final model and optimizer state here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train on every rank; rank 0 prints progress."""
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda" if use_cuda else "cpu")

    job = gq.init()  # every rank; rank 0 is the one that talks to gpuq
    backend = "nccl" if use_cuda else "gloo"
    if "RANK" in os.environ:  # started by torchrun (or gpuq's torchrun wrapper)
        dist.init_process_group(backend)
    else:  # plain `python train.py`: a group of one, so the script runs as is
        rendezvous = Path(tempfile.mkdtemp(prefix="gpuq-ddp-")) / "rendezvous"
        dist.init_process_group(backend, init_method=rendezvous.as_uri(), rank=0, world_size=1)
    rank = dist.get_rank()
    gq_dist.configure(agree_every=args.agree_every)
    torch.manual_seed(args.seed)  # the same on every rank: a resume restores rank 0's generators
    print(f"rank {rank} pid {os.getpid()}: training on {device}", flush=True)

    model = nn.Sequential(
        nn.Linear(32, args.hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(args.hidden, 10)
    ).to(device)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    loss_fn = nn.CrossEntropyLoss()
    state = gq.State(model=model, optimizer=opt, lr_scheduler=sched)  # model, not ddp
    if state.restore():  # every rank loads the same checkpoint
        print(f"rank {rank} resumed from step {job.step} (epoch {job.epoch})", flush=True)
    data = make_data(args.samples, 32, 10, args.seed)  # the whole dataset, on every rank
    # Each rank gets its part of every batch; on another number of ranks it resumes alike.
    loader = gq.AdaptiveDataLoader(data, batch_size=args.batch_size, seed=args.seed)

    for _epoch in gq.epochs(args.epochs):
        model.train()  # before the inner loop: runs again when an epoch is resumed
        for x, y in loader:
            loss = loss_fn(ddp(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)  # every rank: they agree here, and may all stop here
            if rank == 0 and args.log_every and job.step % args.log_every == 0:
                print(f"step {job.step} loss {loss.item():.4f}", flush=True)
        sched.step()

    if rank == 0:
        print(f"finished at step {job.step}", flush=True)
        if args.out:
            final = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": job.step}
            torch.save(final, args.out)
    # Free the group now, while Python is intact: with nothing else holding it (DDP
    # does), destroying it joins gloo's threads, which may still be letting go of
    # the last all-reduce; at interpreter shutdown that aborts the rank (SIGABRT).
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
