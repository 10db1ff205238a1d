"""Goodput-tuned batch size against a sweep of fixed ones: `python -m bench.bench_adaptive`.

Four kinds of model (bench/adaptive_tasks.py: an MLP with SGD, a CNN with
momentum, a transformer language model with embeddings and AdamW, an LSTM
with Adam), each trained on generated data until its validation loss reaches
a target. Pollux's premises are made to hold first, each by a rule that is
the same for every task:

- **The learning rate is tuned at the initial batch size M0** (`tune_lr`,
  ``--tune-lr``): each task's rate is the multiple of ``LR_GRID`` (0.25x to
  16x) with the lowest validation loss after `MIN_M0_STEPS` steps at M0,
  recorded in bench/adaptive_tasks.py. Otherwise a larger fixed batch,
  whose rule scales the rate up, wins by its rate rather than its batch,
  which no efficiency model of the batch can foresee.
- **The run is long enough for a tuner that measures before it acts**
  (`calibrate`, ``--calibrate``): the target is a share of the way back
  from the lowest validation loss M0 reaches in the budget of ``max_epochs``
  epochs to the untrained model's loss, the largest share of
  ``TARGET_SHARES`` (a tenth down to a hundredth) at which M0 needs at least
  `MIN_M0_STEPS` steps. On a task M0 learns quickly the rule comes near the
  lowest loss, the plateau of M0's learning rate, where larger batches win
  by the lower noise temperature that AdaScale's gain (r < S) gives them,
  or by when the schedule's first decay comes, not by the progress per
  sample Pollux's efficiency models: the LSTM's and the MLP's tasks were
  made harder for that (a chain of second order; features of power-law
  scales); the transformer's target still lies near its plateau
  (bench/RESULTS.md, rounds 3 and 4).

For each task, measured side by side in one run:

- fixed batch sizes M0, 2 M0, 4 M0, ... up to the task's maximum, 64 M0 for
  every task: M0 as a script without tuning runs it, the larger ones with
  the tuner pinned, so they scale the learning rate with the same rule as
  the adaptive run (see bench/adaptive_runs.py), and with ``--all-rules``
  also with every other rule that suits the optimizer (sqrt and linear for
  SGD, linear for Adam), each size counted at its best rule; a fixed size
  stops, unreached, after `GIVE_UP` times M0's time in the same repeat;
- adaptive: `gq.State(..., lr_scaling=...)` with ``max_batch_size`` = 64 M0,
  with the rule gpuq.runner recommends for the optimizer (AdaScale for SGD,
  the square root for Adam).

The figure is training time to the target: this thread's CPU time, with
validation left out. Time rather than samples because goodput is progress
per second: counted in samples, the initial batch size always wins (a
larger batch never makes more progress per sample), and the point of a
larger batch is the throughput it buys. CPU time rather than wall time
because benchmark machines are shared; wall time is printed too. Each
configuration runs ``--repeats`` times (five times that for the MLP, whose
runs are short and vary much), alternating, and the medians are compared:
adaptive / best fixed (goal: at most 1) and adaptive / M0 (goal: at most
1.05). Repeat r trains every configuration from seed r (the model's initial
weights and the order of the data), so each median is over as many
trajectories as runs: from one seed, a fixed size's runs differ by timing
alone and are one trajectory, adaptive's differ by its decisions too, and the
best of seven sizes' single trajectories is the luckiest of them
(``--same-seed`` runs every repeat from seed 0, as rounds 1 to 6 of
bench/RESULTS.md did).

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
from bench.adaptive_runs import (
    Outcome,
    decisions_see_noise_times,
    initial_loss,
    measuring,
    pinned,
    train,
)
from bench.adaptive_tasks import TASKS, Samples, Task, mlp_data


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
    # Targets from `--calibrate` at the learning rates `--tune-lr` chose (adaptive_tasks.py),
    # rounded to 3 decimals: `share` of the way back from the lowest loss M0 reaches in
    # max_epochs to the untrained loss, the largest share at which M0 needs MIN_M0_STEPS
    # (the transformer: none; the smallest). The MLP's runs are short and vary much: more
    # repeats.
    "mlp": Setting(16_384, target=1.194, max_epochs=30, repeat_factor=5),
    "cnn": Setting(8_192, target=1.430, max_epochs=30),
    "transformer": Setting(4_096, target=3.625, max_epochs=30),
    "lstm": Setting(16_384, target=2.326, max_epochs=10),
}


EVALUATIONS_PER_EPOCH = 32
"""Validations per pass over the training data (the time of the crossing is interpolated
between two): the best sizes reach the targets within a few epochs."""
GIVE_UP = 3.0
"""A fixed size above M0 stops, unreached, after this many times M0's training time in
the same repeat: it cannot be the best size then, and a learning rate too large for it
(linear scaling of an Adam model's) would otherwise train through the whole budget."""
TARGET_SHARES = (0.1, 0.05, 0.03, 0.02, 0.01)
"""The shares `calibrate` chooses among: the target is the chosen share of the way back from
the lowest validation loss the initial batch size reaches within the budget
(``max_epochs``) to the untrained model's loss."""
CALIBRATION_STEPS = 32
"""M0's steps between two validations in `calibrate`."""
MIN_M0_STEPS = 1_000
"""`calibrate` takes the largest share at which the initial batch size needs at least
this many steps to the target: a run long enough that a tuner which measures the noise
before it acts (16 steps) and times each size before the next (about 5 steps a doubling)
can pay for that."""


def calibrate(name: str) -> dict[str, object]:
    """The target loss by the stated rule: the initial batch size trained through the budget.

    M0 (at the task's learning rate, `tune_lr`) trains for ``max_epochs`` epochs,
    its learning rate decaying by ``lr_decay`` an epoch; the target is the share
    of `TARGET_SHARES` of the way back from the lowest loss to the untrained
    one, the largest share at which M0 needs `MIN_M0_STEPS` steps (the
    smallest share if none is that far). Reported with M0's steps to each share.
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
        eval_every=CALIBRATION_STEPS * task.init_batch,
        max_samples=setting.samples * setting.max_epochs,
    )
    start, lowest = initial_loss(task, validation), min(run.losses)
    every = CALIBRATION_STEPS * task.init_batch
    steps = {  # M0's steps to the target of each share
        share: next(
            (i + 1) * every // task.init_batch
            for i, loss in enumerate(run.losses)
            if loss <= lowest + share * (start - lowest)
        )
        for share in TARGET_SHARES
    }
    long_enough = [share for share, n in steps.items() if n >= MIN_M0_STEPS]
    share = max(long_enough) if long_enough else min(TARGET_SHARES)
    return {
        "untrained": start,
        "lowest": lowest,
        "m0_steps_by_share": steps,
        "share": share,
        "target": round(lowest + share * (start - lowest), 3),
    }


LR_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
"""Multiples of a task's learning rate tried at the initial batch size (`tune_lr`)."""


def tune_lr(name: str) -> dict[str, object]:
    """The validation loss at each `LR_GRID` multiple of the learning rate, after M0's budget.

    Pollux presumes the learning rate is tuned at the initial batch size M0;
    a fixed larger batch with a scaled learning rate must not win by a larger
    learning rate alone. Each multiple trains at M0 for `MIN_M0_STEPS` steps
    (to the first validation at or after them), the least a run to the target
    takes (`calibrate`); the multiple with the lowest validation loss then is
    the one to adopt, and should be 1 once adopted.
    """
    task, setting = TASKS[name], SETTINGS[name]
    held_out = task.make_data(4_096, 99)
    data = task.make_data(setting.samples, 0)
    losses: dict[float, float] = {}
    for factor in LR_GRID:
        run = train(
            task,
            data,
            (held_out.x, held_out.y),
            batch=task.init_batch,
            target=-math.inf,
            eval_every=MIN_M0_STEPS * task.init_batch,  # once, at the end
            max_samples=MIN_M0_STEPS * task.init_batch,
            lr_factor=factor,
        )
        losses[factor] = round(run.loss, 4) if math.isfinite(run.loss) else math.inf
        print(f"{name} lr x {factor:g}: loss {losses[factor]} after {run.steps} steps", flush=True)
    return {"losses": losses, "best": min(losses, key=lambda factor: losses[factor])}


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


def to_target(
    task: Task,
    data: Samples,
    held_out: Samples,
    *,
    batch: int | None,
    rule: str | None = None,
    max_seconds: float = math.inf,
    seed: int = 0,
) -> Outcome:
    """One run of `task` to its target, validated and bounded as every run of the bench is.

    `batch` None is the adaptive run; the rest is `bench.adaptive_runs.train`'s.
    """
    setting = SETTINGS[task.name]
    return train(
        task,
        data,
        (held_out.x, held_out.y),
        batch=batch,
        target=setting.target,
        eval_every=setting.samples // EVALUATIONS_PER_EPOCH,
        max_samples=setting.samples * setting.max_epochs,
        rule=rule,
        max_seconds=max_seconds,
        seed=seed,
    )


def run_task(
    name: str,
    repeats: int,
    show: bool,
    all_rules: bool = False,
    noise_factor: float = 1.0,
    same_seed: bool = False,
) -> dict[str, object]:
    """Every configuration of one task, `repeats` times each in alternation, and the ratios.

    Repeat r runs from seed r, or every one from seed 0 with `same_seed`. With
    `noise_factor`, the adaptive run's decisions see the noise scale that many
    times the measured one (`decisions_see_noise_times`: a diagnosis).
    """
    task, setting = TASKS[name], SETTINGS[name]
    data = task.make_data(setting.samples, 0)
    held_out = task.make_data(4_096, 99)
    runs: list[Outcome] = []
    for repeat in range(repeats * setting.repeat_factor):
        limit = math.inf  # GIVE_UP x the initial batch size's time, once that is known
        for batch, rule in configurations(task, all_rules):
            fixed_above_m0 = batch is not None and batch > task.init_batch
            context: contextlib.AbstractContextManager[None]
            if fixed_above_m0:
                context = pinned()
            elif batch is None:
                context = decisions_see_noise_times(noise_factor)
            else:
                context = contextlib.nullcontext()
            with context:
                run = to_target(
                    task,
                    data,
                    held_out,
                    batch=batch,
                    rule=rule,
                    max_seconds=limit if fixed_above_m0 else math.inf,
                    seed=0 if same_seed else repeat,
                )
            if batch == task.init_batch and run.reached:
                limit = GIVE_UP * run.seconds
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
        "implied_noise_scales": implied_noise_scales(name, runs),
        "runs": [asdict(r) for r in runs],
    }


IMPLIED_ABOVE_TARGET = (0.3, 0.2, 0.1, 0.05, 0.02, 0.0)
"""Validation losses (this much above a task's target) at which `implied_noise_scales` looks."""


def implied_noise_scales(name: str, runs: list[Outcome]) -> dict[float, dict[int, float]]:
    """The noise scale each fixed size's samples imply, at losses from above the target down to it.

    Pollux's efficiency of a batch of M samples against M0 is (phi + M0) / (phi + M), and
    it is the ratio of the samples the two need to a loss: so samples(M0) / samples(M) =
    e gives phi = (M0 - e M) / (e - 1), infinite where e >= 1 (no cost in samples). Taken
    at the first validation at or below each loss, the median over a size's runs with the
    task's own rule that reach it (one trajectory a seed); what the tuner measures can be
    set beside it (bench/RESULTS.md).
    """
    task, target = TASKS[name], SETTINGS[name].target
    own: dict[int, list[Outcome]] = {}
    for run in runs:
        if run.batch is not None and not run.rule:
            own.setdefault(run.batch, []).append(run)
    m0 = task.init_batch
    implied: dict[float, dict[int, float]] = {}
    for above in IMPLIED_ABOVE_TARGET:
        loss = target + above
        samples = {batch: _samples_to(loss, group) for batch, group in own.items()}
        if not samples.get(m0):
            continue
        row = {}
        for batch, needed in sorted(samples.items()):
            if batch > m0 and needed:
                ratio = samples[m0] / needed
                row[batch] = (m0 - ratio * batch) / (ratio - 1) if ratio < 1 else math.inf
        implied[round(loss, 4)] = row
    return implied


def _samples_to(loss: float, runs: list[Outcome]) -> float:
    """The median, over the `runs` that reach `loss`, of the samples they needed; 0 if none do."""
    needed = [
        next(
            (n for n, value in zip(run.sample_counts, run.losses, strict=True) if value <= loss), 0
        )
        for run in runs
    ]
    reached = [n for n in needed if n]
    return statistics.median(reached) if reached else 0


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
        "--noise-factor",
        type=float,
        default=1.0,
        help="a diagnosis: the adaptive run decides as if the noise scale were this many "
        "times the measured one (the LR gain and progress still use the measured one)",
    )
    parser.add_argument(
        "--measure-share",
        type=float,
        default=None,
        help="a diagnosis: the share of the time noise measurements may take (gpuq: 0.02), "
        "in every run",
    )
    parser.add_argument(
        "--measure-every",
        type=int,
        default=None,
        help="a diagnosis: at least one noise measurement in this many steps (gpuq: 32)",
    )
    parser.add_argument(
        "--same-seed",
        action="store_true",
        help="run every repeat from seed 0 (weights and data order), not repeat r from seed r",
    )
    parser.add_argument(
        "--implied",
        action="store_true",
        help="also print the noise scale each fixed size's samples imply, by loss",
    )
    parser.add_argument(
        "--calibrate", action="store_true", help="print each task's target by the rule, and stop"
    )
    parser.add_argument(
        "--tune-lr", action="store_true", help="print each task's learning-rate grid, and stop"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.tune_lr:
        for name in [name for name in args.tasks.split(",") if name]:
            print(name, tune_lr(name), flush=True)
        return 0
    if args.calibrate:
        for name in [name for name in args.tasks.split(",") if name]:
            print(name, calibrate(name), flush=True)
        return 0
    names = [name for name in args.tasks.split(",") if name]
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        parser.error(f"unknown tasks {unknown}; known: {', '.join(TASKS)}")
    with measuring(args.measure_share, args.measure_every):
        results = [
            run_task(
                name,
                args.repeats,
                not args.json,
                args.all_rules,
                args.noise_factor,
                args.same_seed,
            )
            for name in names
        ]
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
        if args.implied:
            print(_implied(result))
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


def _implied(result: dict[str, object]) -> str:
    implied = result["implied_noise_scales"]
    assert isinstance(implied, dict)
    lines = [f"{result['task']}: noise scale implied by the fixed sizes' samples, by loss"]
    for loss, row in implied.items():
        sizes = "  ".join(f"{batch}: {phi:.0f}" for batch, phi in row.items())
        lines.append(f"  loss {loss:.3f}: {sizes}")
    return "\n".join(lines)


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
        f"{run.task:11s} {run.label:11s} seed {run.seed:<3d}"
        f"{run.seconds:6.2f} s CPU ({run.wall_seconds:6.2f} s wall)"
        f"  {reached}: loss {run.loss:.4f} after {run.samples} samples, {run.steps} steps; "
        f"batches {sorted(set(run.batches))}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
