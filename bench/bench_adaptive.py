"""Goodput-tuned batch size against a sweep of fixed ones: `python -m bench.bench_adaptive`.

Four kinds of model (bench/adaptive_tasks.py: an MLP with SGD, a CNN with
momentum, a transformer language model with embeddings and AdamW, an LSTM
with Adam), each trained on generated data until its validation loss reaches
a target set by one rule for every task (`calibrate`, ``--calibrate``):
nine tenths of the way from the untrained model's loss to the lowest the
initial batch size reaches in the budget of ``max_epochs`` epochs. Not the
loss the initial batch size levels off at: there, larger batches win by the
lower noise temperature that AdaScale's gain (r < S) gives them, which is
not the progress per sample Pollux's efficiency models. For each task,
measured side by side in one run:

- fixed batch sizes M0, 2 M0, 4 M0, ... up to the task's maximum, 64 M0 for
  every task: M0 as a script without tuning runs it, the larger ones with
  the tuner pinned, so they scale the learning rate with the same rule as
  the adaptive run (see bench/adaptive_runs.py), and with ``--all-rules``
  also with every other rule that suits the optimizer (sqrt and linear for
  SGD, linear for Adam), each size counted at its best rule;
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
import math
import statistics
import sys
from dataclasses import asdict, dataclass

import torch

from bench.adaptive_overhead import hook_cost, step_overhead
from bench.adaptive_runs import Outcome, initial_loss, pinned, train
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
    # Targets from `--calibrate` (`calibrate`: nine tenths of the improvement the initial
    # batch size makes in max_epochs), rounded to 3 decimals. The MLP's runs take a
    # fraction of a second and vary much: more repeats.
    "mlp": Setting(samples=16_384, target=1.183, max_epochs=30, repeat_factor=5),
    "cnn": Setting(samples=8_192, target=1.412, max_epochs=30),
    "transformer": Setting(samples=4_096, target=3.929, max_epochs=30),
    "lstm": Setting(samples=4_096, target=2.162, max_epochs=30),
}


EVALUATIONS_PER_EPOCH = 32
"""Validations per pass over the training data: the rule's targets are reached within
one to three epochs at the best sizes, and the crossing is interpolated between two."""
TARGET_SHARE = 0.1
"""The target is this share of the way back from the lowest validation loss the initial batch
size reaches within the budget (``max_epochs``) to the untrained model's loss (`calibrate`)."""


def calibrate(name: str) -> dict[str, float]:
    """The target loss by the stated rule: the initial batch size trained through the budget.

    Nine tenths of the improvement the initial batch size makes in ``max_epochs``
    epochs (its learning rate decays by ``lr_decay`` an epoch, so it levels off well
    before the end): a loss every size of the sweep reaches while it is still
    improving, not the plateau of one learning rate, where a larger batch's lower
    noise temperature (AdaScale's gain r < S) decides rather than its progress.
    """
    task, setting = TASKS[name], SETTINGS[name]
    held_out = task.make_data(4_096, 99)
    validation = (held_out.x, held_out.y)
    run = train(
        task,
        task.make_data(setting.samples, 0),
        validation,
        batch=task.init_batch,
        target=-math.inf,
        eval_every=setting.samples // EVALUATIONS_PER_EPOCH,
        max_samples=setting.samples * setting.max_epochs,
    )
    start, lowest = initial_loss(task, validation), min(run.losses)
    target = lowest + TARGET_SHARE * (start - lowest)
    return {"untrained": start, "lowest": lowest, "target": round(target, 3)}


def sweep(task: Task) -> list[int | None]:
    """The batch sizes run: M0, 2 M0, 4 M0, ... up to the maximum, then None (adaptive)."""
    sizes: list[int | None] = []
    size = task.init_batch
    while size <= task.max_batch:
        sizes.append(size)
        size *= 2
    return [*sizes, None]


def configurations(task: Task, all_rules: bool) -> list[tuple[int | None, str | None]]:
    """(batch size, scaling rule) of each run: the sweep with the task's rule, or every rule.

    With `all_rules` each fixed size above M0 runs with every rule that suits
    its optimizer (AdaScale only for SGD: its gain assumes SGD's update), so
    that each fixed size is compared at its best rule, not only at the one the
    adaptive run uses.
    """
    rules: list[str | None] = [None]
    if all_rules:
        rules += [rule for rule in ("sqrt", "linear") if rule != task.lr_scaling]
    runs: list[tuple[int | None, str | None]] = []
    for batch in sweep(task):
        above_m0 = batch is not None and batch > task.init_batch
        runs += [(batch, rule) for rule in rules] if above_m0 else [(batch, None)]
    return runs


def run_task(name: str, repeats: int, show: bool, all_rules: bool = False) -> dict[str, object]:
    """Every configuration of one task, `repeats` times each in alternation, and the ratios."""
    task, setting = TASKS[name], SETTINGS[name]
    data = task.make_data(setting.samples, 0)
    held_out = task.make_data(4_096, 99)
    runs: list[Outcome] = []
    for _ in range(repeats * setting.repeat_factor):
        for batch, rule in configurations(task, all_rules):
            fixed_above_m0 = batch is not None and batch > task.init_batch
            with pinned() if fixed_above_m0 else contextlib.nullcontext():
                run = train(
                    task,
                    data,
                    (held_out.x, held_out.y),
                    batch=batch,
                    target=setting.target,
                    eval_every=setting.samples // EVALUATIONS_PER_EPOCH,
                    max_samples=setting.samples * setting.max_epochs,
                    rule=rule,
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
    parser.add_argument(
        "--all-rules",
        action="store_true",
        help="run each fixed size above M0 with every learning-rate scaling rule",
    )
    parser.add_argument(
        "--calibrate", action="store_true", help="print each task's target by the rule, and stop"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.calibrate:
        for name in [name for name in args.tasks.split(",") if name]:
            print(name, calibrate(name), flush=True)
        return 0
    names = [name for name in args.tasks.split(",") if name]
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        parser.error(f"unknown tasks {unknown}; known: {', '.join(TASKS)}")
    results = [run_task(name, args.repeats, not args.json, args.all_rules) for name in names]
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
