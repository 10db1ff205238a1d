"""Train a small CNN on generated images with gpuq.runner, so gpuq can suspend it exactly.

The images are 16x16 textures of four kinds (horizontal, vertical and
diagonal stripes, and a checkerboard) at a random phase and frequency, with
noise: an image task a CPU learns in seconds, and nothing is downloaded. The
network is two convolution blocks with batch normalisation (whose running
statistics are part of the model's state) and a linear head.

The runner wiring is the same as examples/runner_mlp: the model, optimizer
and LR scheduler in a `gq.State`, the data in a `gq.AdaptiveDataLoader`, and
`gq.step()` at the end of every iteration. Under gpuq a suspend saves a
checkpoint at the next step and exits with code 75; started again, the job
continues from the next step. Outside gpuq this is a plain script.
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from torch import nn
from torch.utils.data import TensorDataset

import gpuq.runner as gq

KINDS = 4
"""Texture classes: horizontal, vertical and diagonal stripes, checkerboard."""


def make_images(samples: int, size: int, noise: float, seed: int) -> TensorDataset:
    """Noisy textures of `KINDS` kinds, one channel of `size` x `size`, with their kind."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, KINDS, (samples,), generator=gen)
    frequency = 0.5 + torch.rand(samples, 1, 1, generator=gen)
    phase = 2 * math.pi * torch.rand(samples, 1, 1, generator=gen)
    rows = torch.arange(size, dtype=torch.float32).view(size, 1).expand(size, size)
    cols = rows.T
    coordinate = torch.stack([rows, cols, (rows + cols) / math.sqrt(2), rows])[labels]
    waves = torch.sin(frequency * coordinate + phase)
    checker = waves * torch.sin(frequency * cols + phase)  # rows times cols: a checkerboard
    images = torch.where((labels == 3).view(-1, 1, 1), checker, waves)
    images = images + noise * torch.randn(samples, size, size, generator=gen)
    return TensorDataset(images.unsqueeze(1), labels)


def make_model(width: int) -> nn.Module:
    """Two conv-BN-ReLU-pool blocks, global average pooling and a linear head."""

    def block(inputs: int, outputs: int) -> list[nn.Module]:
        conv = nn.Conv2d(inputs, outputs, 3, padding=1, bias=False)
        return [conv, nn.BatchNorm2d(outputs), nn.ReLU(), nn.MaxPool2d(2)]

    return nn.Sequential(
        *block(1, width),
        *block(width, 2 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, KINDS),
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; see --help."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2048, help="training images")
    parser.add_argument("--size", type=int, default=16, help="image side in pixels")
    parser.add_argument("--width", type=int, default=16, help="channels of the first block")
    parser.add_argument("--noise", type=float, default=2.0, help="noise std (signal: 1)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=0, help="print the loss every N steps")
    parser.add_argument("--out", help="save the final model and optimizer state here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Train, printing where it started and the accuracy after each epoch."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    job = gq.init()  # a no-op handle outside gpuq
    train = make_images(args.samples, args.size, args.noise, args.seed)
    test = make_images(512, args.size, args.noise, args.seed + 1)
    model = make_model(args.width).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(args.epochs, 1))
    loss_fn = nn.CrossEntropyLoss()
    state = gq.State(model=model, optimizer=opt, lr_scheduler=sched)
    if state.restore():  # everything random was drawn above: nothing random below
        print(f"resumed from step {job.step} (epoch {job.epoch})", flush=True)
    loader = gq.AdaptiveDataLoader(train, batch_size=args.batch_size, max_batch_size=1024)
    print(f"job {job.job_id or '-'}: training on {device}", flush=True)

    for epoch in gq.epochs(args.epochs):
        model.train()  # before the inner loop: runs again when an epoch is resumed
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)  # may save and exit here, or park until resumed
            if args.log_every and job.step % args.log_every == 0:
                print(f"step {job.step} loss {loss.item():.4f}", flush=True)
        sched.step()  # after the inner loop: once per epoch, resumed or not
        correct = accuracy(model, test, device)
        print(f"epoch {epoch}: step {job.step}, test accuracy {correct:.3f}", flush=True)

    if args.out:
        final = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": job.step}
        torch.save(final, args.out)


@torch.no_grad()
def accuracy(model: nn.Module, data: TensorDataset, device: torch.device) -> float:
    """Fraction of `data` classified right (draws no random numbers)."""
    model.eval()
    images, labels = (t.to(device) for t in data.tensors)
    return float((model(images).argmax(dim=1) == labels).float().mean())


if __name__ == "__main__":
    main()
