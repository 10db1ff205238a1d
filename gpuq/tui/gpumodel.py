"""GPUs as `gpuq top` draws them: memory bars, utilization history, marks.

Pure code over the GPU objects of the `gpus` request (docs/json-schema.md).
A memory bar is split into gpuq jobs / other processes / free cells; a GPU
with several gpuq jobs resident is *packed*, one whose jobs take turns
(some suspended while another runs) is *time-sliced*. With several servers
the GPUs are grouped by server (`NodeGroup`), each with its health from the
reply's `servers`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpuq.units import format_duration, format_size

Gpu = dict[str, Any]

SPARK_CHARS: Final = "▁▂▃▄▅▆▇█"
HISTORY_LENGTH: Final = 60
"""Utilization samples kept per GPU (one per poll)."""


@dataclass(frozen=True, slots=True)
class MemorySegments:
    """Cell counts of a memory bar: gpuq jobs, other processes, free."""

    gpuq: int
    foreign: int
    free: int


def memory_segments(gpu: Gpu, width: int) -> MemorySegments:
    """Split `width` cells by owner, rounding so any non-zero part shows one cell."""
    total = max(1, int(gpu["memory_total"]))
    gpuq = min(total, max(0, int(gpu.get("memory_gpuq", 0))))
    foreign = min(total - gpuq, max(0, int(gpu.get("memory_foreign", 0))))
    gpuq_cells = _cells(gpuq, total, width)
    foreign_cells = min(width - gpuq_cells, _cells(foreign, total, width))
    return MemorySegments(gpuq_cells, foreign_cells, width - gpuq_cells - foreign_cells)


def _cells(part: int, total: int, width: int) -> int:
    if part <= 0 or width <= 0:
        return 0
    return max(1, min(width, round(part * width / total)))


def sparkline(values: Sequence[float | None], width: int, top: float = 100.0) -> str:
    """The last `width` values as block characters (`None` as a space), right-aligned."""
    recent = list(values)[-width:] if width > 0 else []
    out = []
    for value in recent:
        if value is None:
            out.append(" ")
            continue
        level = min(1.0, max(0.0, value / top)) if top > 0 else 0.0
        out.append(SPARK_CHARS[min(len(SPARK_CHARS) - 1, int(level * len(SPARK_CHARS)))])
    return "".join(out).rjust(width)


def gpu_mark(gpu: Gpu, job_states: Mapping[int, str]) -> str:
    """`time-sliced`, `packed xN`, `whole`, `shared` or `idle` for one GPU."""
    jobs = list(gpu.get("jobs", ()))
    states = [job_states.get(job_id, "") for job_id in jobs]
    if len(jobs) > 1 and "suspended" in states and any(s != "suspended" for s in states):
        return "time-sliced"
    if len(jobs) > 1:
        return f"packed x{len(jobs)}"
    return str(gpu.get("mode", "idle"))


def memory_text(gpu: Gpu) -> str:
    """`12.0G/40.0G` used over total."""
    return f"{format_size(int(gpu['memory_used']))}/{format_size(int(gpu['memory_total']))}"


def utilization_text(gpu: Gpu) -> str:
    """`37%`, or `-` where the GPU does not report utilization."""
    util = gpu.get("utilization")
    return "-" if util is None else f"{util:.0f}%"


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """One server's GPUs, and its health (`None` for the daemon's own server)."""

    node: str
    gpus: list[Gpu]
    server: Mapping[str, Any] | None = None

    @property
    def down(self) -> bool:
        """Whether the daemon's heartbeats find the server down."""
        return self.server is not None and self.server.get("state") == "down"


def node_state_text(group: NodeGroup, now: float) -> str:
    """What a server's header says after its name: GPU count, or why it shows none.

    `4 GPUs`; `down for 5m: ssh: connect to host gpu3 port 22: No route to host`;
    `not checked yet`; `no GPUs`.
    """
    server = group.server or {}
    state = server.get("state", "up")
    reason = server.get("reason")
    if state == "down":
        since = format_duration(max(0.0, now - float(server.get("since") or now)))
        return f"down for {since}" + (f": {reason}" if reason else "")
    if state != "up":
        return "not checked yet" + (f" ({reason})" if reason else "")
    if not group.gpus:
        return "no GPUs"
    return f"{len(group.gpus)} GPU" + ("" if len(group.gpus) == 1 else "s")


@dataclass
class GpuBoard:
    """The latest GPUs document plus a utilization history per GPU."""

    gpus: list[Gpu] = field(default_factory=list)
    backend: str = ""
    history: dict[str, deque[float | None]] = field(default_factory=dict)
    servers: list[dict[str, Any]] = field(default_factory=list)
    """Each configured server's health (the reply's `servers`); empty on one server."""

    @property
    def several_nodes(self) -> bool:
        """Whether GPUs are shown by server: servers configured, or GPUs on several."""
        return bool(self.servers) or len({gpu.get("node", "") for gpu in self.gpus}) > 1

    def groups(self) -> list[NodeGroup]:
        """The GPUs by server: the daemon's own first, then the servers in the config's order.

        A server without GPUs in the sample (down, not checked yet, none) has an empty group.
        """
        hosts = {str(server["host"]): server for server in self.servers}
        by_node: dict[str, list[Gpu]] = {}
        for gpu in self.gpus:
            by_node.setdefault(str(gpu.get("node", "")), []).append(gpu)
        own = [node for node in by_node if node not in hosts]
        return [NodeGroup(node, by_node.get(node, []), hosts.get(node)) for node in own] + [
            NodeGroup(host, by_node.get(host, []), server) for host, server in hosts.items()
        ]

    def update(self, document: Mapping[str, Any]) -> None:
        """Take one `gpus` result and append each GPU's utilization to its history."""
        self.gpus = sorted(document.get("gpus", []), key=lambda g: (g.get("node", ""), g["index"]))
        self.backend = str(document.get("backend", ""))
        self.servers = list(document.get("servers") or [])
        seen = set()
        for gpu in self.gpus:
            seen.add(gpu["uuid"])
            line = self.history.setdefault(gpu["uuid"], deque(maxlen=HISTORY_LENGTH))
            line.append(gpu.get("utilization"))
        for uuid in set(self.history) - seen:
            del self.history[uuid]

    def update_many(self, documents: Iterable[Mapping[str, Any]]) -> None:
        """Take several `gpus` results, oldest first."""
        for document in documents:
            self.update(document)


def gpus_summary(board: GpuBoard) -> str:
    """The status line's GPU part: `4 GPUs (fake)`; with servers, `12 GPUs on 3 servers, 1 down`.

    Empty before the first sample.
    """
    if not board.backend:
        return ""
    if not board.several_nodes:
        return f"{len(board.gpus)} GPUs ({board.backend})"
    groups = board.groups()
    down = sum(group.down for group in groups)
    text = f"{len(board.gpus)} GPUs on {len(groups)} servers"
    return text + (f", {down} down" if down else "")
