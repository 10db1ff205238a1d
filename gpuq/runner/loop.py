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
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
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
    write_acknowledgement,
)
from gpuq.runner.state import State, cuda_in_use


def epochs(total: int) -> Iterator[int]:
    """Yield the epochs not yet finished, from the restored one up to `total` - 1."""
    job = current_job()
    while job.epoch < total:
        yield job.epoch
        job.epoch += 1


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
        mode, now = job.take_suspend_request(), time.perf_counter()
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
