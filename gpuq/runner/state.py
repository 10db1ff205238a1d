"""What a checkpoint holds, and putting it back.

``State(model=, optimizer=, lr_scheduler=, scaler=, **extra)`` names the
objects whose ``state_dict()`` a checkpoint keeps; every extra object needs
``state_dict()`` and ``load_state_dict()`` too (an EMA model, a metric
tracker), or is a dict of plain values (below). A checkpoint also holds the
random number generators (Python `random`, NumPy's global generator when
NumPy is loaded, torch CPU and, when CUDA is in use, every CUDA device), the
job's step and epoch, and the position of each `AdaptiveDataLoader`.
`state.restore()` loads the newest valid checkpoint, if any, so the loop
continues at the exact next step. ``lr_scaling="adascale"`` (or ``"sqrt"``,
``"linear"``) lets a loader with a ``max_batch_size`` tune its batch size for
goodput, scaling the optimizer's learning rate by that rule
(`gpuq.runner.data`, `gpuq.runner.tuning`).

Generators the script makes itself (``torch.Generator``,
``numpy.random.default_rng``) are not found automatically: seed them from the
epoch, or hand them to State as extra objects with ``state_dict()``. The most
recently created State is the one a suspend saves.

Outside gpuq there is no checkpoint directory unless one is given, and
`restore()` returns False.

Call `restore()` once everything that draws random numbers at start-up exists,
and draw nothing random between `restore()` and the loop: after a resume,
the generators continue from where the checkpoint left them.

Right::

    model, opt = Net(), SGD(...)          # random init, then overwritten by restore
    state = gq.State(model=model, optimizer=opt)
    state.restore()
    for epoch in gq.epochs(90): ...

Wrong::

    state.restore()
    probe = torch.randn(16, 3)            # different numbers after every resume

Everything else the script keeps between iterations is lost on a resume
unless it is in the State: its own step or epoch counters, a best loss and an
early-stopping count, an RNN's hidden state carried from batch to batch. Count
steps with ``job.step`` and epochs with `gpuq.runner.epochs` (both restored),
and give the rest to State as a dict of plain values (tensors, numbers,
strings, None, and lists, tuples and dicts of these: what a checkpoint can
hold). `restore()` updates that dict in place, so keep reading and writing it
rather than copies of its values; keys the checkpoint lacks keep their values,
and a restored tensor moves to the device of the tensor it replaces. A dict
holding anything else is refused when State is created and at every save.

Right::

    progress = {"best_loss": math.inf, "bad_epochs": 0}
    state = gq.State(model=model, optimizer=opt, progress=progress)
    state.restore()                       # puts the saved values into `progress`
    for epoch in gq.epochs(90):
        ...
        if val_loss < progress["best_loss"]:
            progress["best_loss"], progress["bad_epochs"] = val_loss, 0

Wrong::

    best_loss, bad_epochs = math.inf, 0   # inf and 0 again after every resume
    for epoch in gq.epochs(90):
        ...
        if val_loss < best_loss:          # a resumed run "improves" on inf
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gpuq.runner import checkpoint
from gpuq.runner.job import Job, RunnerError, current_job
from gpuq.runner.tuning import LR_SCALING_RULES

FORMAT = 1
"""Version of the payload layout inside the checkpoint file."""


class State:
    """The objects a checkpoint saves and a resume restores."""

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        scaler: Any = None,
        *,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        lr_scaling: str | None = None,
        **extra: Any,
    ) -> None:
        named = {"model": model, "optimizer": optimizer, "lr_scheduler": lr_scheduler}
        named |= {"scaler": scaler, **extra}
        self.objects: dict[str, Any] = {k: v for k, v in named.items() if v is not None}
        """What the checkpoint keeps, by name: objects with a state_dict, and dicts of values."""
        for name, obj in self.objects.items():
            if isinstance(obj, dict):
                _plain_values(name, obj)  # refuse what a checkpoint cannot hold, now
            elif not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise RunnerError(
                    f"State({name}=...) has no state_dict()/load_state_dict()",
                    hint=f"pass plain values in a dict: State({name}={{'best_loss': ...}})",
                )
        self.job: Job = current_job()
        given = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.checkpoint_dir: Path | None = given or self.job.checkpoint_dir
        self.restored_from: Path | None = None
        self.restored_step: int | None = None
        """The step the loaded checkpoint put back; None on a fresh start."""
        if lr_scaling is not None and lr_scaling not in LR_SCALING_RULES:
            raise RunnerError(
                f"unknown lr_scaling {lr_scaling!r}",
                hint="use 'adascale' (SGD), 'sqrt' (Adam, AdamW) or 'linear'",
            )
        self.lr_scaling = lr_scaling
        """The learning-rate rule that lets an `AdaptiveDataLoader` tune its batch size."""
        self.job.state = self

    def __repr__(self) -> str:
        return f"<gpuq.runner.State {sorted(self.objects)} in {self.checkpoint_dir}>"

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint payload for the job's current step."""
        loaders = dict(self.job.pending_loader_states)
        loaders |= {name: loader.state_dict() for name, loader in self.job.loaders.items()}
        return {
            "format": FORMAT,
            "step": self.job.step,
            "epoch": self.job.epoch,
            "objects": {name: _state_of(name, obj) for name, obj in self.objects.items()},
            "rng": capture_rng(),
            "loaders": loaders,
            "job": {"id": self.job.job_id, "attempt": self.job.attempt, "time": time.time()},
        }

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """Put a checkpoint payload back: objects, generators, progress, loader positions."""
        if payload.get("format") != FORMAT:
            raise checkpoint.CheckpointError(
                f"checkpoint payload format {payload.get('format')!r}, expected {FORMAT}"
            )
        missing = sorted(set(self.objects) - set(payload["objects"]))
        if missing:
            raise checkpoint.CheckpointError(
                f"the checkpoint has no state for {', '.join(missing)}",
                hint="pass State the same objects as the run that wrote the checkpoint",
            )
        self.job.step, self.job.epoch = int(payload["step"]), int(payload["epoch"])
        for name, obj in self.objects.items():
            if isinstance(obj, dict):
                _load_values(obj, payload["objects"][name])
                continue
            obj.load_state_dict(payload["objects"][name])
            if isinstance(obj, torch.optim.Optimizer) and self.job.step > 0:
                # It has stepped, in an earlier process: without this, a resume at the end
                # of the first epoch makes the LR scheduler warn "step() before optimizer.step()".
                obj._opt_called = True  # type: ignore[attr-defined]
        restore_rng(payload["rng"])
        for name, position in payload["loaders"].items():
            loader = self.job.loaders.get(name)
            if loader is None:
                self.job.pending_loader_states[name] = position
            else:
                loader.load_state_dict(position)

    def save(self, path: str | os.PathLike[str] | None = None) -> checkpoint.WrittenCheckpoint:
        """Write a checkpoint atomically: to `path`, or as ``ckpt-<step>.pt`` in the directory.

        Call it at an iteration boundary (after `gpuq.runner.step()`), where
        the saved step, epoch and loader position describe the same moment.
        """
        if path is not None:
            return checkpoint.write_file(Path(path), self.job.step, self.state_dict())
        if self.checkpoint_dir is None:
            raise RunnerError(
                "no checkpoint directory: the job runs outside gpuq",
                hint="pass State(checkpoint_dir=...) or save(path)",
            )
        return checkpoint.write_checkpoint(self.checkpoint_dir, self.job.step, self.state_dict())

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore from one checkpoint file (verified; no fallback)."""
        self.load_state_dict(checkpoint.read_checkpoint(Path(path)))
        self.restored_from, self.restored_step = Path(path), self.job.step

    def restore(self) -> bool:
        """Resume from the newest valid checkpoint; False when there is none (a fresh start)."""
        if self.checkpoint_dir is None:
            return False
        found = checkpoint.load_latest(self.checkpoint_dir)
        if found is None:
            return False
        self.load_state_dict(found.payload)
        self.restored_from, self.restored_step = found.path, self.job.step
        return True


_PLAIN_TYPES = (type(None), bool, int, float, str)


def _plain_values(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """A copy of `values` as a checkpoint keeps it (tensors detached); refuses anything else.

    Checkpoints are loaded with ``torch.load(weights_only=True)``, which
    refuses other objects: better a clear error at the save than an
    unreadable checkpoint at the resume.
    """
    return {key: _plain(value, f"{name}[{key!r}]") for key, value in values.items()}


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if type(value) in _PLAIN_TYPES:  # exact: numpy.float64 is a float a checkpoint refuses
        return value
    if type(value) in (list, tuple):
        return type(value)(_plain(item, f"{where}[{i}]") for i, item in enumerate(value))
    if type(value) is dict:
        return {key: _plain(item, f"{where}[{key!r}]") for key, item in value.items()}
    raise RunnerError(
        f"State: {where} is a {type(value).__qualname__}, which a checkpoint cannot hold",
        hint="keep tensors, numbers, strings, None and lists, tuples or dicts of these "
        "(float(x), x.tolist(), torch.as_tensor(x)), or pass an object with state_dict()",
    )


def _state_of(name: str, obj: Any) -> Any:
    """What the checkpoint keeps of one State object."""
    return _plain_values(name, obj) if isinstance(obj, dict) else obj.state_dict()


def _load_values(values: dict[str, Any], saved: dict[str, Any]) -> None:
    """Put saved values into the script's own dict; a tensor goes to its predecessor's device."""
    for key, value in saved.items():
        current = values.get(key)
        if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor):
            value = value.to(current.device)
        values[key] = value


def cuda_in_use() -> bool:
    """True once this process has initialised CUDA (the runner never does so itself)."""
    return bool(torch.cuda.is_initialized())  # type: ignore[no-untyped-call]


def capture_rng() -> dict[str, Any]:
    """The state of every random number generator a training script may draw from."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, position, has_gauss, cached = numpy.random.get_state()
        keys = torch.from_numpy(keys.astype(numpy.int64))
        state["numpy"] = (name, keys, int(position), int(has_gauss), float(cached))
    if cuda_in_use():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what `capture_rng` saved (CUDA: on as many devices as both runs have)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy

        name, keys, position, has_gauss, cached = state["numpy"]
        keys = keys.numpy().astype(numpy.uint32)
        numpy.random.set_state((name, keys, position, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        for device, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, device)
