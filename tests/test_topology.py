"""GPU topology in placement (see the docstring of gpuq/policies/topology.py).

A multi-GPU job's GPUs come from one link group (PCIe switch or NVLink)
where one has room, else from as few groups as possible, in `fifo` and in
the daemon's binding of count-only allocations; with no topology known,
placement is plain GPU order, as before.
"""

from __future__ import annotations

import pytest

from gpuq.daemon.scheduler.binding import Placement, placements
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView
from gpuq.policies.topology import gpus_label, pick_close

G = 1024**3


def gpus(*groups: str, node: str = "n1") -> list[GpuView]:
    """GPUs 0, 1, ... of `node`, GPU i in link group `groups[i]` ("" unknown)."""
    return [
        GpuView(f"GPU-{i}", node, 40 * G, link_group=group, index=i)
        for i, group in enumerate(groups)
    ]


def state(devices: list[GpuView], *jobs: JobView) -> ClusterState:
    nodes: dict[str, int] = {}
    for device in devices:
        nodes[device.node] = nodes.get(device.node, 0) + 1
    return ClusterState(
        nodes=tuple(NodeView(name, count) for name, count in nodes.items()),
        jobs=tuple(sorted(jobs, key=lambda job: job.id)),
        gpus=tuple(devices),
    )


def waiting(job_id: int, count: int, mem: int | None = None) -> JobView:
    return JobView(job_id, float(job_id), gpus_requested=count, gpu_mem=mem)


def holding(job_id: int, *uuids: str, mem: int | None = None) -> JobView:
    return JobView(
        job_id, 0.0, gpus_requested=len(uuids), gpu_mem=mem, gpu_uuids=uuids, preemptible=False
    )


def group_of(candidate: str) -> str:
    return candidate[0]


@pytest.mark.parametrize(
    ("candidates", "count", "picked"),
    [
        (["a1", "b1", "b2", "a2", "a3"], 2, ["b1", "b2"]),  # the smallest group that fits
        (["a1", "b1", "b2", "a2", "a3"], 3, ["a1", "a2", "a3"]),
        (["a1", "b1", "a2", "b2"], 2, ["a1", "a2"]),  # a tie: the group preferred first
        (["a1", "b1", "b2", "c1", "c2", "c3"], 4, ["b1", "c1", "c2", "c3"]),  # fewest groups
        (["a1", "b1"], 3, ["a1", "b1"]),  # fewer candidates than asked: all of them
        (["a1", "b1", "c1"], 1, ["a1"]),
    ],
)
def test_pick_close_takes_one_group_where_one_fits_else_as_few_as_possible(
    candidates: list[str], count: int, picked: list[str]
) -> None:
    assert pick_close(candidates, group_of, count) == picked


def test_fifo_gives_a_two_gpu_job_two_gpus_of_one_switch() -> None:
    # GPU 0 is taken, so GPU order alone would give GPUs 1 and 2, across switches.
    cluster = state(gpus("s0", "s0", "s1", "s1"), holding(9, "GPU-0"), waiting(1, 2))
    decision = FifoBackfill().decide(cluster, 0.0)
    assert decision.bindings[1] == ("GPU-2", "GPU-3")


def test_fifo_keeps_the_larger_group_whole_for_larger_jobs() -> None:
    cluster = state(gpus("s0", "s0", "s0", "s0", "s1", "s1"), waiting(1, 2), waiting(2, 4))
    decision = FifoBackfill().decide(cluster, 0.0)
    assert decision.bindings[1] == ("GPU-4", "GPU-5")
    assert decision.bindings[2] == ("GPU-0", "GPU-1", "GPU-2", "GPU-3")


def test_fifo_spans_as_few_groups_as_it_can() -> None:
    cluster = state(gpus("s0", "s1", "s1", "s2", "s2", "s2"), waiting(1, 4))
    decision = FifoBackfill().decide(cluster, 0.0)
    assert decision.bindings[1] == ("GPU-1", "GPU-3", "GPU-4", "GPU-5")


def test_fifo_shares_of_a_multi_gpu_job_come_from_one_group() -> None:
    # Best fit alone would pick GPUs 0 and 2 (the least memory left); 2 and 3 share a switch.
    devices = gpus("s0", "s0", "s1", "s1")
    cluster = state(
        devices,
        holding(8, "GPU-0", mem=30 * G),
        holding(9, "GPU-2", mem=30 * G),
        holding(10, "GPU-3", mem=20 * G),
        waiting(1, 2, mem=8 * G),
    )
    decision = FifoBackfill().decide(cluster, 0.0)
    assert decision.bindings[1] == ("GPU-2", "GPU-3")


def test_without_topology_placement_is_gpu_order() -> None:
    cluster = state(gpus("", "", "", ""), holding(9, "GPU-0"), waiting(1, 2))
    assert FifoBackfill().decide(cluster, 0.0).bindings[1] == ("GPU-1", "GPU-2")


def test_binding_places_a_count_only_allocation_within_one_switch() -> None:
    cluster = state(gpus("s0", "s1", "s0", "s1"), holding(9, "GPU-1"), waiting(1, 2))
    decision = Decision(allocations={9: (1,), 1: (2,)})
    starts, _ = placements(cluster, decision)
    assert starts == [Placement(1, ("GPU-0", "GPU-2"))]


def test_binding_without_topology_keeps_gpu_order() -> None:
    cluster = state(gpus("", "", "", ""), holding(9, "GPU-1"), waiting(1, 2))
    starts, _ = placements(cluster, Decision(allocations={9: (1,), 1: (2,)}))
    assert starts == [Placement(1, ("GPU-0", "GPU-2"))]


def test_gpus_are_named_by_their_index_and_node_where_there_are_several() -> None:
    one = state(gpus("", "", ""))
    assert gpus_label(one, [2]) == "GPU 2"
    assert gpus_label(one, [2, 0]) == "GPUs 0, 2"
    two = state([*gpus("", node="a"), *gpus("", node="b")])
    assert gpus_label(two, [1]) == "GPU 0 on b"
