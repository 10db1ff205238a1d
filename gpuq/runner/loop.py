"""The iteration boundary: count steps, measure memory, honour suspends.

``gq.step()`` marks the end of an iteration. There it counts the step,
records ``torch.cuda.memory_allocated()`` (after ``optimizer.step()`` and
``zero_grad(set_to_none=True)`` this is the minimum of the memory cycle,
where Gandiva suspends) and the iteration's peak (``max_memory_allocated``,
whose counter it then resets), and honours a pending suspend request:

- ``checkpoint``: save the `State` atomically, write ``suspended.json``
  ({step, epoch, bytes, seconds, mode, ...}) into the checkpoint directory
  and exit with `gpuq.runner.SUSPEND_EXIT_CODE`. All GPU memory is freed;
  the job may resume on any GPU or server.
- ``park``: copy the parameters, buffers, gradients and optimizer state of
  the State's modules and optimizers to host memory, free them on the device,
  empty the CUDA cache, wait for ``job.resume()`` or SIGCONT, and copy them
  back to the same device. The CUDA context, and any tensor the script itself
  still holds (a dataset kept on the GPU, the last batch), stay resident. If
  the device has no room left for the state at resume, the park turns into a
  checkpoint suspend. Parking swaps tensor storage, so it is for plain
  single-process loops: not with CUDA graphs or DistributedDataParallel.

``gq.epochs(n)`` yields the epoch numbers still to run: after a resume it
re-enters the interrupted epoch, and the data loader finishes that epoch.

What users must make idempotent: a resume re-runs the part of the
interrupted epoch *before* its inner loop; the part after the inner loop
runs once. Call ``gq.step()`` last in an iteration, after the optimizer step.

Right::

    for epoch in gq.epochs(90):
        model.train()                     # safe to run twice
        for x, y in loader:
            loss = loss_fn(model(x), y); loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)            # last: the state is complete here
        sched.step()                      # after the inner loop: once per epoch

Wrong::

    for epoch in gq.epochs(90):
        sched.step()                      # runs again on resume: the LR decays twice
        for x, y in loader:
            gq.step()                     # before opt.step(): a resume skips this batch
            ...

What the checkpoint does not hold starts afresh on a resume: a counter of the
script's own is 0 again where an uninterrupted run would be at the restored
step. Count with the runner's ``job.step``, or keep the value in the State
(a dict of plain values, `gpuq.runner.state`). Right::

    job = gq.init()
    ...
    for epoch in gq.epochs(90):
        for x, y in loader:
            ...
            gq.step(loss=loss)
            if job.step % 100 == 0:       # restored with the checkpoint
                log(job.step, loss)

Wrong::

    global_step = 0                       # 0 again after every resume
    for epoch in gq.epochs(90):
        for x, y in loader:
            ...
            global_step += 1

The runner warns (`ResumeWarning`, once) about the wrong form. After
`State.restore()` put back step r >= 3, it reads the int variables of the
function running ``for ... in gq.epochs(n)`` as that loop starts, and again as
it ends or as the job suspends to a checkpoint. A variable is named when it
was -1, 0 or 1 at the start and grew by exactly the steps taken since (or one
fewer at a suspend: a counter increased after ``gq.step()``), and an epoch
began at least two steps into the run. An uninterrupted run's counter would
have been near r: this one restarted. There is no false alarm on a fresh start
(nothing restored), on values derived from ``job.step`` (near r at the
start), on per-epoch batch indices (reset when the last epoch began, they grew
by at least two steps fewer), or on a run that never reached a new epoch
(where a count of one attempt's own steps looks the same). A value that
legitimately restores to 0 and then counts every step does look the same:
silence it with ``warnings.filterwarnings("ignore", category=gq.ResumeWarning)``.
The variables are read at those two moments only: Python 3.11 and 3.12 keep a
snapshot of them in the frame, which would hold the last batch alive.
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from gpuq.runner import SUSPEND_EXIT_CODE
from gpuq.runner.distributed import agree_on_suspend, suspend_all_ranks
from gpuq.runner.job import (
    ACK_FILE,
    Job,
    RunnerError,
    StepInfo,
    SuspendReport,
    current_job,
    whole_number,
    write_acknowledgement,
)
from gpuq.runner.state import State, cuda_in_use


class ResumeWarning(RuntimeWarning):
    """A resumed run looks set to differ from an uninterrupted one."""


MIN_RESTORED_STEP = 3
"""The smallest restored step at which a counter that starts again from 0 stands out."""


@dataclass
class _ResumedLoop:
    """An `epochs()` loop that started right after a restore: what its function counted."""

    job: Job
    frame: FrameType
    """The frame running ``for ... in gq.epochs(n)``; only read at its start and end."""
    start_step: int
    start_counts: dict[str, int]
    epoch_starts: list[int] = field(default_factory=list)
    """`job.step` whenever an epoch began in this loop."""

    @classmethod
    def after_restore(cls, job: Job, frame: FrameType | None) -> _ResumedLoop | None:
        """Watch this loop if it resumes training from a restored step worth checking."""
        restored = None if job.state is None else job.state.restored_step
        if frame is None or restored is None or restored < MIN_RESTORED_STEP:
            return None
        if job.step != restored:  # it has trained since the restore: not a restart
            return None
        return cls(job, frame, job.step, _integers(frame))

    def check(self, *, suspending: bool) -> None:
        """Warn once about the function's integers that counted this run's steps from 0."""
        steps = self.job.step - self.start_step
        grown = {steps, steps - 1} if suspending else {steps}
        if not any(began - self.start_step >= 2 for began in self.epoch_starts):
            return  # no epoch began two steps into the run: a per-epoch index looks the same
        now = _integers(self.frame)
        restarted = sorted(
            name
            for name, start in self.start_counts.items()
            if -1 <= start <= 1 and name in now and now[name] - start in grown
        )
        if restarted:
            function = self.frame.f_code.co_name
            where = "the script" if function == "<module>" else f"{function}()"
            warnings.warn(
                f"{', '.join(restarted)} in {where} counted steps from 0 after the resume at step "
                f"{self.start_step}, where an uninterrupted run would have gone on from "
                f"{self.start_step}: the checkpoint does not hold it. Count with job.step "
                "(restored with the checkpoint), or keep the value in a dict given to "
                "gq.State(..., progress={...}) and read and write it there",
                ResumeWarning,
                stacklevel=_levels_up_to(self.frame),
            )


def _integers(frame: FrameType) -> dict[str, int]:
    """The variables of `frame` that hold an int (not a bool)."""
    return {name: value for name, value in frame.f_locals.items() if type(value) is int}


def _levels_up_to(frame: FrameType) -> int:
    """The `stacklevel` that makes a warning point at `frame`'s current line."""
    level, here = 1, sys._getframe(1)
    while here is not frame:
        if here.f_back is None:
            return 2
        level, here = level + 1, here.f_back
    return level


_resumed: _ResumedLoop | None = None
"""The loop a checkpoint suspend checks before the process exits."""


def epochs(total: int) -> Iterator[int]:
    """Yield the epochs not yet finished, from the restored one up to `total` - 1.

    After a restore it checks the calling function for counters that started
    again from 0 (module docstring), when the loop ends or the job suspends.
    """
    global _resumed
    count = whole_number(total)
    if count is None or count < 0:
        raise RunnerError(
            f"gq.epochs({total!r}): the number of epochs must be a whole number, 0 or more",
            hint="such as `for epoch in gq.epochs(10):`",
        )
    job = current_job()
    resumed = _ResumedLoop.after_restore(job, sys._getframe(1))
    if resumed is not None:
        _resumed = resumed
    try:
        while job.epoch < total:
            if resumed is not None:
                resumed.epoch_starts.append(job.step)
            yield job.epoch
            job.epoch += 1
        if resumed is not None:
            resumed.check(suspending=False)
    finally:
        if _resumed is resumed:
            _resumed = None


def step(loss: Any = None) -> None:
    """Mark an iteration boundary: count, measure, and suspend here if asked to."""
    job = current_job()
    now = time.perf_counter()
    job.step += 1
    boundary, peak = _cuda_memory()
    seconds = None if job.boundary_time is None else now - job.boundary_time
    if isinstance(loss, torch.Tensor):
        loss = loss.detach()
    job.record_step(StepInfo(job.step, job.epoch, seconds, boundary, peak, loss))
    job.honour_checkpoint_request()  # one the daemon asked for; training goes on
    mode = agree_on_suspend(job)  # under torchrun: the same answer on every rank
    if mode == "park":
        _park(job, now)
        now = time.perf_counter()
        # A checkpoint asked during the park is honoured now; a park asked as the job was
        # resumed stays for the next boundary, after a step computed in its turn.
        mode = job.take_suspend_request() if job.suspend_requested == "checkpoint" else None
    if mode == "checkpoint":
        suspend_all_ranks(job, lambda: _suspend_to_checkpoint(job, now))
    job.boundary_time = time.perf_counter()


def _cuda_memory() -> tuple[int | None, int | None]:
    """Allocated bytes now and the peak since the last call; None when CUDA is unused."""
    if not cuda_in_use():
        return None, None
    boundary, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return boundary, peak


def _state_of(job: Job) -> State:
    if job.state is None:
        raise RunnerError(
            "a suspend was requested but the script has no gpuq.runner.State",
            hint="create gq.State(model=..., optimizer=...) before the training loop",
        )
    return job.state


def _suspend_to_checkpoint(job: Job, start: float) -> None:
    """Save, acknowledge and exit with SUSPEND_EXIT_CODE."""
    state = _state_of(job)
    written = state.save()
    report = SuspendReport("checkpoint", job.step, written.bytes, time.perf_counter() - start)
    job.suspends.append(report)
    extra = {"checkpoint": written.path.name, "sha256": written.sha256}
    _acknowledge(state.checkpoint_dir, job, report, extra)
    job.report_suspend(report)  # over the control channel, before the exit
    _say(f"suspended at step {job.step}: {written.bytes} bytes saved in {report.seconds:.3f}s")
    try:
        if _resumed is not None and _resumed.job is job:
            _resumed.check(suspending=True)  # now the checkpoint is safe
    except ResumeWarning as warning:  # warnings made errors must not spoil the suspend's exit
        _say(f"warning: {warning}")
    finally:
        job.close()
    raise SystemExit(SUSPEND_EXIT_CODE)


@dataclass
class _Moved:
    """One tensor parked in host memory, and how to put it back."""

    host: Any
    device: Any
    put: Callable[[Any], None]


class _Parked:
    """The device tensors of a State's modules and optimizers, held in host memory."""

    def __init__(self, objects: Iterable[Any]) -> None:
        self.moved: list[_Moved] = []
        seen: set[int] = set()
        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                for tensor in [*obj.parameters(), *obj.buffers()]:
                    if id(tensor) not in seen:
                        seen.add(id(tensor))
                        self._park_module_tensor(tensor)
            elif isinstance(obj, torch.optim.Optimizer):
                for slots in obj.state.values():
                    for key, value in list(slots.items()):
                        if isinstance(value, torch.Tensor) and id(value) not in seen:
                            seen.add(id(value))
                            self._park(value, _item_setter(slots, key))

    @property
    def bytes(self) -> int:
        """Bytes copied to host memory (the same amount goes back on resume)."""
        return sum(m.host.numel() * m.host.element_size() for m in self.moved)

    def _park_module_tensor(self, tensor: Any) -> None:
        if tensor.grad is not None:
            self._park(tensor.grad, _attribute_setter(tensor, "grad"), placeholder=None)
        self._park(tensor, _attribute_setter(tensor, "data"))

    def _park(self, tensor: Any, put: Callable[[Any], None], placeholder: Any = ...) -> None:
        host = tensor.detach().to("cpu", copy=True)
        self.moved.append(_Moved(host, tensor.device, put))
        if placeholder is ...:
            placeholder = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        put(placeholder)

    def put_back(self, *, to_host: bool = False) -> None:
        """Copy every tensor back to its device (or leave it on the host)."""
        for moved in reversed(self.moved):  # parameters before their gradients
            moved.put(moved.host if to_host else _to_device(moved.host, moved.device))
        self.moved.clear()


def _to_device(host: Any, device: Any) -> Any:
    return host.to(device)


def _attribute_setter(obj: Any, name: str) -> Callable[[Any], None]:
    def put(new: Any) -> None:
        setattr(obj, name, new)

    return put


def _item_setter(mapping: dict[Any, Any], key: Any) -> Callable[[Any], None]:
    def put(new: Any) -> None:
        mapping[key] = new

    return put


def _park(job: Job, start: float) -> None:
    """Move state to host memory, free the device, wait for resume, move it back."""
    state = _state_of(job)
    parked = _Parked(state.objects.values())
    moved_bytes = parked.bytes
    if cuda_in_use():
        torch.cuda.empty_cache()
    parked_seconds = time.perf_counter() - start
    report = SuspendReport("park", job.step, moved_bytes, parked_seconds)
    _acknowledge(state.checkpoint_dir, job, report, {})
    job.report_suspend(report)
    _say(f"parked at step {job.step}: {moved_bytes} bytes to host in {parked_seconds:.3f}s")
    waited = time.perf_counter()
    job.wait_while_parked()
    paused = time.perf_counter() - waited
    if job.suspend_requested == "checkpoint":
        parked.put_back(to_host=True)  # the checkpoint is written from host memory
        return
    resumed = time.perf_counter()
    try:
        parked.put_back()
    except torch.cuda.OutOfMemoryError:
        parked.put_back(to_host=True)  # all of it, from the host copies
        _say(f"no room on the device to resume at step {job.step}: suspending to a checkpoint")
        job.request_suspend("checkpoint")
        return
    if cuda_in_use():
        torch.cuda.synchronize()
    resume_seconds = time.perf_counter() - resumed
    job.suspends.append(
        SuspendReport("park", job.step, moved_bytes, parked_seconds, resume_seconds, paused)
    )
    job.report_resume(job.suspends[-1])
    if state.checkpoint_dir is not None:
        (state.checkpoint_dir / ACK_FILE).unlink(missing_ok=True)
    _say(f"resumed at step {job.step}: {moved_bytes} bytes back in {resume_seconds:.3f}s")


def _acknowledge(
    directory: Path | None, job: Job, report: SuspendReport, extra: dict[str, Any]
) -> None:
    """Write suspended.json atomically, so the daemon sees what happened and at what cost."""
    if directory is not None:
        write_acknowledgement(directory, job, report, extra)


def _say(message: str) -> None:
    print(f"gpuq.runner: {message}", file=sys.stderr, flush=True)
