"""A gpuq.runner job with a large state (a 32M-parameter layer: a 128 MiB checkpoint).

For the migration fault tests: its checkpoint takes long enough to copy
that a test can cut the link while rsync runs. `--gate PATH` holds it after
its first steps until PATH exists, unless the daemon asks it to suspend.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import gpuq.runner as gq


def main() -> None:
    """Take a few steps, wait at the gate, take a few more."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gate", required=True)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    job = gq.init()
    model = nn.Linear(4096, 8192, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = gq.State(model=model, optimizer=opt)
    if state.restore():
        print(f"resumed from step {job.step}", flush=True)
    gate = Path(args.gate)
    while job.step < args.steps:
        loss = model(torch.randn(2, 4096)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        gq.step(loss=loss)
        while job.step >= 2 and not gate.exists() and job.suspend_requested is None:
            time.sleep(0.02)
    print(f"done at step {job.step}", flush=True)


if __name__ == "__main__":
    main()
