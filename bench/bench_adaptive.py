"""Goodput-tuned batch size against a sweep of fixed ones: `python -m bench.bench_adaptive`.

Four kinds of model (bench/adaptive_tasks.py: an MLP with SGD, a CNN with
momentum, a transformer language model with embeddings and AdamW, an LSTM
with Adam), each trained on generated data until its validation loss reaches
a target near the loss it levels off at, so the last stretch is where
gradient noise decides. For each, measured side by side in one run:

- fixed batch sizes M0, 2 M0, 4 M0, ... up to the task's maximum, 64 M0 for
  every task (a sweep around the best fixed size of each: it is at 4 M0 to
  32 M0 depending on the model): M0 as a script without tuning runs it, the
  larger ones with the tuner pinned, so they scale the learning rate with
  the same rule as the adaptive run (see bench/adaptive_runs.py);
- adaptive: `gq.State(..., lr_scaling=...)` with ``max_batch_size`` = 64 M0.

The figure is training time to the target: this thread's CPU time, with
validation left out. Time rather than samples because goodput is progress
per second: counted in samples, the initial batch size always wins (a
larger batch never makes more progress per sample), and the point of a
larger batch is the throughput it buys. CPU time rather than wall time
because benchmark machines are shared; wall time is printed too. Each
configuration runs ``--repeats`` times (five times that for the MLP, whose
runs are short and vary much), alternating, and the medians are compared:
adaptive / best fixed (goal: at most 1) and adaptive / M0 (goal: at most
1.05).

Then the runner's own cost per step, as before: at batch 16 two MLPs train
in lockstep, one through a fixed loader and one through an adaptive one,
timed on this thread's CPU clock (bench/adaptive_overhead.py); the per-step
hooks alone; and the lockstep measurement with a wider hidden layer.

Everything goes to stdout; ``--json`` prints one JSON object instead of text.
No files are written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from bench.adaptive_overhead import hook_cost, step_overhead
from bench.adaptive_runs import Outcome, pinned, train
from bench.adaptive_tasks import TASKS, Task, mlp_data


@dataclass(frozen=True)
class Setting:
    """How a task is benchmarked: training samples, the target loss, when to give up."""

    samples: int
    target: float
    max_epochs: int
    repeat_factor: int = 1
    """Runs per ``--repeats``: more for a task whose runs are short and whose time to
    the target varies much from run to run."""


SETTINGS = {
    # The MLP's runs take a fraction of a second, and its loss crosses the target
    # within its own noise: the same batch size takes 60 steps in one run, 130 in another.
    "mlp": Setting(samples=16_384, target=1.07, max_epochs=30, repeat_factor=5),
    "cnn": Setting(samples=8_192, target=1.33, max_epochs=30),
    "transformer": Setting(samples=4_096, target=3.60, max_epochs=30),
    "lstm": Setting(samples=4_096, target=2.022, max_epochs=30),
}


def sweep(task: Task) -> list[int | None]:
    """The batch sizes run: M0, 2 M0, 4 M0, ... up to the maximum, then None (adaptive)."""
    sizes: list[int | None] = []
    size = task.init_batch
    while size <= task.max_batch:
        sizes.append(size)
        size *= 2
    return [*sizes, None]


def run_task(name: str, repeats: int, show: bool) -> dict[str, object]:
    """Every configuration of one task, `repeats` times each in alternation, and the ratios."""
    task, setting = TASKS[name], SETTINGS[name]
    data = task.make_data(setting.samples, 0)
    held_out = task.make_data(4_096, 99)
    runs: list[Outcome] = []
    for _ in range(repeats * setting.repeat_factor):
        for batch in sweep(task):
            fixed_above_m0 = batch is not None and batch > task.init_batch
            with pinned() if fixed_above_m0 else contextlib.nullcontext():
                run = train(
                    task,
                    data,
                    (held_out.x, held_out.y),
                    batch=batch,
                    target=setting.target,
                    eval_every=setting.samples // 8,
                    max_samples=setting.samples * setting.max_epochs,
                )
            runs.append(run)
            if show:
                print(_describe(run), flush=True)
    medians = {
        label: statistics.median(r.seconds if r.reached else float("inf") for r in group)
        for label, group in _by_label(runs).items()
    }
    fixed = {label: seconds for label, seconds in medians.items() if label != "adaptive"}
    best = min(fixed, key=lambda label: fixed[label])
    initial = f"fixed {task.init_batch}"
    adaptive = medians["adaptive"]
    return {
        "task": name,
        "target_loss": setting.target,
        "median_seconds": medians,
        "best_fixed": best,
        "adaptive_over_best": adaptive / fixed[best],
        "adaptive_over_initial": adaptive / fixed[initial],
        "runs": [asdict(r) for r in runs],
    }


def _by_label(runs: list[Outcome]) -> dict[str, list[Outcome]]:
    groups: dict[str, list[Outcome]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)
    return groups


def main(argv: list[str] | None = None) -> int:
    """Run the sweeps and the overhead measurements, and print them."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task names")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--overhead-rounds", type=int, default=4)
    parser.add_argument("--no-overhead", action="store_true", help="skip the per-step costs")
    parser.add_argument(
        "--wide-hidden", type=int, default=4096, help="hidden units of the wider model"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = [name for name in args.tasks.split(",") if name]
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        parser.error(f"unknown tasks {unknown}; known: {', '.join(TASKS)}")
    results = [run_task(name, args.repeats, show=not args.json) for name in names]
    overhead: dict[str, object] = {}
    if not args.no_overhead:
        small = (mlp_data(16_384, 1), None)  # short epochs, many alternations
        lockstep = step_overhead(small, args.overhead_rounds)
        wider = step_overhead(small, args.overhead_rounds, hidden=args.wide_hidden)
        hooks = hook_cost((mlp_data(65_536, 0), None))
        overhead = lockstep | {"hook_seconds": hooks, "wide": wider}
        overhead["hook_share"] = hooks / lockstep["step_seconds_off"]
    if args.json:
        json.dump({"tasks": results, **overhead}, sys.stdout, indent=2)
        print()
        return 0
    for result in results:
        print(_summary(result))
    if overhead:
        _print_overhead(overhead, args.wide_hidden)
    return 0


def _summary(result: dict[str, object]) -> str:
    medians = result["median_seconds"]
    assert isinstance(medians, dict)
    times = ", ".join(f"{label} {seconds:.2f}" for label, seconds in medians.items())
    over_best, over_initial = result["adaptive_over_best"], result["adaptive_over_initial"]
    assert isinstance(over_best, float) and isinstance(over_initial, float)
    return (
        f"{result['task']}: CPU seconds to loss {result['target_loss']} (medians): {times}; "
        f"adaptive / best fixed ({result['best_fixed']}) {over_best:.2f} (goal <= 1), "
        f"adaptive / initial {over_initial:.2f} (goal <= 1.05)"
    )


def _print_overhead(overhead: dict[str, object], wide_hidden: int) -> None:
    values = {k: v for k, v in overhead.items() if isinstance(v, float)}
    wide = overhead["wide"]
    assert isinstance(wide, dict)
    off, on = values["step_seconds_off"] * 1e3, values["step_seconds_on"] * 1e3
    print(
        f"CPU time per step at batch 16, lockstep medians: goodput off {off:.3f} ms, "
        f"on {on:.3f} ms: overhead {values['overhead']:+.1%} (target < 5%)"
    )
    print(
        f"goodput's per-step hooks alone: {values['hook_seconds'] * 1e6:.1f} us a step, "
        f"{values['hook_share']:.1%} of the step off (target < 5%)"
    )
    off, on = wide["step_seconds_off"] * 1e3, wide["step_seconds_on"] * 1e3
    print(
        f"the same with {wide_hidden} hidden units: goodput off {off:.3f} ms, "
        f"on {on:.3f} ms: overhead {wide['overhead']:+.1%}"
    )


def _describe(run: Outcome) -> str:
    reached = "reached" if run.reached else "NOT reached"
    return (
        f"{run.task:11s} {run.label:11s} {run.seconds:6.2f} s CPU ({run.wall_seconds:6.2f} s wall)"
        f"  {reached}: loss {run.loss:.4f} after {run.samples} samples, {run.steps} steps; "
        f"batches {sorted(set(run.batches))}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
