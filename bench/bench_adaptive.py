"""Goodput-tuned batch size against the initial one: `python -m bench.bench_adaptive`.

The task is a small CPU classification job where a step's fixed cost (Python,
autograd, the optimizer: a few hundred microseconds) dwarfs the cost per
sample, so larger batches train many more samples per second, and where the
labels are noisy (drawn from a random teacher's softmax), so larger batches
lose little statistical efficiency. A 32-64-10 MLP learns 65,536 samples with
SGD (momentum 0.9, learning rate 0.02 decayed by 0.85 each epoch) from an
initial batch of 16; the validation loss on 4,096 held-out samples is
measured after each epoch, and a run stops at the target loss.

Two figures, each measured side by side in one run:

1. Wall time to reach the target validation loss: the same script with a
   fixed batch of 16 (``gq.State(...)``), then adaptive
   (``gq.State(..., lr_scaling="adascale")``, ``max_batch_size=512``: 32x,
   as far as Pollux trusts LR scaling rules), in alternation, ``--repeats``
   times each; the medians and their ratio. Adaptive runs measure their own
   step times, so their decisions, and times, vary from run to run.
2. The runner's overhead per step with goodput on, at batch 16 (a first
   epoch always runs at the initial batch size, so both do identical work):
   two identical models train in lockstep in one process, one through a
   fixed loader and one through an adaptive one, alternating step by step;
   each step is timed on this thread's CPU clock and the ratio of the median
   step times is the overhead (see `step_overhead`). Then the per-step hooks
   alone, in a tight loop of ``optimizer.step()`` with and without them,
   against the same step time. Then the lockstep measurement again with a
   wider hidden layer (``--wide-hidden``), whose steps take longer.

Everything goes to stdout; ``--json`` prints one JSON object instead of text.
No files are written.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

import gpuq.runner as gq

FEATURES, CLASSES, HIDDEN = 32, 10, 64
INIT_BATCH, MAX_BATCH = 16, 512  # at most 32x: where LR scaling rules hold (Pollux)


class Samples(torch.utils.data.Dataset[Any]):
    """Tensors fetched a whole batch at a time (``__getitems__``), as a fast loader would."""

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


def make_task(samples: int, seed: int) -> tuple[Samples, tuple[torch.Tensor, torch.Tensor]]:
    """Training samples and a validation set, labelled by a random linear teacher's softmax."""
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator) * 0.5

    def draw(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(count, FEATURES, generator=generator)
        probabilities = torch.softmax(x @ teacher, dim=1)
        return x, torch.multinomial(probabilities, 1, generator=generator).squeeze(1)

    return Samples(*draw(samples)), draw(4096)


@dataclass
class Outcome:
    """One training run to the target loss."""

    adaptive: bool
    seconds: float
    cpu_seconds: float
    """This thread's CPU time: less disturbed than wall time by other processes."""
    reached: bool
    samples: int
    steps: int
    epochs: int
    final_batch: int
    loss: float


def train(
    adaptive: bool,
    task: tuple[Samples, tuple[torch.Tensor, torch.Tensor]],
    *,
    lr: float,
    lr_decay: float,
    target: float,
    max_epochs: int,
    max_seconds: float = float("inf"),
    hidden: int = HIDDEN,
) -> Outcome:
    """Train until the validation loss, measured after each epoch, reaches `target`."""
    gq.init(environ={}).close()
    torch.manual_seed(0)
    data, (val_x, val_y) = task
    model = _mlp(hidden)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=lr_decay)
    job = gq.init(environ={})
    gq.State(model=model, optimizer=opt, lr_scaling="adascale" if adaptive else None)
    loader = gq.AdaptiveDataLoader(
        data, batch_size=INIT_BATCH, max_batch_size=MAX_BATCH, collate_fn=keep
    )
    loss_fn = nn.CrossEntropyLoss()
    seen, loss = 0, float("inf")
    start, cpu_start = time.perf_counter(), time.thread_time()
    try:
        for _ in gq.epochs(max_epochs):
            for x, y in loader:
                loss_fn(model(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                gq.step()
                seen += len(x)
            sched.step()
            with torch.no_grad():
                loss = float(loss_fn(model(val_x), val_y))
            if loss <= target or time.perf_counter() - start > max_seconds:
                break
        seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu_start
        batch = loader.batch_size * (loader.accumulation_steps + 1)
        reached = loss <= target
        return Outcome(adaptive, seconds, cpu, reached, seen, job.step, job.epoch + 1, batch, loss)
    finally:
        job.close()


def step_overhead(
    task: tuple[Samples, Any], rounds: int, hidden: int = HIDDEN, steps: int = 1000
) -> dict[str, float]:
    """CPU seconds per training step at batch 16, goodput off and on, measured in lockstep.

    Two identical models train side by side in one job, one with a fixed
    loader and one with an adaptive one, alternating step by step (the order
    flips every step), for `rounds` passes of `steps` steps each: each step is
    timed on this thread's CPU clock, so a burst of load from other processes
    hits both alike. Both stay at batch 16 (a first epoch always does), so the
    difference of the medians is the runner's whole per-step cost of goodput:
    noise-scale and learning-rate hooks, step timing, loader bookkeeping.
    """
    data, _ = task
    times: dict[bool, list[int]] = {False: [], True: []}
    for _ in range(rounds):
        gq.init(environ={}).close()
        job = gq.init(environ={})
        torch.manual_seed(0)
        models = [_mlp(hidden), _mlp(hidden)]
        loss_fn = nn.CrossEntropyLoss()
        runs = []
        for adaptive, model in zip((False, True), models, strict=True):
            opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
            gq.State(model=model, optimizer=opt, lr_scaling="adascale" if adaptive else None)
            loader = gq.AdaptiveDataLoader(
                data, batch_size=INIT_BATCH, max_batch_size=MAX_BATCH, collate_fn=keep
            )
            batches = iter(loader)
            first = next(batches)  # decides now, while this State is the job's
            runs.append((adaptive, model, opt, itertools.chain([first], batches)))
        try:
            for step in range(steps):
                for adaptive, model, opt, batches in runs if step % 2 else runs[::-1]:
                    start = time.thread_time_ns()
                    x, y = next(batches)
                    loss_fn(model(x), y).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    gq.step()
                    times[adaptive].append(time.thread_time_ns() - start)
        finally:
            job.close()
    off, on = (statistics.median(times[flag]) / 1e9 for flag in (False, True))
    return {"step_seconds_off": off, "step_seconds_on": on, "overhead": on / off - 1}


def _mlp(hidden: int = HIDDEN) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))


def hook_cost(task: tuple[Samples, Any], rounds: int = 40, steps: int = 500) -> float:
    """CPU seconds per step that goodput's per-step work adds to an optimizer step.

    The same ``optimizer.step()`` on the same gradients, with the tuner's hooks
    (announced as the loader does it) and without, alternating in rounds of
    `steps`: a tight loop, so far less noisy than whole epochs. The difference
    of the medians is the cost of the hooks, the noise measurement included.
    """
    gq.init(environ={}).close()
    data, _ = task
    models = [_mlp(), _mlp()]
    plain, tuned = (torch.optim.SGD(m.parameters(), lr=0.0, momentum=0.9) for m in models)
    x, y = data.__getitems__(list(range(INIT_BATCH)))
    loss_fn = nn.CrossEntropyLoss()
    for model in models:
        loss_fn(model(x), y).backward()
    job = gq.init(environ={})
    gq.State(model=models[1], optimizer=tuned, lr_scaling="adascale")
    loader = gq.AdaptiveDataLoader(data, batch_size=INIT_BATCH, max_batch_size=MAX_BATCH)
    tuner = loader.tuner if loader.adaptive else None
    if tuner is None:
        raise RuntimeError("the loader should be adaptive")
    times: dict[bool, list[float]] = {False: [], True: []}
    announce, target = tuner.gns.micro_batch, tuner.epoch_target(10**9, len(data))
    try:
        for _ in range(rounds):
            start = time.thread_time()
            for _ in range(steps):
                plain.step()
            times[False].append((time.thread_time() - start) / steps)
            start = time.thread_time()
            for _ in range(steps):  # what the adaptive loader and the hooks do for a step
                if tuner.progress >= target:
                    break
                announce(INIT_BATCH, True)
                tuned.step()
                tuner.step_ended()
            times[True].append((time.thread_time() - start) / steps)
    finally:
        job.close()
    return statistics.median(times[True]) - statistics.median(times[False])


def main(argv: list[str] | None = None) -> int:
    """Run both measurements and print them."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--samples", type=int, default=65_536)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--lr-decay", type=float, default=0.85, help="per epoch (StepLR)")
    parser.add_argument("--target", type=float, default=1.14, help="validation loss to reach")
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--overhead-rounds", type=int, default=4)
    parser.add_argument(
        "--wide-hidden", type=int, default=4096, help="hidden units of the wider model"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    task = make_task(args.samples, seed=0)
    runs: list[Outcome] = []
    for _ in range(args.repeats):
        for adaptive in (False, True):
            run = train(
                adaptive,
                task,
                lr=args.lr,
                lr_decay=args.lr_decay,
                target=args.target,
                max_epochs=args.max_epochs,
                max_seconds=args.max_seconds,
            )
            runs.append(run)
            if not args.json:
                print(_describe(run), flush=True)
    fixed_seconds = statistics.median(r.seconds for r in runs if not r.adaptive)
    adaptive_seconds = statistics.median(r.seconds for r in runs if r.adaptive)
    small = make_task(16_384, seed=1)  # short epochs, many alternations
    overhead = step_overhead(small, args.overhead_rounds)
    wider = step_overhead(small, args.overhead_rounds, hidden=args.wide_hidden)
    overhead["hook_seconds"] = hook_cost(task)
    overhead["hook_share"] = overhead["hook_seconds"] / overhead["step_seconds_off"]
    reached = all(r.reached for r in runs)
    if args.json:
        result = {
            "target_loss": args.target,
            "fixed_seconds": fixed_seconds,
            "adaptive_seconds": adaptive_seconds,
            "speedup": fixed_seconds / adaptive_seconds,
            "all_reached": reached,
            "runs": [asdict(r) for r in runs],
            **overhead,
            "wide": wider,
        }
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(
        f"time to loss {args.target}: fixed batch {INIT_BATCH} {fixed_seconds:.1f} s, adaptive "
        f"{adaptive_seconds:.1f} s (medians): {fixed_seconds / adaptive_seconds:.2f}x faster "
        f"({'every run reached it' if reached else 'NOT every run reached it'})"
    )
    off, on = overhead["step_seconds_off"] * 1e3, overhead["step_seconds_on"] * 1e3
    print(
        f"CPU time per step at batch {INIT_BATCH}, lockstep medians: goodput off "
        f"{off:.3f} ms, on {on:.3f} ms: overhead {overhead['overhead']:+.1%} (target < 5%)"
    )
    hook = overhead["hook_seconds"] * 1e6
    print(
        f"goodput's per-step hooks alone: {hook:.1f} us a step, "
        f"{overhead['hook_share']:.1%} of the step off (target < 5%)"
    )
    off, on = wider["step_seconds_off"] * 1e3, wider["step_seconds_on"] * 1e3
    print(
        f"the same with {args.wide_hidden} hidden units: goodput off {off:.3f} ms, "
        f"on {on:.3f} ms: overhead {wider['overhead']:+.1%}"
    )
    return 0


def _describe(run: Outcome) -> str:
    kind = "adaptive" if run.adaptive else "fixed   "
    reached = "reached" if run.reached else "NOT reached"
    return (
        f"{kind} {run.seconds:6.1f} s  {reached}: loss {run.loss:.4f} after {run.epochs} epochs, "
        f"{run.samples} samples, {run.steps} steps; final batch {run.final_batch}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
