"""One decision's columns of G: the standard configurations, then any others a row needs.

Rows refer to configurations by column number, so a decision evaluates the
standard set's shapes, room and ILP rows once, with numpy, rather than per
job. Job-specific configurations (`gpuq.policies.sia.configs`: a spread,
an exact count, a current shape) are appended as rows ask for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpuq.policies.sia.configs import Config, Pool, single_node_counts

IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Room:
    """Per pool: each node's GPUs free of unpreemptible jobs, in pool order."""

    free: tuple[IntArray, ...]

    def fits(self, config: Config, allowed: BoolArray | None = None) -> bool:
        """True if `config` has enough (allowed) nodes with room in its pool."""
        free = self.free[config.pool] if allowed is None else self.free[config.pool][allowed]
        return int(np.count_nonzero(free >= config.per_node)) >= config.nodes


class Columns:
    """Configurations by column number, with their pools, sizes and room."""

    def __init__(
        self, pools: Sequence[Pool], standard: Sequence[Config], room: Room, token: int = 0
    ) -> None:
        self.pools = tuple(pools)
        self.token = token
        """Names the standard set (`GoodputMemo.token`), for memoized values."""
        self.room = room
        self.configs: list[Config] = []
        self._index: dict[Config, int] = {}
        self._fits: list[bool] = []
        self.standard = len(standard)
        for config in standard:
            self.add(config)
        self.types = tuple(dict.fromkeys(pool.gpu_type for pool in self.pools))
        self.type_of_pool = np.array(
            [self.types.index(pool.gpu_type) for pool in self.pools], dtype=np.int64
        )
        self.single_counts = [frozenset(single_node_counts(pool.node_gpus)) for pool in pools]
        self.counts = [
            frozenset(c.gpus for c in standard if c.pool == index) for index in range(len(pools))
        ]
        self._arrays: tuple[IntArray, IntArray, IntArray, BoolArray] | None = None
        pool, nodes, gpus, _ = self.arrays()
        kinds = self.type_of_pool[pool]
        self.standard_by_type = [np.flatnonzero(kinds == kind) for kind in range(len(self.types))]
        """Per type: its standard columns."""
        self.standard_shapes = [
            (nodes[columns], gpus[columns]) for columns in self.standard_by_type
        ]

    def add(self, config: Config) -> int:
        """The column of `config`, appended if new."""
        found = self._index.get(config)
        if found is None:
            found = len(self.configs)
            self.configs.append(config)
            self._index[config] = found
            self._fits.append(self.room.fits(config))
            self._arrays = None
        return found

    def find(self, config: Config | None) -> int:
        """The column of `config`, or -1 (also for None)."""
        return -1 if config is None else self._index.get(config, -1)

    def arrays(self) -> tuple[IntArray, IntArray, IntArray, BoolArray]:
        """Per column: pool, nodes, GPUs, and whether it has room (unconfined)."""
        if self._arrays is None:
            self._arrays = (
                np.array([c.pool for c in self.configs], dtype=np.int64),
                np.array([c.nodes for c in self.configs], dtype=np.int64),
                np.array([c.gpus for c in self.configs], dtype=np.int64),
                np.array(self._fits, dtype=bool),
            )
        return self._arrays

    def levels(self) -> tuple[list[list[tuple[int, int]]], list[float]]:
        """Per pool its level rows as (c, line), and each line's capacity (`problem`)."""
        lines: list[list[tuple[int, int]]] = []
        capacity: list[float] = []
        for index, pool in enumerate(self.pools):
            free = self.room.free[index]
            lines.append([])
            for level in single_node_counts(pool.node_gpus):
                lines[index].append((level, len(capacity)))
                capacity.append(float(np.sum(level * (free // level))))
        return lines, capacity


__all__ = ["Columns", "Room"]
