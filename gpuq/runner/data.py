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

Loaders are told apart in checkpoints by name, ``loader0``, ``loader1``... in
order of creation; give ``name=`` when a script creates several in an order
that may change.

The batch size is fixed for now: ``max_batch_size`` is validated and kept for
the goodput tuning that will change ``batch_size`` between passes.

The loader draws nothing from torch's global generator (a plain DataLoader
draws its worker seed there at every ``iter()``), so resuming does not shift
the random numbers the model sees. Random augmentation in worker processes
(``num_workers > 0``) is reproducible per epoch, but not across a resume in
the middle of one; with ``num_workers=0`` it draws from the checkpointed
generators and is exact.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from gpuq.runner.job import RunnerError, current_job

_MIX = 0x9E3779B97F4A7C15


def _seed_for(seed: int, epoch: int, stream: int) -> int:
    """A distinct 63-bit seed per (seed, epoch, stream)."""
    return (seed * _MIX + epoch * 1_000_003 + stream) % (1 << 63)


class _PositionedBatchSampler(Sampler[list[int]]):
    """Batches of one pass over a permutation fixed by (seed, epoch), from a sample offset."""

    def __init__(
        self, size: int, batch_size: int, shuffle: bool, seed: int, drop_last: bool
    ) -> None:
        self.size, self.batch_size, self.shuffle = size, batch_size, shuffle
        self.seed, self.drop_last = seed, drop_last
        self.epoch, self.start = 0, 0

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(_seed_for(self.seed, self.epoch, 0))
            order: list[int] = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        for begin in range(self.start, self.size, self.batch_size):
            batch = order[begin : begin + self.batch_size]
            if self.drop_last and len(batch) < self.batch_size:
                return
            yield batch

    def __len__(self) -> int:
        if self.drop_last:
            return self.size // self.batch_size
        return -(-self.size // self.batch_size)


class AdaptiveDataLoader:
    """A resumable `DataLoader`: shuffled per epoch from `seed`, checkpointed position."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        *,
        max_batch_size: int | None = None,
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
        if batch_size < 1 or (max_batch_size is not None and max_batch_size < batch_size):
            raise RunnerError(f"bad batch sizes: {batch_size=} {max_batch_size=}")
        clashing = {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "generator"}
        if clashing & set(loader_kwargs):
            raise RunnerError(f"AdaptiveDataLoader sets {sorted(clashing & set(loader_kwargs))}")
        self.dataset = dataset
        self.max_batch_size = max_batch_size
        self.seed = seed
        self._sampler = _PositionedBatchSampler(len(dataset), batch_size, shuffle, seed, drop_last)
        self._generator = torch.Generator()
        self._loader: DataLoader[Any] = DataLoader(
            dataset, batch_sampler=self._sampler, generator=self._generator, **loader_kwargs
        )
        self.epoch = -1
        """The pass under way (-1 before the first)."""
        self.index = 0
        """Samples of this pass the training loop has received."""
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
        """Samples per batch (fixed for now; goodput tuning will change it between passes)."""
        return self._sampler.batch_size

    def __len__(self) -> int:
        """Batches in a full pass."""
        return len(self._sampler)

    def __iter__(self) -> Iterator[Any]:
        if self._finish_interrupted_pass:
            self._finish_interrupted_pass = False
        else:
            self.epoch, self.index = self.epoch + 1, 0
        self._sampler.epoch, self._sampler.start = self.epoch, self.index
        self._generator.manual_seed(_seed_for(self.seed, self.epoch, 1))
        self._in_progress = True
        try:
            for batch in self._loader:
                self.index = min(self.index + self.batch_size, self._sampler.size)
                yield batch
        finally:  # the loop ended, or broke out and dropped this generator
            self._in_progress = False

    def state_dict(self) -> dict[str, Any]:
        """The position: the latest pass, the samples it delivered, and whether it goes on."""
        return {
            "epoch": self.epoch,
            "index": self.index,
            "in_progress": self._in_progress or self._finish_interrupted_pass,
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """On the next ``iter()``, finish the saved pass if it was in progress, else go on."""
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._finish_interrupted_pass = bool(state["in_progress"])
