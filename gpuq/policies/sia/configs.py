"""Sia's configuration set: the (GPU type, nodes, GPUs) shapes a job can be given.

Pools
    Nodes are grouped by GPU type (`NodeView.gpu_type`; a cluster whose nodes
    all have type "" is one type, "") and GPU count, in node order. Sia (3.2)
    assumes every type is N nodes of R GPUs; a type whose nodes differ in
    size becomes one pool per size, so a configuration never spans two
    pools, hence never two types. Nodes without GPUs belong to no pool.
Standard set
    For a pool of N nodes of R GPUs, Sia's set: single-node 1, 2, 4, ... GPUs
    (the powers of two below R) and R; multi-node whole nodes 2R, 3R, ... NR,
    up to `max_gpus` (the artifact's families stop at 64). The default mixed
    cluster, 6 x 4 + 3 x 8 + 2 x 8 GPUs, has 19 configurations. The paper
    splits a node whose R is not a power of two into virtual nodes; we keep
    the node whole and add R itself, which the placer's best fit handles.
Job-specific configurations
    - `spread` s (the daemon's multi-node jobs, `JobView.spread`): s = 1
      keeps the single-node set; s > 1 gives s nodes with the same count c
      on each, for every single-node count c (c = R is the whole-node one).
    - An exact count k that the set lacks (a rigid job of 3 GPUs, or a
      minimum of 12 on 8-GPU nodes): k GPUs split evenly over the fewest
      nodes that hold them (over exactly s nodes with a spread).
    - A running job's current shape (`current_config`), whatever it is, so
      that keeping it is always an option.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuq.policies.interface import NodeView


@dataclass(frozen=True, slots=True)
class Pool:
    """Nodes of one GPU type and size: indices into `ClusterState.nodes`."""

    gpu_type: str
    node_gpus: int
    nodes: tuple[int, ...]

    @property
    def gpus(self) -> int:
        """GPUs in the pool."""
        return self.node_gpus * len(self.nodes)


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """A configuration: `gpus` GPUs on `nodes` nodes of pool `pool`, the same count on each.

    Only a job's current shape (`current_config`) may split its GPUs unevenly;
    it is then only ever kept, never placed anew.
    """

    pool: int
    nodes: int
    gpus: int

    @property
    def per_node(self) -> int:
        """GPUs on each of its nodes."""
        return self.gpus // self.nodes


def pools_of(nodes: Sequence[NodeView]) -> tuple[Pool, ...]:
    """The cluster's pools, in order of their first node (module docstring)."""
    members: dict[tuple[str, int], list[int]] = {}
    for index, node in enumerate(nodes):
        if node.gpus > 0:
            members.setdefault((node.gpu_type, node.gpus), []).append(index)
    return tuple(Pool(kind, size, tuple(ids)) for (kind, size), ids in members.items())


def single_node_counts(node_gpus: int) -> tuple[int, ...]:
    """1, 2, 4, ... below `node_gpus`, then `node_gpus` itself."""
    counts = []
    count = 1
    while count < node_gpus:
        counts.append(count)
        count *= 2
    return (*counts, node_gpus)


def standard_configs(pools: Sequence[Pool], max_gpus: int) -> tuple[Config, ...]:
    """Sia's configuration set over `pools`, pool by pool (module docstring)."""
    configs: list[Config] = []
    for index, pool in enumerate(pools):
        configs.extend(Config(index, 1, count) for count in single_node_counts(pool.node_gpus))
        configs.extend(
            Config(index, n, n * pool.node_gpus)
            for n in range(2, len(pool.nodes) + 1)
            if n * pool.node_gpus <= max_gpus
        )
    return tuple(configs)


def spread_configs(index: int, pool: Pool, spread: int) -> tuple[Config, ...]:
    """The configurations over exactly `spread` nodes of a pool (module docstring)."""
    if spread < 1 or spread > len(pool.nodes):
        return ()
    return tuple(Config(index, spread, spread * c) for c in single_node_counts(pool.node_gpus))


def exact_config(index: int, pool: Pool, gpus: int, spread: int | None) -> Config | None:
    """`gpus` GPUs split evenly over the fewest nodes (or `spread` nodes); None if impossible."""
    if gpus < 1:
        return None
    spans = [spread] if spread is not None else range(1, len(pool.nodes) + 1)
    for nodes in spans:
        if 1 <= nodes <= len(pool.nodes) and gpus % nodes == 0:
            if gpus // nodes <= pool.node_gpus:
                return Config(index, nodes, gpus)
    return None


def current_config(
    pools: Sequence[Pool], pool_of_node: Sequence[int], allocation: Sequence[int]
) -> Config | None:
    """The configuration a running job holds: None if it holds none or spans pools."""
    held = [(node, count) for node, count in enumerate(allocation) if count > 0]
    if not held:
        return None
    pool = pool_of_node[held[0][0]]
    if pool < 0 or any(pool_of_node[node] != pool for node, _ in held):
        return None
    return Config(pool, len(held), sum(count for _, count in held))


def pool_of_nodes(pools: Sequence[Pool], node_count: int) -> list[int]:
    """For each node of the state, its pool's index (-1: a node without GPUs)."""
    owner = [-1] * node_count
    for index, pool in enumerate(pools):
        for node in pool.nodes:
            owner[node] = index
    return owner


def describe(config: Config, pools: Sequence[Pool]) -> str:
    """'4 A100 GPUs on 1 node', for notes."""
    kind = pools[config.pool].gpu_type
    what = f"{kind} GPU" if kind else "GPU"
    plural = "s" if config.gpus != 1 else ""
    nodes = f"{config.nodes} node{'s' if config.nodes != 1 else ''}"
    return f"{config.gpus} {what}{plural} on {nodes}"


__all__ = [
    "Config",
    "Pool",
    "current_config",
    "describe",
    "exact_config",
    "pool_of_nodes",
    "pools_of",
    "single_node_counts",
    "spread_configs",
    "standard_configs",
]
