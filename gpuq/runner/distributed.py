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

Cost: one all-reduce of 4 bytes per agreement, on the CPU through gloo (the
default group when the backend is gloo, otherwise a gloo group created once,
so a NCCL job never waits for its GPU stream). On one machine that is a
fraction of a millisecond per step (0.4 ms measured between two CPU ranks on
a busy two-core machine; less on an idle one), small next to a step of real
training. `configure(agree_every=k)` agrees only at steps that are multiples
of k, trading up to k - 1 more steps before a suspend for 1/k of the cost.
All ranks count the same steps, so they still stop together.

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
- The data position: give each rank its own equal share with `shard` and
  wrap it in ``gq.AdaptiveDataLoader``; all ranks then consume the same
  number of batches, and the one position rank 0 saves is right for all.

Right::

    job = gq.init()
    dist.init_process_group("gloo")           # or "nccl"
    torch.manual_seed(0)                      # the same on every rank
    model = Net()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    state = gq.State(model=model, optimizer=opt)   # the module, not the DDP wrapper
    state.restore()
    loader = gq.AdaptiveDataLoader(gq_dist.shard(dataset), batch_size=32)
    for epoch in gq.epochs(10):
        for x, y in loader:
            loss = loss_fn(ddp(x), y); loss.backward()
            opt.step(); opt.zero_grad(set_to_none=True)
            gq.step(loss=loss)                # every rank, every iteration

Wrong::

    if dist.get_rank() == 0:
        gq.step()                             # the others never agree: rank 0 hangs

This module imports torch only inside its functions, so `gpuq.runner.job`
can use the environment helpers without loading torch.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpuq.runner import SUSPEND_EXIT_CODE
from gpuq.runner.job import Job, RunnerError, SuspendMode

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.utils.data import Subset

_settings = {"agree_every": 1}
_coordination: list[tuple[object, ProcessGroup]] = []
"""The gloo group used to agree, with the default group it was made for (at most one)."""


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
    group = coordination_group()
    if group is None:
        save_and_exit()
        return
    import torch.distributed as dist

    _warn_if_generators_differ(group)
    if dist.get_rank() == 0:
        try:
            save_and_exit()
        except SystemExit:
            dist.barrier(group=group)  # the others leave once the checkpoint is on disk
            raise
    dist.barrier(group=group)
    print(
        f"gpuq.runner: rank {dist.get_rank()} suspended at step {job.step} (rank 0 saved)",
        file=sys.stderr,
        flush=True,
    )
    job.close()
    raise SystemExit(SUSPEND_EXIT_CODE)


def coordination_group() -> ProcessGroup | None:
    """The CPU (gloo) group the ranks agree through; None without several ranks."""
    if _distributed_world() <= 1:
        return None
    import torch.distributed as dist

    default = dist.group.WORLD
    if _coordination and _coordination[0][0] is default:
        return _coordination[0][1]
    if dist.get_backend() == "gloo":
        group: ProcessGroup = dist.group.WORLD  # type: ignore[assignment]
    else:
        group = dist.new_group(backend="gloo")  # collective: every rank is at its first boundary
    _coordination[:] = [(default, group)]
    return group


def shard(dataset: Any, environ: Mapping[str, str] | None = None) -> Subset[Any]:
    """This rank's share of a map-style dataset: items rank, rank + world, ... (equal sizes).

    Every share has ``len(dataset) // world`` items (the few left over are
    dropped), so all ranks run the same number of steps per epoch.
    """
    from torch.utils.data import Subset

    ranks, me = _distributed_world(), _distributed_rank()
    if ranks <= 1:
        ranks, me = world_size(environ), rank(environ)
    per_rank = len(dataset) // ranks
    return Subset(dataset, list(range(me, per_rank * ranks, ranks)))


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


def _warn_if_generators_differ(group: ProcessGroup) -> None:
    """Warn on rank 0 when ranks' torch generators differ: a resume gives all of them rank 0's."""
    import torch
    import torch.distributed as dist

    from gpuq.runner.state import capture_rng

    generators = capture_rng()
    buffer = io.BytesIO()
    torch.save([generators["torch"], generators.get("cuda")], buffer)
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, digest, group=group)
    if dist.get_rank() == 0 and len(set(digests)) > 1:
        warnings.warn(
            "the ranks' torch random generators differ: a resume restores rank 0's on every "
            "rank, so the resumed run will not match an uninterrupted one; seed every rank alike",
            RuntimeWarning,
            stacklevel=3,
        )
