"""The rows of Sia's ILP, built from the goodput matrix (`gpuq.policies.sia.matrix`).

One binary variable per (job, configuration) pair of G, valued at G after
the restart factor (`gpuq.policies.sia.solve` states the objective). Rows,
each `usage @ x <= capacity`, over GPUs free of unpreemptible jobs:

GPUs per pool
    The GPUs of a pool's chosen configurations fit in its free GPUs (Sia's
    per-type row; pools split a type whose nodes differ in size).
Levels
    gpuq's addition. Per pool and level c = 2, 4, ... R (the single-node
    counts): a node holds at most c x floor(free / c) GPUs in parts of c or
    more, and a part of a GPUs on one node counts c x floor(a / c). Every
    placement satisfies these rows; for Sia's shapes (powers of two, whole
    nodes) they are also what best-fit needs, so they matter once
    unpreemptible jobs leave nodes partly free, which Sia's placer assumes
    away. The level R row is "whole-node configurations within the whole
    free nodes".
Confinement
    Jobs confined to some of a pool's nodes (`JobView.nodes`) fit within
    those nodes' free GPUs, one row per distinct set.

A running job's current configuration counts as the GPUs it holds, node by
node, so keeping every job where it is always satisfies every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import coo_array, csc_array, csr_array

from gpuq.policies.interface import JobView
from gpuq.policies.sia.columns import Columns
from gpuq.policies.sia.configs import Config, Pool
from gpuq.policies.sia.matrix import Row


@dataclass(frozen=True, slots=True)
class Problem:
    """The ILP's pairs (job row, column, value, current or not) and resource rows."""

    owners: NDArray[np.int64]
    columns: NDArray[np.int64]
    values: NDArray[np.float64]
    current: NDArray[np.bool_]
    usage: csr_array
    capacity: NDArray[np.float64]
    offsets: NDArray[np.int64]
    """Where each row's pairs start (and, last, how many there are)."""

    def chosen(self, rows: Sequence[Row], picked: NDArray[np.bool_]) -> dict[int, int]:
        """Job id to the index of its chosen pair, for the jobs `picked` places."""
        result = {}
        for number in np.unique(self.owners[picked]):
            start, end = int(self.offsets[number]), int(self.offsets[number + 1])
            result[rows[number].job.id] = start + int(np.flatnonzero(picked[start:end])[0])
        return result


def build(rows: Sequence[Row], columns: Columns, names: Sequence[str]) -> Problem:
    """The ILP over every row's columns (module docstring)."""
    pools = columns.pools
    levels, capacity = columns.levels()
    # Each column's usage of the level rows, as a sparse (lines x columns) template.
    lines: list[int] = []
    cols: list[int] = []
    amounts: list[float] = []
    for column, config in enumerate(columns.configs):
        for level, line in levels[config.pool]:
            used = config.nodes * level * (config.per_node // level)
            if used:
                lines.append(line)
                cols.append(column)
                amounts.append(float(used))
    reaches = {row.job.id: _reach(row.job, pools, names) for row in rows if row.job.nodes}
    subsets: dict[tuple[int, frozenset[int]], int] = {}
    for reach in reaches.values():
        for pool_index, nodes in reach.items():
            if (pool_index, nodes) not in subsets:
                subsets[(pool_index, nodes)] = len(capacity)
                positions = [pools[pool_index].nodes.index(node) for node in nodes]
                capacity.append(float(columns.room.free[pool_index][positions].sum()))
    template = csc_array(
        coo_array((amounts, (lines, cols)), shape=(len(capacity), len(columns.configs)))
    )
    sizes = np.array([row.columns.size for row in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    owners = np.repeat(np.arange(len(rows), dtype=np.int64), sizes)
    pair_columns = np.concatenate([row.columns for row in rows] or [np.zeros(0, np.int64)])
    values = np.concatenate([row.values for row in rows] or [np.zeros(0)])
    current = pair_columns == np.repeat([row.current_column for row in rows], sizes)
    usage = template[:, pair_columns]
    extra_lines: list[int] = []
    extra_pairs: list[int] = []
    extra_amounts: list[float] = []
    for number, row in enumerate(rows):
        start = int(offsets[number])
        allocation = row.job.allocation
        held = frozenset(i for i, count in enumerate(allocation) if count)
        mine = reaches.get(row.job.id)
        for k in (
            range(row.columns.size)
            if mine
            else np.flatnonzero(current[start : start + row.columns.size])
        ):
            column = int(row.columns[k])
            config = columns.configs[column]
            is_current = column == row.current_column
            if is_current and len({allocation[i] for i in held}) > 1:
                # An uneven current shape: its parts, less the template's even split.
                for level, line in levels[config.pool]:
                    used = sum(level * (allocation[i] // level) for i in held)
                    even = config.nodes * level * (config.per_node // level)
                    if used != even:
                        extra_lines.append(line)
                        extra_pairs.append(start + int(k))
                        extra_amounts.append(float(used - even))
            where = held if is_current else (mine or {}).get(config.pool)
            if where is None or not subsets:
                continue
            for (pool_index, nodes), line in subsets.items():
                if pool_index == config.pool and where <= nodes:
                    extra_lines.append(line)
                    extra_pairs.append(start + int(k))
                    extra_amounts.append(float(config.gpus))
    if extra_lines:
        usage = usage + coo_array((extra_amounts, (extra_lines, extra_pairs)), shape=usage.shape)
    return Problem(
        owners,
        pair_columns,
        values,
        current,
        csr_array(usage),
        np.array(capacity, dtype=np.float64),
        offsets,
    )


def _reach(job: JobView, pools: Sequence[Pool], names: Sequence[str]) -> dict[int, frozenset[int]]:
    """Per pool the job is confined within: the nodes it may use there (none: unconfined)."""
    if job.nodes is None:
        return {}
    reach = {}
    for index, pool in enumerate(pools):
        nodes = frozenset(node for node in pool.nodes if job.may_run_on(names[node]))
        if nodes and len(nodes) < len(pool.nodes):
            reach[index] = nodes
    return reach


def config_of(columns: Columns, problem: Problem, pair: int) -> Config:
    """The configuration of pair `pair`."""
    return columns.configs[int(problem.columns[pair])]


__all__ = ["Problem", "build", "config_of"]
