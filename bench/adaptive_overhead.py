"""The runner's per-step cost of goodput tuning, for bench/bench_adaptive.py.

Both measurements train the MLP of bench/adaptive_tasks.py at batch 16 on
this thread's CPU clock, so a burst of load from other processes hits both
sides alike: `step_overhead` runs two identical models in lockstep, one
through a fixed loader and one through an adaptive one; `hook_cost` times
``optimizer.step()`` alone with and without the tuner's hooks.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import gpuq.runner as gq
import gpuq.runner.tuning
from bench.adaptive_runs import TrainingClock, cpu_clock
from bench.adaptive_tasks import Samples, keep, mlp

INIT_BATCH, MAX_BATCH = 16, 512
HIDDEN = 64


def step_overhead(
    task: tuple[Samples, Any], rounds: int, hidden: int = HIDDEN, steps: int = 1000
) -> dict[str, float]:
    """CPU seconds per training step at batch 16, goodput off and on, measured in lockstep.

    Two identical models train side by side in one job, one with a fixed
    loader and one with an adaptive one, alternating step by step (the order
    flips every step), for `rounds` passes of `steps` steps each: each step is
    timed on this thread's CPU clock, so a burst of load from other processes
    hits both alike. Both stay at batch 16 (the tuner decides as usual, fit
    and choice, but keeps its configuration), so the difference of the
    medians is the runner's whole per-step cost of goodput: noise-scale and
    learning-rate hooks, step timing, decisions, loader bookkeeping. The
    tuner times steps on the CPU clock, as in bench/adaptive_runs.py; its
    steps include the other model's, so it decides about twice as often as
    it would alone (an upper bound).
    """
    data, _ = task
    times: dict[bool, list[int]] = {False: [], True: []}
    with _decisions_keep_the_batch(), cpu_clock(TrainingClock()):
        for _ in range(rounds):
            _lockstep(data, hidden, steps, times)
    off, on = (statistics.median(times[flag]) / 1e9 for flag in (False, True))
    return {"step_seconds_off": off, "step_seconds_on": on, "overhead": on / off - 1}


@contextlib.contextmanager
def _decisions_keep_the_batch() -> Iterator[None]:
    """While inside, tuners decide as usual (fit, choice) and then keep their configuration."""
    choose = gpuq.runner.tuning.choose_config

    def keep_current(goodput_fn: Any, current: Any, **kwargs: Any) -> Any:
        choose(goodput_fn, current, **kwargs)
        return current

    gpuq.runner.tuning.choose_config = keep_current
    try:
        yield
    finally:
        gpuq.runner.tuning.choose_config = choose


def _lockstep(data: Samples, hidden: int, steps: int, times: dict[bool, list[int]]) -> None:
    """One round of `step_overhead`: two models, `steps` steps each, alternating."""
    gq.init(environ={}).close()
    job = gq.init(environ={})
    torch.manual_seed(0)
    models = [mlp(hidden), mlp(hidden)]
    loss_fn = nn.CrossEntropyLoss()
    runs = []
    for adaptive, model in zip((False, True), models, strict=True):
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        gq.State(model=model, optimizer=opt, lr_scaling="adascale" if adaptive else None)
        loader = gq.AdaptiveDataLoader(
            data, batch_size=INIT_BATCH, max_batch_size=MAX_BATCH, collate_fn=keep
        )
        batches = iter(loader)
        first = next(batches)  # the tuner starts now, while this State is the job's
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


def hook_cost(task: tuple[Samples, Any], rounds: int = 40, steps: int = 500) -> float:
    """CPU seconds per step that goodput's per-step work adds to an optimizer step.

    The same ``optimizer.step()`` on the same gradients, with the tuner's hooks
    (announced as the loader does it) and without, alternating in rounds of
    `steps`: a tight loop, so far less noisy than whole epochs. The difference
    of the medians is the cost of the hooks, the noise measurement included.
    """
    gq.init(environ={}).close()
    data, _ = task
    models = [mlp(), mlp()]
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
