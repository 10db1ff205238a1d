"""A gpuq.runner job that trains a small model step after step until a gate opens.

For the server-loss test: it takes a step every 50 ms (so a checkpoint the
daemon asks for is saved within one), says where it resumed from, and
finishes at the first step past `--steps` once the file `--gate` exists.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn

import gpuq.runner as gq


def main() -> None:
    """Train until the gate opens and `--steps` are done; say where it started and ended."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gate", required=True)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    job = gq.init()
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = gq.State(model=model, optimizer=opt)
    node = os.environ.get("GPUQ_NODE", "?")
    if state.restore():
        print(f"resumed from step {job.step} on {node}", flush=True)
    else:
        print(f"started from step 0 on {node}", flush=True)
    gate = Path(args.gate)
    while job.step < args.steps or not gate.exists():
        loss = model(torch.randn(8, 64)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        gq.step(loss=loss)
        time.sleep(0.05)
    print(f"done at step {job.step} on {node}", flush=True)


if __name__ == "__main__":
    main()
