"""How much of a gradient persists from step to step: `python -m bench.bench_gradient_lags`.

Pollux's efficiency of a batch of M samples, (phi + M0) / (phi + M) with the
noise scale phi = tr(Sigma) / |G|^2, presumes that the gradient's mean G is
progress: that M0's next M / M0 steps would follow about the same G, so
that one step of M samples can replace them. This bench measures how far
that holds on the tasks of bench/adaptive_tasks.py. Each task trains at its
initial batch size M0 as its fixed M0 run does (its optimizer, learning rate
and per-epoch decay), every step's gradient computed in two halves, and
reports over each quarter of `--steps`:

- tr(Sigma) per sample and |G|^2 from the halves (the unbiased estimates
  gpuq.runner's noise measurement makes, here at every step), and the noise
  scale phi they give;
- the mean product g_t . g_{t+k} of the gradients of steps k apart, for
  k = 1, 2, 4, ..., 32: independent samples, so an unbiased estimate of
  G_t . G_{t+k}, the part of the gradient that persists k steps. A negative
  product at k = 1 is plain SGD bouncing across its steepest directions at
  the edge of stability; a dip at larger k is momentum's overshoot. On all
  four tasks it is near zero by k = 4 to 8, so persistence alone does not
  tell which tasks Pollux's efficiency fits (bench/RESULTS.md, round 5).

Then, with ``--pinned SIZES``, each size trains pinned (the tuner on,
AdaScale's or the task's rule, never changing the batch) to the task's
target, and the noise scale the tuner measured is printed along the run:
what a decision at that size would see.

Everything goes to stdout; nothing is written.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

import gpuq.runner.tuning
from bench.adaptive_runs import pinned
from bench.adaptive_tasks import TASKS, Task
from bench.bench_adaptive import SETTINGS, to_target

LAGS = (1, 2, 4, 8, 16, 32)
"""Steps apart at which gradient products are averaged."""


def lags(task: Task, steps: int) -> list[dict[str, float]]:
    """Train `steps` steps at M0 with every gradient in halves; statistics per quarter."""
    setting = SETTINGS[task.name]
    torch.manual_seed(0)
    data = task.make_data(setting.samples, 0)
    model = task.make_model()
    optimizer = task.optimizer(model)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=task.lr_decay)
    params = list(model.parameters())
    half = task.init_batch // 2
    order = torch.Generator().manual_seed(0)
    grads: list[torch.Tensor] = []
    sqr: list[float] = []
    var: list[float] = []
    permutation, position = torch.randperm(len(data), generator=order), 0
    for _ in range(steps):
        if position + task.init_batch > len(data):
            permutation, position = torch.randperm(len(data), generator=order), 0
            schedule.step()
        index = permutation[position : position + task.init_batch]
        position += task.init_batch
        halves = []
        for part in (index[:half], index[half:]):
            optimizer.zero_grad(set_to_none=True)
            torch.autograd.backward(task.loss(model, (data.x[part], data.y[part])))
            halves.append(torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None]))
        first, second = halves
        sqr.append(float(first @ second))  # E = |G|^2: the halves are independent
        var.append(float((first - second).square().sum()) * half / 2)  # tr(Sigma) per sample
        mean = (first + second) / 2
        grads.append(mean)
        offset = 0
        for p in params:
            if p.grad is not None:
                p.grad.copy_(mean[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
        optimizer.step()
    stacked = torch.stack(grads)
    rows = []
    quarter = steps // 4
    for start in range(0, 4 * quarter, quarter):
        stop = start + quarter
        row = {
            "from": float(start),
            "to": float(stop),
            "tr_sigma": statistics.fmean(var[start:stop]),
            "g_sqr": statistics.fmean(sqr[start:stop]),
        }
        for k in LAGS:
            if stop - k > start:
                products = (stacked[start : stop - k] * stacked[start + k : stop]).sum(dim=1)
                row[f"lag{k}"] = float(products.mean())
        rows.append(row)
    return rows


def measured_noise_scales(task: Task, size: int) -> tuple[bool, list[float]]:
    """A pinned run at `size` to the target: the noise scale the tuner measured, every 20 steps."""
    seen: list[float] = []
    tuner = gpuq.runner.tuning.BatchTuner
    before_step = tuner._before_step

    def watch(self: gpuq.runner.tuning.BatchTuner, optimizer: Any, args: Any, kwargs: Any) -> None:
        before_step(self, optimizer, args, kwargs)
        estimate = self.gns.estimate()
        if self.steps % 20 == 0 and estimate is not None and estimate.sqr > 0:
            seen.append(estimate.var * self.init_batch_size / estimate.sqr)

    tuner._before_step = watch  # type: ignore[method-assign]
    try:
        with pinned():
            data = task.make_data(SETTINGS[task.name].samples, 0)
            run = to_target(task, data, task.make_data(4_096, 99), batch=size)
    finally:
        tuner._before_step = before_step  # type: ignore[method-assign]
    return run.reached, seen


def main(argv: list[str] | None = None) -> int:
    """Print the lag table of each task, and the pinned runs' measured noise scales."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task names")
    parser.add_argument("--steps", type=int, default=1_100, help="steps at M0 (4 quarters)")
    parser.add_argument("--pinned", default="", help="comma-separated batch sizes to run pinned")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = [name for name in args.tasks.split(",") if name]
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        parser.error(f"unknown tasks {unknown}; known: {', '.join(TASKS)}")
    for name in names:
        task = TASKS[name]
        print(f"{name} at M0 = {task.init_batch}: gradient products k steps apart")
        for row in lags(task, args.steps):
            phi = row["tr_sigma"] / row["g_sqr"] if row["g_sqr"] > 0 else float("inf")
            products = "  ".join(f"k={k}: {row[f'lag{k}']:+.3g}" for k in LAGS if f"lag{k}" in row)
            print(
                f"  steps {row['from']:.0f}-{row['to']:.0f}: tr(Sigma) {row['tr_sigma']:.3g}, "
                f"|G|^2 {row['g_sqr']:.3g} (phi {phi:.0f});  {products}",
                flush=True,
            )
        for size in [int(s) for s in args.pinned.split(",") if s]:
            reached, seen = measured_noise_scales(task, size)
            shown = ", ".join(f"{phi:.0f}" for phi in seen[:: max(1, len(seen) // 10)])
            state = "reached" if reached else "NOT reached"
            print(f"  pinned at {size} ({state}): measured phi along the run {shown}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
