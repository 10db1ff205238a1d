"""A data loader whose position is part of the checkpoint.

`AdaptiveDataLoader` wraps `torch.utils.data.DataLoader` over a map-style
dataset. The order of each pass is a permutation drawn from a private
`torch.Generator` seeded with (seed, epoch), so it is reproducible without
saving it; the loader's position is just (epoch, samples consumed). The
position counts batches the training loop has *received*, not those worker
processes prefetched, so a resume continues at the exact next batch.

Each ``iter(loader)`` starts the next pass, as with a plain DataLoader. A
pass is *in progress* while the loop that iterates it is running (a ``for``
that ends or breaks finishes it). A checkpoint records whether it was; after a
restore the first ``iter()`` finishes a pass that was in progress (even if only
the loop's last look for another batch is left) and otherwise starts the next
one. So a validation loader that had finished its pass starts a fresh one.

**Several ranks** (torchrun, DistributedDataParallel). Under a process group
of several ranks the loader takes the whole dataset on every rank and hands
each rank its part of every batch: ``batch_size`` is then the global batch
(all ranks' samples in one step), each pass's order is the same permutation
whatever the number of ranks, and the position counts samples of the whole
pass. A batch of B samples on K ranks gives the first B mod K ranks one
sample more than the rest (only a batch whose size is not a multiple of K);
a pass's last batch with fewer samples than ranks is left out, since every
rank must take part in each step. So a checkpoint written with one number of
ranks resumes with another (a resize) at the next sample of the pass, with
the same global batch, or the one the goodput tuner picks for the new
number (below): no sample is skipped or seen twice. A dataset cut with
`gpuq.runner.distributed.shard` is one rank's share: the loader then runs
on it as in a single process (a per-rank batch and position), and refuses to
resume with another number of ranks.

Loaders are told apart in checkpoints by name, ``loader0``, ``loader1``... in
order of creation; give ``name=`` when a script creates several in an order
that may change.

**Adaptive batch size.** A loader with ``max_batch_size`` above its
``batch_size``, in a script whose `gpuq.runner.State` names a learning-rate
rule, tunes its batch size for goodput (`gpuq.runner.tuning`)::

    state = gq.State(model=model, optimizer=opt, lr_scaling="adascale")
    loader = gq.AdaptiveDataLoader(dataset, batch_size=128, max_batch_size=4096)

``batch_size`` is then the initial batch size M0. Between any two steps
(when the tuner is due to decide, `gpuq.runner.tuning`) the loader may switch
to another (local batch, accumulation steps) between M0 and
``max_batch_size`` (accumulation only with ``gradient_accumulation=True``),
and yields micro-batches of the local size from there on, the rest of the
pass included; the State's optimizer absorbs all
but the last micro-batch of a step and steps on their mean gradient, with the
learning rate scaled by the rule. An epoch ends when the scale-invariant
progress reaches a dataset's worth of samples at M0: exactly one pass at M0,
more than one (each a new permutation) with larger, less efficient batches,
so epoch-keyed schedules keep their meaning. This runs outside gpuq too: it
is training logic (only its reports to the daemon need gpuq). Under
torchrun the tuner picks the per-rank batch for the number of ranks (the
batch sizes are global), and a resumed job whose number of ranks changed
first keeps its global batch, then lets the tuner choose for the new number
(`gpuq.runner.tuning`). On a shard (above) the batch size stays fixed, with
a warning. Without the rule or ``max_batch_size`` the batch size is fixed.

To measure the gradient noise from two gradients at the same weights, an
adaptive loader hands some steps without accumulation to the loop as the
two halves of their batch (one step in several; `gpuq.runner.gns`): the
loop sees two smaller batches, and the optimizer steps once on their
sample-weighted mean gradient, the same step up to rounding (batch
normalization sees each half apart, and gradient clipping in the loop clips
each half). A checkpoint taken between the halves resumes with the second.

What the loop must do: call ``optimizer.step()`` after every batch, exactly
as with a fixed batch size. Right::

    for x, y in loader:
        loss_fn(model(x), y).backward()
        opt.step(); opt.zero_grad()       # every batch: the runner accumulates
        gq.step()

Wrong: counting micro-batches and stepping every k-th batch (the runner does
that already), clipping gradients before ``step()`` while accumulating (it
clips each micro-batch, not their mean), or `torch.amp.GradScaler` with
accumulation (it finds no gradients on the absorbed micro-batches).

The tuner's state (noise-scale averages, step-time profile, progress,
configuration, gradients held between micro-batches) is part of the loader's
`state_dict`: a resume continues with the same configuration and statistics
bit for bit. Later decisions depend on measured step times, so they match an
uninterrupted run only as far as those measurements do (the tests make them
reproducible with a deterministic clock).

The loader draws nothing from torch's global generator (a plain DataLoader
draws its worker seed there at every ``iter()``), so resuming does not shift
the random numbers the model sees. Random augmentation in worker processes
(``num_workers > 0``) is reproducible per epoch, but not across a resume in
the middle of one; with ``num_workers=0`` it draws from the checkpointed
generators and is exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from gpuq.runner import distributed
from gpuq.runner.distributed import replica_share
from gpuq.runner.job import RunnerError, current_job, whole_number
from gpuq.runner.tuning import BatchConfig, BatchTuner

_MIX = 0x9E3779B97F4A7C15


def _seed_for(seed: int, epoch: int, stream: int) -> int:
    """A distinct 63-bit seed per (seed, epoch, stream)."""
    return (seed * _MIX + epoch * 1_000_003 + stream) % (1 << 63)


def split_in_halves(batch: Any, size: int) -> tuple[Any, Any] | None:
    """A collated batch of `size` samples cut in two, the first `size // 2` and the rest.

    Tensors are cut along their first dimension, which must be `size`;
    tuples, lists and dicts of them are split element by element. None
    when the batch holds anything else, or fewer than two samples.
    """
    if size < 2:
        return None
    half = size // 2
    if isinstance(batch, torch.Tensor):
        return (batch[:half], batch[half:]) if batch.dim() and batch.shape[0] == size else None
    if isinstance(batch, tuple | list) and type(batch) in (tuple, list):
        parts = [split_in_halves(item, size) for item in batch]
        if not parts or any(part is None for part in parts):
            return None
        pairs = [part for part in parts if part is not None]
        return type(batch)(p[0] for p in pairs), type(batch)(p[1] for p in pairs)
    if type(batch) is dict:
        split = {key: split_in_halves(value, size) for key, value in batch.items()}
        if not split or any(part is None for part in split.values()):
            return None
        done = {key: part for key, part in split.items() if part is not None}
        return {k: p[0] for k, p in done.items()}, {k: p[1] for k, p in done.items()}
    return None


def _order_stream(pass_number: int) -> int:
    """The stream of a pass's permutation: 0 for an epoch's first pass, as without tuning."""
    return 0 if pass_number == 0 else 1 + pass_number


class _PositionedBatchSampler(Sampler[list[int]]):
    """Batches of one pass over a permutation fixed by (seed, epoch), from a sample offset.

    `batch_size` and the offset count all replicas' samples; each batch
    yielded is replica `rank`'s part of a global batch (`replica_share`).
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        replicas: int = 1,
        rank: int = 0,
    ) -> None:
        self.size, self.batch_size, self.shuffle = size, batch_size, shuffle
        self.seed, self.drop_last = seed, drop_last
        self.replicas, self.rank = replicas, rank
        self.epoch, self.pass_number, self.start = 0, 0, 0

    def takes(self, count: int) -> bool:
        """True when a batch of `count` samples is trained on (every replica gets some)."""
        return count >= self.replicas and not (self.drop_last and count < self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            stream = _order_stream(self.pass_number)
            generator = torch.Generator().manual_seed(_seed_for(self.seed, self.epoch, stream))
            order: list[int] = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        for begin in range(self.start, self.size, self.batch_size):
            batch = order[begin : begin + self.batch_size]
            if not self.takes(len(batch)):
                return
            if self.replicas > 1:
                start, end = replica_share(len(batch), self.replicas, self.rank)
                batch = batch[start:end]
            yield batch

    def __len__(self) -> int:
        full, rest = divmod(self.size, self.batch_size)
        return full + (rest > 0 and self.takes(rest))


def _checked_batch_sizes(batch_size: object, max_batch_size: object) -> tuple[int, int | None]:
    """The sizes as ints; RunnerError for a size below 1 or not whole, or a maximum below it.

    NumPy integers are taken (and made ints, which JSON reports can carry).
    """
    initial = whole_number(batch_size)
    if initial is None or initial < 1:
        raise RunnerError(
            f"AdaptiveDataLoader(batch_size={batch_size!r}): the batch size must be a whole "
            "number, 1 or more",
            hint="batch_size is the initial batch size (M0), such as batch_size=32",
        )
    if max_batch_size is None:
        return initial, None
    largest = whole_number(max_batch_size)
    if largest is None or largest < initial:
        raise RunnerError(
            f"AdaptiveDataLoader(batch_size={batch_size!r}, max_batch_size={max_batch_size!r}): "
            "the maximum must be a whole number, batch_size or more",
            hint="max_batch_size above batch_size lets the loader tune the batch for goodput; "
            "leave it out to keep batch_size",
        )
    return initial, largest


class AdaptiveDataLoader:
    """A resumable `DataLoader`: shuffled per epoch from `seed`, checkpointed position."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        *,
        max_batch_size: int | None = None,
        gradient_accumulation: bool = False,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        name: str | None = None,
        **loader_kwargs: Any,
    ) -> None:
        """Wrap `dataset`; `loader_kwargs` go to DataLoader (num_workers, collate_fn, ...)."""
        if isinstance(dataset, DataLoader) or not hasattr(dataset, "__len__"):
            raise RunnerError(
                "AdaptiveDataLoader needs a map-style dataset with a length",
                hint="pass the dataset itself, not a DataLoader or an iterable dataset",
            )
        batch_size, max_batch_size = _checked_batch_sizes(batch_size, max_batch_size)
        clashing = {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator"}
        if clashing & set(loader_kwargs):
            raise RunnerError(f"AdaptiveDataLoader sets {sorted(clashing & set(loader_kwargs))}")
        self.dataset = dataset
        self.init_batch_size = batch_size
        self.max_batch_size = max_batch_size
        self.gradient_accumulation = gradient_accumulation
        self.seed = seed
        self.world = distributed.replicas_and_rank()[0]
        """Ranks training together (1 outside torchrun)."""
        sharded = distributed.is_shard(dataset)
        self.replicas, rank = (1, 0) if sharded else distributed.replicas_and_rank()
        """Ranks this loader splits each batch across: `world`, or 1 on a shard."""
        self._sampler = _PositionedBatchSampler(
            len(dataset), batch_size, shuffle, seed, drop_last, self.replicas, rank
        )
        self._generator = torch.Generator()
        self._loader: DataLoader[Any] = DataLoader(
            dataset, batch_sampler=self._sampler, generator=self._generator, **loader_kwargs
        )
        self.epoch = -1
        """The epoch under way (-1 before the first)."""
        self.pass_number = 0
        """Passes over the dataset completed in this epoch (more than 0 only when tuning)."""
        self.index = 0
        """Samples of this pass the training loop has received."""
        self.tuner: BatchTuner | None = None
        """The goodput tuner, once the loader turned out to be adaptive (first ``iter()``)."""
        self._pending_tuner: dict[str, Any] | None = None
        self._fixed = False  # tuning refused (several processes): never ask again
        self._accum_steps = 0
        self._in_progress = False
        self._finish_interrupted_pass = False
        job = current_job()
        self.name = name or f"loader{len(job.loaders)}"
        if self.name in job.loaders:
            raise RunnerError(f"two data loaders are named {self.name!r}")
        job.loaders[self.name] = self
        pending = job.pending_loader_states.pop(self.name, None)
        if pending is not None:
            self.load_state_dict(pending)

    @property
    def batch_size(self) -> int:
        """Samples per batch now, all ranks together (a micro-batch when accumulating)."""
        return self._sampler.batch_size

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches absorbed before each optimizer step (0: none)."""
        return self._accum_steps

    @property
    def adaptive(self) -> bool:
        """True when the batch size is tuned for goodput (creates the tuner on first use)."""
        return self._tuner() is not None

    def __len__(self) -> int:
        """Batches in a full pass."""
        return len(self._sampler)

    def __iter__(self) -> Iterator[Any]:
        tuner = self._tuner()
        resumed = self._finish_interrupted_pass
        if resumed:
            self._finish_interrupted_pass = False
        else:
            self.epoch, self.pass_number, self.index = self.epoch + 1, 0, 0
        self._generator.manual_seed(_seed_for(self.seed, self.epoch, 1))
        self._in_progress = True
        try:
            if tuner is None:
                yield from self._pass()
                return
            while True:
                steps = tuner.steps
                yield from self._pass(tuner)
                if tuner.progress >= tuner.epoch_target(self.epoch, self._sampler.size):
                    return  # enough progress for this epoch
                if tuner.steps == steps and not resumed:
                    return  # a pass without training (evaluation): stop rather than loop
                resumed = False  # (a resumed pass may have had nothing left but its end)
                self.pass_number, self.index = self.pass_number + 1, 0
        finally:  # the loop ended, or broke out and dropped this generator
            self._in_progress = False

    def _pass(self, tuner: BatchTuner | None = None) -> Iterator[Any]:
        """The rest of the current pass; with a tuner, micro-batches announced and timed."""
        sampler, size = self._sampler, self._sampler.size
        sampler.epoch, sampler.pass_number, sampler.start = self.epoch, self.pass_number, self.index
        if tuner is None:
            for batch in self._loader:
                self.index = min(self.index + sampler.batch_size, size)
                yield batch
            return
        local, micro_batches = sampler.batch_size, self._accum_steps + 1
        # Measured steps are split only once the loop is seen to step in this pass (an
        # evaluation pass never does); a pass resumed in its middle was seen to before.
        gns, trained = tuner.gns, tuner.steps - (self.index > 0)
        announce, target = gns.micro_batch, tuner.epoch_target(self.epoch, size)
        batches: Iterator[Any] | None = None  # created at the first batch, after any decision
        while True:  # runs once a batch: kept lean (see bench/bench_adaptive.py)
            start = self.index
            if start >= size:
                return
            # The micro-batch's place in its step: those absorbed so far (checkpointed).
            position = gns.pending() if micro_batches > 1 else 0
            resuming = micro_batches == 1 and gns.pending() > 0  # the second half is owed
            if position == 0 and not resuming:  # a step boundary
                if tuner.progress >= target:  # the epoch is done
                    return
                if tuner.decision_due() and self._adopt(tuner.retune()):
                    local, micro_batches = sampler.batch_size, self._accum_steps + 1
                    batches = None  # the rest of the pass in batches of the new size
            end = min(start + local, size)
            if not sampler.takes(end - start):
                return
            final = end + (local if sampler.drop_last else 1) > size
            last = position == micro_batches - 1 or final
            if batches is None:
                sampler.start = start
                batches = iter(self._loader)
                tuner.start_pass()  # its first step is not timed (workers start, caches warm)
            batch = next(batches)
            if micro_batches == 1 and (resuming or (gns.due() and tuner.steps > trained)):
                halves = self._split(batch, end - start)
                if halves is not None:  # measure the noise from two halves at the same weights
                    yield from self._halves(tuner, halves, end, resuming)
                    continue
            announce(end - start, last)
            self.index = end
            yield batch
            if last:
                tuner.step_ended(timed=position == micro_batches - 1 and end - start == local)

    def _halves(
        self, tuner: BatchTuner, halves: tuple[Any, Any], end: int, resuming: bool
    ) -> Iterator[Any]:
        """Yield a batch as two micro-batches of one step; the position moves after both.

        A checkpoint taken between them holds the first half's gradient, and
        the same position: a resume loads the batch again and yields the second.
        """
        half = self._first_half(end - self.index)
        if not resuming:
            tuner.gns.micro_batch(half, False)
            yield halves[0]
        tuner.gns.micro_batch(end - self.index - half, True)
        self.index = end
        yield halves[1]
        tuner.step_ended(timed=not resuming, halves=True)

    def _split(self, batch: Any, count: int) -> tuple[Any, Any] | None:
        """This rank's part of a global batch of `count` samples, in halves; None if unsplittable.

        Every rank's part must have two samples or more, or no rank splits:
        all ranks must run the same number of backward passes.
        """
        replicas, rank = self.replicas, self._sampler.rank
        if count < 2 * replicas:
            return None
        start, end = replica_share(count, replicas, rank)
        return split_in_halves(batch, end - start)

    def _first_half(self, count: int) -> int:
        """Samples in the first halves of all ranks' parts of a batch of `count` (`_split`)."""
        shares = (replica_share(count, self.replicas, r) for r in range(self.replicas))
        return sum((end - start) // 2 for start, end in shares)

    def _use(self, config: BatchConfig) -> None:
        """Run with the tuner's configuration: its per-rank batch on each of the replicas."""
        self._sampler.batch_size = config.local_bsz * config.replicas
        self._accum_steps = config.accum_steps

    def _adopt(self, config: BatchConfig) -> bool:
        """`_use` `config` if it differs from the one running; True if it did."""
        if (config.local_bsz * config.replicas, config.accum_steps) == (
            self._sampler.batch_size,
            self._accum_steps,
        ):
            return False
        self._use(config)
        return True

    def _tuner(self) -> BatchTuner | None:
        """The goodput tuner, created on first need if this loader is adaptive."""
        if self.tuner is not None or self._fixed:
            return self.tuner
        state = current_job().state
        rule = getattr(state, "lr_scaling", None)
        optimizer = None if state is None else state.objects.get("optimizer")
        max_batch = self.max_batch_size
        if max_batch is None or max_batch <= self.init_batch_size or rule is None:
            return None
        if optimizer is None:
            return None
        if self.replicas != self.world:
            self._fixed = True
            warnings.warn(
                "goodput batch tuning needs the whole dataset under torchrun, not a shard: "
                f"the batch size stays at {self.init_batch_size} per rank",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        self.tuner = BatchTuner(
            optimizer,
            current_job(),
            init_batch_size=self.init_batch_size,
            max_batch_size=max_batch,
            lr_scaling=rule,
            accumulation=self.gradient_accumulation,
            replicas=self.replicas,
        )
        if self._pending_tuner is not None:
            self.tuner.load_state_dict(self._pending_tuner)
            self._pending_tuner = None
            # A resize re-picks the batch; micro-batches absorbed before it are taken again.
            self.index = max(0, self.index - self.tuner.use_replicas(self.replicas))
        self._use(self.tuner.config)
        return self.tuner

    def state_dict(self) -> dict[str, Any]:
        """The position: the latest pass, the samples it delivered, and whether it goes on.

        An adaptive loader adds the pass within the epoch and its tuner's state.
        """
        position = {
            "epoch": self.epoch,
            "index": self.index,
            "in_progress": self._in_progress or self._finish_interrupted_pass,
            "batch_size": self.batch_size,
        }
        if self.replicas != self.world:  # positions within one rank's shard
            position |= {"world": self.world, "sharded": True}
        tuner = self.tuner.state_dict() if self.tuner is not None else self._pending_tuner
        if tuner is None:  # a fixed batch size: the position alone
            return position
        extra = {"pass": self.pass_number, "accumulation_steps": self._accum_steps, "tuner": tuner}
        return position | extra

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """On the next ``iter()``, finish the saved pass if it was in progress, else go on.

        A position within one rank's shard holds only for as many ranks as wrote it.
        """
        saved_world = int(state.get("world", 1))
        if state.get("sharded") and saved_world != self.world:
            raise RunnerError(
                f"loader {self.name!r} was checkpointed on {saved_world} ranks, each on its "
                f"own shard, and cannot resume on {self.world}",
                hint="give gq.AdaptiveDataLoader the whole dataset, not gq_dist.shard(...): "
                "it then splits every batch across however many ranks there are",
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self.pass_number = int(state.get("pass", 0))
        self._finish_interrupted_pass = bool(state["in_progress"])
        tuner = state.get("tuner")
        if tuner is None:
            return
        if self.tuner is not None:
            self.tuner.load_state_dict(tuner)
            self.index = max(0, self.index - self.tuner.use_replicas(self.replicas))
            self._use(self.tuner.config)
        else:
            self._pending_tuner = tuner  # applied when the tuner is created (first iter())
