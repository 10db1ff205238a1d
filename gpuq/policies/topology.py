"""GPU topology for placement: which GPUs are close, how to pick close ones, how to name them.

GPUs of one node with the same non-empty `GpuView.link_group` share a PCIe
switch or are joined by NVLink (the NVML backend reads it; fake GPUs declare
it), so the GPUs of a multi-GPU job talk fastest when they come from one
group. A GPU of unknown topology is a group of its own: with no topology
known, every rule here picks GPUs exactly as plain GPU order would.

`pick_close` is the one placement rule, shared by `fifo`'s capacity
(`gpuq.policies.placement`) and the daemon's binding of count-only
allocations (`gpuq.daemon.scheduler.binding`):

- if one group holds enough candidates, the job gets GPUs of one group:
  the group with the fewest candidates that is big enough (best fit, so
  that larger groups stay whole for larger jobs), ties to the group whose
  first candidates enough for the job come earliest in the caller's order
  of preference (for shares: the tightest fit);
- otherwise it spans as few groups as possible: the largest groups first
  (ties in order of preference).

Within a group the caller's order of preference holds (GPU order, or
best-fit by memory for shares). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

from gpuq.policies.interface import ClusterState, GpuView

T = TypeVar("T")


def group_key(gpu: GpuView, position: int) -> Hashable:
    """The key close GPUs share: node and link group; a GPU of unknown topology is alone."""
    return (gpu.node, gpu.link_group) if gpu.link_group else (gpu.node, "", position)


def group_keys(state: ClusterState) -> list[Hashable]:
    """`group_key` of each of `state.gpus`, by position."""
    return [group_key(gpu, i) for i, gpu in enumerate(state.gpus)]


def pick_close(candidates: Sequence[T], key: Callable[[T], Hashable], count: int) -> list[T]:
    """`count` of `candidates` (given in order of preference) from as few groups as possible.

    Returns them in order of preference; fewer than `count` only when there
    are fewer candidates (module docstring).
    """
    groups: dict[Hashable, list[int]] = {}
    for position, candidate in enumerate(candidates):
        groups.setdefault(key(candidate), []).append(position)
    members = list(groups.values())  # in order of each group's first candidate
    fitting = [group for group in members if len(group) >= count]
    if fitting:
        best = min(fitting, key=lambda group: (len(group), group[count - 1], group[0]))
        return [candidates[p] for p in best[:count]]
    chosen: list[int] = []
    for group in sorted(members, key=len, reverse=True):  # stable: ties keep preference
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return [candidates[p] for p in sorted(chosen)]


def spans(keys: Sequence[Hashable], gpus: Iterable[int]) -> int:
    """How many link groups the GPUs (positions in `keys`) span."""
    return len({keys[i] for i in gpus})


def gpu_label(state: ClusterState, position: int) -> str:
    """`GPU 2` (its `gpuq gpus` index, else its position), with its node where there are several."""
    gpu = state.gpus[position]
    number = gpu.index if gpu.index >= 0 else position
    several = len(state.nodes) > 1
    return f"GPU {number} on {gpu.node}" if several else f"GPU {number}"


def gpus_label(state: ClusterState, positions: Iterable[int]) -> str:
    """`GPU 2`, or `GPUs 2, 3` (node added where there are several), for reasons."""
    chosen = list(positions)
    if len(chosen) == 1:
        return gpu_label(state, chosen[0])
    numbers = [str(state.gpus[i].index if state.gpus[i].index >= 0 else i) for i in sorted(chosen)]
    nodes = sorted({state.gpus[i].node for i in chosen})
    where = f" on {', '.join(nodes)}" if len(state.nodes) > 1 else ""
    return f"GPUs {', '.join(numbers)}{where}"


def positions_of(state: ClusterState, uuids: Iterable[str]) -> list[int]:
    """Positions in `state.gpus` of the GPUs named (unknown ones left out)."""
    index = {gpu.uuid: i for i, gpu in enumerate(state.gpus)}
    return [index[uuid] for uuid in uuids if uuid in index]


__all__ = ["gpu_label", "gpus_label", "group_key", "group_keys", "pick_close", "positions_of"]
