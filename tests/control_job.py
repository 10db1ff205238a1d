"""A tiny gpuq.runner training job for the control-channel tests.

A two-layer network on generated data, written the way the runner wants it
(`gq.State`, `gq.AdaptiveDataLoader`, `gq.step()` last in each iteration),
with deterministic ops so that a run suspended and resumed any number of
times ends with the same parameters, bit for bit, as an uninterrupted one.
`--step-delay` makes each iteration last long enough for a test to act
while the job runs; sleeping changes nothing in what is computed. With
`--out`, the final model and optimizer state are saved there.

`--gate STEP=PATH` holds the job back without stopping its turns: from step
STEP on, after each step it waits until PATH exists, unless the daemon asks
it to suspend, when it takes one more step and suspends at that boundary. A
test thus keeps jobs from running out of work before others have started,
whatever the machine's load; waiting changes nothing in what is computed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import TensorDataset

import gpuq.runner as gq


def main() -> None:
    """Train, report the step in the output, save the final state if asked."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--out")
    parser.add_argument("--gate", action="append", default=[], metavar="STEP=PATH")
    args = parser.parse_args()
    gates = [(int(step), Path(path)) for step, path in (g.split("=", 1) for g in args.gate)]
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    job = gq.init()
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(args.samples, 8, generator=generator)
    labels = (points.sum(dim=1) > 0).long()
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = gq.State(model=model, optimizer=opt)
    if state.restore():
        print(f"resumed from step {job.step}", flush=True)
    loader = gq.AdaptiveDataLoader(TensorDataset(points, labels), batch_size=args.batch_size)
    loss_fn = nn.CrossEntropyLoss()
    for _epoch in gq.epochs(args.epochs):
        model.train()
        for x, y in loader:
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            time.sleep(args.step_delay)
            gq.step(loss=loss)
            hold(job, [path for step, path in gates if job.step >= step])
    print(f"done at step {job.step}", flush=True)
    if args.out:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, args.out)


def hold(job: gq.Job, gates: list[Path]) -> None:
    """Wait until every gate's file exists, or until the daemon asks for a suspend."""
    while job.suspend_requested is None and not all(path.exists() for path in gates):
        time.sleep(0.02)


if __name__ == "__main__":
    main()
