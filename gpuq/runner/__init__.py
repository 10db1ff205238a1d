"""gpuq.runner: checkpoint and suspend a PyTorch training loop at its memory minimum.

A few lines in a plain loop let gpuq suspend, resume and move the job
without losing a step::

    import gpuq.runner as gq

    job = gq.init()                        # a no-op handle outside gpuq
    state = gq.State(model=model, optimizer=opt, lr_scheduler=sched,
                     lr_scaling="adascale")  # optional: tune the batch size for goodput
    state.restore()                        # resumes from the last checkpoint, if any
    loader = gq.AdaptiveDataLoader(dataset, batch_size=128, max_batch_size=4096)
    for epoch in gq.epochs(90):
        for x, y in loader:
            loss = loss_fn(model(x), y); loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)             # the iteration boundary
        sched.step()

Outside gpuq (no ``GPUQ_JOB_ID``) nothing changes: no signal handlers, no
files, no threads, and the script trains exactly as without the runner.
Inside gpuq, a background thread keeps a control channel to the daemon
(``GPUQ_CONTROL_SOCKET``, `gpuq.runner.control`): it sends metrics every few
seconds (step time, samples/s, memory at the minimum and peak, batch size,
loss, gradient-noise statistics) and receives suspend, resume, checkpoint and
resize requests. SIGUSR1 or SIGTERM also asks for a suspend. Every request is
honoured at the next ``gq.step()``.

With ``lr_scaling`` and a loader whose ``max_batch_size`` exceeds its
``batch_size``, the loader picks the batch size and gradient-accumulation
steps that maximize goodput (Pollux: throughput x statistical efficiency,
`gpuq.runner.tuning`) and the learning rate follows the rule.

What scripts must make idempotent is in the docstrings of
`gpuq.runner.loop` (epochs) and `gpuq.runner.state` (random numbers).

Importing this package is cheap and has no side effects: torch is imported
only when a name that needs it (State, step, epochs, AdaptiveDataLoader) is
first used.

Exit status: a job that suspended in checkpoint mode exits with
`SUSPEND_EXIT_CODE`, 75 (EX_TEMPFAIL in sysexits.h: "try again later"), after
writing ``suspended.json`` next to its checkpoint. Not 143 (128 + SIGTERM, as
AdaptDL exits): a shell reports 143 for a child killed by SIGTERM, so with
``sh -c 'python train.py'`` the daemon could not tell a clean suspend from a
kill. The acknowledgement file, not the status alone, is the proof of a
suspend: it names the attempt and the checkpoint. A job that dies of CUDA
out-of-memory exits as Python does (1) after writing ``out-of-memory.json``
there (`gpuq.runner.oom`); if it was packed beside another job, the daemon
requeues it with more memory instead of failing it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpuq.control import SUSPEND_EXIT_CODE
from gpuq.runner.job import Job, RunnerError, StepInfo, SuspendMode, SuspendReport, init

if TYPE_CHECKING:
    from gpuq.runner.checkpoint import CheckpointError
    from gpuq.runner.data import AdaptiveDataLoader
    from gpuq.runner.loop import ResumeWarning, epochs, step
    from gpuq.runner.state import State

_LAZY = {
    "AdaptiveDataLoader": "gpuq.runner.data",
    "CheckpointError": "gpuq.runner.checkpoint",
    "ResumeWarning": "gpuq.runner.loop",
    "State": "gpuq.runner.state",
    "epochs": "gpuq.runner.loop",
    "step": "gpuq.runner.loop",
}

__all__ = [
    "SUSPEND_EXIT_CODE",
    "AdaptiveDataLoader",
    "CheckpointError",
    "Job",
    "ResumeWarning",
    "RunnerError",
    "State",
    "StepInfo",
    "SuspendMode",
    "SuspendReport",
    "epochs",
    "init",
    "step",
]


def __getattr__(name: str) -> Any:
    """Import the torch-using parts on first use, so `import gpuq.runner` stays cheap."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuq.runner' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
