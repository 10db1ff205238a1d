"""A gpuq.runner job that emulates a GPU's work on fake GPUs, for the packing tests.

Each iteration trains a tiny model on CPU (real PyTorch, through the runner)
and then "computes on the GPU" for `--device-seconds`, stretched by the
sharing slowdown its fake GPU publishes (`gpuq.gpus.fakeload`): beside
another job on a fake GPU whose `share_slowdown` is 2.8, each step takes
2.8 times as long, and the runner's step times say so. From step
`--grow-at` on, the job needs `--memory` bytes on its GPU; when the GPU has
less room than that beside what other jobs hold, it dies of
`torch.OutOfMemoryError`, as a CUDA job would (judged from a load the
daemon published after the job began computing, so a stale one from
before its turn never counts). Outside gpuq it runs at solo speed with all
the memory it wants.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import gpuq.runner as gq
from gpuq.gpus.fakeload import JobDevices
from gpuq.units import format_size, parse_size


def main() -> None:
    """Train for `--steps` iterations, emulating the device (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--device-seconds", type=float, default=0.2)
    parser.add_argument("--memory", default="0", help="bytes needed from --grow-at on")
    parser.add_argument("--grow-at", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    need = parse_size(args.memory) or 0

    job = gq.init()
    devices = JobDevices.from_env()
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = gq.State(model=model, optimizer=opt)
    if state.restore():
        print(f"resumed from step {job.step}", flush=True)
    points = torch.randn(64, 8)
    computing_since = time.time()  # the device's load is trusted once published after this
    while job.step < args.steps:
        loss = model(points).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        room = None if devices is None else devices.room(after=computing_since)
        if need and job.step >= args.grow_at and room is not None and room < need:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {format_size(need)} "
                f"({format_size(room)} free beside other jobs)"
            )
        slowdown = 1.0 if devices is None else devices.slowdown()
        time.sleep(args.device_seconds * slowdown)
        before = time.time()
        gq.step(loss=loss)
        if time.time() - before > 1.0:  # parked for another's turn: back on the device now
            computing_since = time.time()
    print(f"done at step {job.step}", flush=True)


if __name__ == "__main__":
    main()
