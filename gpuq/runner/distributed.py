"""torchrun and DistributedDataParallel: every rank suspends at the same step.

Under ``torchrun`` each rank runs the same script and calls ``gq.init()`` and
``gq.step()`` as a single process does. Rank 0 is the coordinator: it alone
talks to gpuq over the control channel, writes the checkpoint and the
acknowledgement. Every rank installs the SIGUSR1/SIGTERM handlers, so a
signal that reaches any of them counts.

At an iteration boundary the ranks agree on whether to suspend: each puts
its pending request (0 or 1) into a one-element tensor and they take the
maximum with ``all_reduce``. When the answer is yes, rank 0 saves the
checkpoint (state of the DDP module's ``.module``, as given to `gq.State`)
and writes ``suspended.json``, every rank waits at a barrier until that is on
disk, and every rank exits with `gpuq.runner.SUSPEND_EXIT_CODE`. On resume
every rank calls ``state.restore()`` and loads the same checkpoint.

Cost: one all-reduce of 4 bytes per agreement, through a gloo group of
gpuq's own created at the first boundary (on the CPU, so a NCCL job never
waits for its GPU stream). On one machine that is a fraction of a
millisecond per step (0.4 ms measured between two CPU ranks on a busy
two-core machine; less on an idle one), small next to a step of real
training. `configure(agree_every=k)` agrees only at steps that are multiples
of k, trading up to k - 1 more steps before a suspend for 1/k of the cost.
All ranks count the same steps, so they still stop together.

gpuq destroys its group before a suspend exits, and at exit otherwise
(`release_coordination_group`). A gloo worker thread lets go of a finished
collective a moment after the ranks have moved on, and that takes the GIL
(the collective holds Python objects: its tensors, the context ``backward()``
stashes). If Python has begun to shut down by then, the thread dies inside a
C++ destructor and the rank aborts ("terminate called without an active
exception", SIGABRT), which a loaded machine makes likely. Destroying the
group while Python is intact joins its threads first. The same holds for the
script's own group: end with ``del ddp`` and ``dist.destroy_process_group()``,
or, where a framework (the Hugging Face Trainer, Lightning) made the group
and holds the DDP wrapper, drop the trainer and call
``gq_dist.destroy_process_groups()``.

Park mode is not supported: a parked rank would hold its peers in the next
collective until they time out. A park request under torchrun raises
`RunnerError`.

What scripts must keep the same on every rank:

- The checkpoint directory: single machine, or a directory on storage that
  every node sees at the same path.
- The random generators: rank 0's are saved, and every rank restores them.
  Seed torch alike on every rank (``torch.manual_seed(seed)``, as DDP
  scripts do so that replicas start equal) and draw per-rank randomness from
  generators seeded with (seed, rank, epoch). A suspend warns when the
  ranks' torch generators differ, since the resumed run would then differ
  from an uninterrupted one. Python's `random` and NumPy's global generator
  start from OS entropy in every process: a script that draws from them on
  several ranks must seed them per rank and epoch itself.
- The data position: give ``gq.AdaptiveDataLoader`` the whole dataset. Under
  a process group of several ranks it splits each global batch (its
  ``batch_size`` counts all ranks' samples) into one share per rank, and its
  position counts samples of the whole pass, so the one position rank 0
  saves is right for every rank, and for any number of ranks: a job resized
  from 2 to 4 GPUs goes on at the next sample of the pass, with nothing
  skipped or seen twice, and the same global batch (or the one the goodput
  tuner picks for 4). A dataset already cut with `shard` keeps the older
  behaviour (a per-rank batch and position), which cannot change world size.

Right::

    job = gq.init()
    dist.init_process_group("gloo")           # or "nccl"
    torch.manual_seed(0)                      # the same on every rank
    model = Net()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    state = gq.State(model=model, optimizer=opt)   # the module, not the DDP wrapper
    state.restore()
    loader = gq.AdaptiveDataLoader(dataset, batch_size=64)   # global: 64 / world per rank
    for epoch in gq.epochs(10):
        for x, y in loader:
            loss = loss_fn(ddp(x), y); loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)                # every rank, every iteration
    del ddp                                   # it holds the process group
    dist.destroy_process_group()              # gloo's threads end here, not at exit

Wrong::

    if dist.get_rank() == 0:
        gq.step()                             # the others never agree: rank 0 hangs

This module imports torch only inside its functions, so `gpuq.runner.job`
can use the environment helpers without loading torch.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import os
import sys
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpuq.runner import SUSPEND_EXIT_CODE
from gpuq.runner.job import Job, RunnerError, SuspendMode

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.utils.data import Subset

_settings = {"agree_every": 1}
_coordination: list[tuple[weakref.ref[ProcessGroup], ProcessGroup]] = []
"""gpuq's gloo group, with the default group it was made for (at most one).

The default group is held weakly: the script's ``destroy_process_group()``
must be able to free it.
"""


def rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's global rank as torchrun sets it (``RANK``); 0 outside torchrun."""
    value = (os.environ if environ is None else environ).get("RANK", "")
    return int(value) if value.isdigit() else 0


def world_size(environ: Mapping[str, str] | None = None) -> int:
    """How many ranks torchrun started (``WORLD_SIZE``); 1 outside torchrun."""
    value = (os.environ if environ is None else environ).get("WORLD_SIZE", "")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def is_coordinator(environ: Mapping[str, str] | None = None) -> bool:
    """True for the process that talks to gpuq: rank 0, or the only process."""
    return rank(environ) == 0


def check_suspend_mode(mode: SuspendMode, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a park request under torchrun, where a parked rank would stall its peers."""
    if mode == "park" and (world_size(environ) > 1 or _distributed_world() > 1):
        raise _park_unsupported()


def configure(*, agree_every: int = 1) -> None:
    """Agree on suspends only at steps that are multiples of `agree_every` (default: all)."""
    if agree_every < 1:
        raise RunnerError(f"agree_every must be at least 1, not {agree_every}")
    _settings["agree_every"] = agree_every


def agree_on_suspend(job: Job) -> SuspendMode | None:
    """Take the pending suspend request, agreed by all ranks; called at every boundary.

    Outside a distributed run this is `job.take_suspend_request()`. Under
    torchrun every rank gets the same answer at the same step.
    """
    group = coordination_group()
    if group is None:
        return job.take_suspend_request()
    if job.step % _settings["agree_every"]:
        return None  # the request stays pending until an agreement step
    import torch
    import torch.distributed as dist

    mode = job.take_suspend_request()
    if mode == "park":
        raise _park_unsupported()
    flag = torch.tensor([1 if mode == "checkpoint" else 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return "checkpoint" if int(flag.item()) else None


def suspend_all_ranks(job: Job, save_and_exit: Callable[[], None]) -> None:
    """Rank 0 saves and acknowledges; then every rank exits with SUSPEND_EXIT_CODE.

    `save_and_exit` is the single-process suspend (save, acknowledge, raise
    SystemExit); outside a distributed run it is all that happens.
    """
    if coordination_group() is None:
        save_and_exit()
        return
    import torch.distributed as dist

    _warn_if_generators_differ()
    if dist.get_rank() == 0:
        try:
            save_and_exit()
        except SystemExit:
            _leave_together()
            raise
    _leave_together()
    print(
        f"gpuq.runner: rank {dist.get_rank()} suspended at step {job.step} (rank 0 saved)",
        file=sys.stderr,
        flush=True,
    )
    job.close()
    raise SystemExit(SUSPEND_EXIT_CODE)


def coordination_group() -> ProcessGroup | None:
    """The CPU (gloo) group the ranks agree through; None without several ranks.

    It is gpuq's own, not the default group, so that gpuq can destroy it
    before the process exits (`release_coordination_group`).
    """
    if _distributed_world() <= 1:
        return None
    import torch.distributed as dist

    default = dist.group.WORLD
    if default is None:  # not initialised, which _distributed_world() has ruled out
        return None
    if _coordination and _coordination[0][0]() is default:
        return _coordination[0][1]
    release_coordination_group()  # one made for an earlier default group
    group: ProcessGroup = dist.new_group(backend="gloo")
    # new_group is collective: every rank is at its first boundary here.
    _coordination[:] = [(weakref.ref(default), group)]
    atexit.register(release_coordination_group)
    return group


def release_coordination_group() -> None:
    """Destroy gpuq's gloo group and drop it, which joins its threads while Python is intact.

    Called before a suspend exits and at exit (`atexit` runs before Python
    starts to shut down); see the module docstring for why. Nothing else may
    hold the group, or its threads outlive this call.
    """
    if not _coordination:
        return
    import torch.distributed as dist

    atexit.unregister(release_coordination_group)
    [(made_for, group)] = _coordination
    _coordination.clear()
    if dist.is_initialized() and dist.group.WORLD is made_for():
        dist.destroy_process_group(group)  # else destroying the default group removed it
    del group  # the last reference: its destructor joins the threads (without the GIL)


def destroy_process_groups() -> None:
    """Destroy gpuq's group and the default one now, while Python is intact.

    For the end of a script whose framework made the default group (module
    docstring): drop your references to the trainer first; this collects
    garbage so that its DDP wrapper lets go of the group. Does nothing
    outside torch.distributed.
    """
    import gc

    import torch.distributed as dist

    release_coordination_group()
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def from_rank0(values: list[int]) -> list[int]:
    """Rank 0's `values` on every rank; `values` itself without a group."""
    group = coordination_group()
    if group is None:
        return values
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.int64)
    dist.broadcast(tensor, src=0, group=group)
    return [int(v) for v in tensor.tolist()]


def _leave_together() -> None:
    """Wait until every rank is here (rank 0 has saved), then destroy gpuq's group."""
    import torch.distributed as dist

    dist.barrier(group=coordination_group())
    release_coordination_group()


def shard(dataset: Any, environ: Mapping[str, str] | None = None) -> Subset[Any]:
    """This rank's share of a map-style dataset: items rank, rank + world, ... (equal sizes).

    Every share has ``len(dataset) // world`` items (the few left over are
    dropped), so all ranks run the same number of steps per epoch. For data
    the script iterates itself (validation, a framework's loader):
    ``gq.AdaptiveDataLoader`` splits a whole dataset across ranks on its own,
    and only that way can a job change its number of ranks (module docstring).
    """
    from torch.utils.data import Subset

    ranks, me = replicas_and_rank(environ)
    per_rank = len(dataset) // ranks
    indices = list(range(me, per_rank * ranks, ranks))
    share: Subset[Any] = Subset(dataset, indices)
    share.gpuq_shard = (me, ranks)  # type: ignore[attr-defined]
    return share


def is_shard(dataset: Any) -> bool:
    """True for a dataset `shard` made: one rank's share, not the whole."""
    return hasattr(dataset, "gpuq_shard")


def replicas_and_rank(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(world size, rank): of the process group if one is initialised, else torchrun's."""
    ranks = _distributed_world()
    if ranks > 1:
        return ranks, _distributed_rank()
    return world_size(environ), rank(environ)


def replica_share(count: int, replicas: int, index: int) -> tuple[int, int]:
    """The [start, end) of replica `index`'s part of `count` samples: contiguous, near-equal.

    The first ``count % replicas`` replicas get one sample more than the others.
    """
    base, extra = divmod(count, replicas)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


def max_over_ranks(values: list[float]) -> list[float]:
    """The element-wise maximum of `values` over all ranks; `values` itself without a group.

    What a decision made on every rank from measured times reads, so that
    every rank makes the same one (the goodput tuner's step times).
    """
    group = coordination_group()
    if group is None:
        return values
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return [float(v) for v in tensor.tolist()]


def _distributed_world() -> int:
    """World size of the initialised default process group; 1 without one."""
    torch_distributed = sys.modules.get("torch.distributed")
    if torch_distributed is None or not torch_distributed.is_available():
        return 1
    if not torch_distributed.is_initialized():
        return 1
    return int(torch_distributed.get_world_size())


def _distributed_rank() -> int:
    import torch.distributed as dist

    return int(dist.get_rank()) if _distributed_world() > 1 else 0


def _park_unsupported() -> RunnerError:
    return RunnerError(
        "park mode is not supported under torchrun/DistributedDataParallel",
        hint="suspend in checkpoint mode: every rank saves at the same step and exits",
    )


def _warn_if_generators_differ() -> None:
    """Warn on rank 0 when ranks' torch generators differ: a resume gives all of them rank 0's."""
    import torch
    import torch.distributed as dist

    from gpuq.runner.state import capture_rng

    generators = capture_rng()
    buffer = io.BytesIO()
    torch.save([generators["torch"], generators.get("cuda")], buffer)
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest, group=coordination_group())
    if dist.get_rank() == 0 and len(set(digests)) > 1:
        warnings.warn(
            "the ranks' torch random generators differ: a resume restores rank 0's on every "
            "rank, so the resumed run will not match an uninterrupted one; seed every rank alike",
            RuntimeWarning,
            stacklevel=3,
        )
