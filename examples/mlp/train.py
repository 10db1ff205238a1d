"""Train a small MLP on generated data: a CPU-sized PyTorch job for gpuq.

Runs anywhere: on the GPU gpuq gives it (CUDA_VISIBLE_DEVICES) if CUDA is
there, else on the CPU. The data is made on the fly from a fixed seed, so
nothing is downloaded. Try: `gpuq submit --gpu-mem 2G -- python train.py`.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


def make_data(
    samples: int, features: int, classes: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Points around `classes` random centres, labelled by their centre."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, features, generator=gen) * 0.6
    labels = torch.randint(0, classes, (samples,), generator=gen)
    points = centres[labels] + torch.randn(samples, features, generator=gen)
    return points, labels


def main() -> None:
    """Train, printing the loss as it goes and the final accuracy."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x, y = make_data(8192, 32, 10, args.seed)
    x, y = x.to(device), y.to(device)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    job = os.environ.get("GPUQ_JOB_ID", "-")
    print(f"job {job}: training on {device} (GPUs {os.environ.get('GPUQ_GPU_UUIDS') or 'none'})")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, x.shape[0], (args.batch_size,))
        loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == 1:
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
    with torch.no_grad():
        accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
    print(f"done in {time.perf_counter() - start:.1f}s: accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
