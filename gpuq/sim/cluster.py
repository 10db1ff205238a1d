"""The simulated cluster: its nodes, their GPU types, and which measured tables they use.

A cluster is a list of nodes, each with a GPU count and a GPU type; the
simulator runs each job on the measured tables of the type it holds
(`gpuq.sim.apps`). Two table sets exist: `pollux` (the Pollux artifact's,
T4 only; the simulator's flat restart penalty, no calibration) and `sia`
(the Sia artifact's: T4, RTX2080Ti, A100 and RTX6000, with Sia's per-model
restart delays and calibration).

`load_cluster(spec)` reads a bundled name or a TOML file:

    tables = "sia"          # optional: "sia" (default) or "pollux"

    [[nodes]]
    type = "A100"           # a type of the tables, any case
    gpus = 8                # GPUs per node
    count = 2               # optional: that many nodes alike (default 1)
    name = "dgx"            # optional: node names dgx0, dgx1 (default: the type)

Bundled clusters (`BUNDLED_CLUSTERS`):

- `pollux`: 16 nodes of 4 T4, the Pollux tables: the simulator's default,
  what `--nodes 16 --gpus-per-node 4` gives;
- `sia`: Sia's heterogeneous 64 GPUs (its paper's Table 3): 6 nodes of 4
  T4, 3 of 8 RTX2080Ti and 2 of 8 A100;
- `sia-t4`: Sia's homogeneous 64 GPUs (Table 4): 16 nodes of 4 T4, Sia's
  tables and settings;
- `phoebe`: Sia's physical testbed (44 GPUs): 3 nodes of 8 RTX2080Ti, 2 of
  8 A100, 1 of 4 RTX6000.

Nodes are kept in file order. Node counts per type beyond what was measured
are looked up as the largest measured (`gpuq.sim.apps`). Pure apart from
reading the file: no simulator state.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq.errors import UsageError
from gpuq.policies.interface import NodeView
from gpuq.sim.apps import GPU_TYPES

TABLE_TYPES = GPU_TYPES
"""The GPU types each table set measured."""

CLUSTER_HINT = (
    "give a bundled cluster (pollux, sia, sia-t4, phoebe) or a TOML file of "
    "[[nodes]] with type, gpus and count (see `gpuq sim --help`)"
)


@dataclass(frozen=True, slots=True)
class SimCluster:
    """The nodes of a simulated cluster, in order, and the tables its jobs run on."""

    nodes: tuple[NodeView, ...]
    tables: str = "pollux"

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(node.gpus for node in self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types present, in node order, once each."""
        return tuple(dict.fromkeys(node.gpu_type for node in self.nodes))

    @property
    def mixed(self) -> bool:
        """True when the nodes have more than one GPU type."""
        return len(self.gpu_types) > 1

    def describe(self) -> str:
        """A one-line summary, such as `6x4 T4 + 3x8 RTX2080Ti + 2x8 A100 (64 GPUs, sia tables)`."""
        groups: dict[tuple[str, int], int] = {}
        for node in self.nodes:
            key = (node.gpu_type, node.gpus)
            groups[key] = groups.get(key, 0) + 1
        parts = " + ".join(f"{count}x{gpus} {kind}" for (kind, gpus), count in groups.items())
        return f"{parts} ({self.total_gpus} GPUs, {self.tables} tables)"


def uniform_cluster(nodes: int, gpus_per_node: int, tables: str = "pollux") -> SimCluster:
    """`nodes` nodes of `gpus_per_node` T4 GPUs (the Pollux artifact's cluster shape)."""
    if nodes < 1 or gpus_per_node < 1:
        raise UsageError(
            "--nodes and --gpus-per-node must be at least 1", "e.g. --nodes 4 --gpus-per-node 8"
        )
    return SimCluster(
        tuple(NodeView(f"node{i}", gpus_per_node, "T4") for i in range(nodes)), tables
    )


def _group(kind: str, gpus: int, count: int, prefix: str | None = None) -> list[dict[str, Any]]:
    return [{"type": kind, "gpus": gpus, "count": count, "name": prefix or kind.lower()}]


BUNDLED_CLUSTERS: dict[str, dict[str, Any]] = {
    "pollux": {"tables": "pollux", "nodes": _group("T4", 4, 16, "node")},
    "sia": {
        "tables": "sia",
        "nodes": _group("T4", 4, 6) + _group("RTX2080Ti", 8, 3, "rtx") + _group("A100", 8, 2),
    },
    "sia-t4": {"tables": "sia", "nodes": _group("T4", 4, 16)},
    "phoebe": {
        "tables": "sia",
        "nodes": _group("RTX2080Ti", 8, 3, "rtx")
        + _group("A100", 8, 2)
        + _group("RTX6000", 4, 1, "quadro"),
    },
}
"""The clusters `load_cluster` knows by name (module docstring)."""


def load_cluster(spec: str) -> SimCluster:
    """The cluster named `spec` (bundled) or described by the TOML file `spec`."""
    if spec in BUNDLED_CLUSTERS:
        return parse_cluster(BUNDLED_CLUSTERS[spec], spec)
    path = Path(spec)
    if not path.is_file():
        raise UsageError(f"no cluster file or bundled cluster {spec!r}", hint=CLUSTER_HINT)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"cannot read cluster file {spec}: {error}", hint=CLUSTER_HINT) from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"cluster file {spec} is not valid TOML: {error}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise UsageError(
            f"cluster file {spec} is not valid TOML: arrays or tables nested too deeply",
            hint=CLUSTER_HINT,
        ) from None
    return parse_cluster(data, spec)


def parse_cluster(data: dict[str, Any], source: str) -> SimCluster:
    """A `SimCluster` from parsed TOML (module docstring); UsageError naming `source`."""
    unknown = sorted(set(data) - {"tables", "nodes"})
    if unknown:
        raise UsageError(f"{source}: unknown key {unknown[0]!r}", hint=CLUSTER_HINT)
    tables = data.get("tables", "sia")
    if tables not in TABLE_TYPES:
        raise UsageError(
            f"{source}: unknown tables {tables!r}; known: {', '.join(TABLE_TYPES)}",
            hint=CLUSTER_HINT,
        )
    groups = data.get("nodes")
    if not isinstance(groups, list) or not groups:
        raise UsageError(f"{source}: no [[nodes]]", hint=CLUSTER_HINT)
    known = {kind.lower(): kind for kind in TABLE_TYPES[tables]}
    nodes: list[NodeView] = []
    for number, group in enumerate(groups, 1):
        where = f"{source}: nodes entry {number}"
        if not isinstance(group, dict):
            raise UsageError(f"{where} is not a table", hint=CLUSTER_HINT)
        extra = sorted(set(group) - {"type", "gpus", "count", "name"})
        if extra:
            raise UsageError(f"{where}: unknown key {extra[0]!r}", hint=CLUSTER_HINT)
        kind = group.get("type")
        if not isinstance(kind, str) or kind.lower() not in known:
            raise UsageError(
                f"{where}: GPU type {kind!r} has no {tables} tables; "
                f"known: {', '.join(TABLE_TYPES[tables])}",
                hint=CLUSTER_HINT,
            )
        gpus, count = _whole(group, "gpus", None, where), _whole(group, "count", 1, where)
        prefix = group.get("name", known[kind.lower()].lower())
        if not isinstance(prefix, str) or not prefix:
            raise UsageError(f"{where}: name must be a non-empty string")
        start = sum(1 for node in nodes if node.name.rstrip("0123456789") == prefix)
        nodes.extend(
            NodeView(f"{prefix}{start + i}", gpus, known[kind.lower()]) for i in range(count)
        )
    names = [node.name for node in nodes]
    if len(set(names)) != len(names):
        raise UsageError(f"{source}: node names repeat; give each group its own name")
    if sum(node.gpus for node in nodes) > 65536:
        raise UsageError(f"{source}: more than 65536 GPUs")
    return SimCluster(tuple(nodes), tables)


def _whole(group: dict[str, Any], key: str, default: int | None, where: str) -> int:
    """`group[key]` as a whole number from 1 to 4096 (`default` when absent, if any)."""
    value = group.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise UsageError(f"{where}: {key} must be a whole number from 1 to 4096", hint=CLUSTER_HINT)
    return value


__all__ = [
    "BUNDLED_CLUSTERS",
    "SimCluster",
    "TABLE_TYPES",
    "load_cluster",
    "parse_cluster",
    "uniform_cluster",
]
