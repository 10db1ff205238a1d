"""`--gpu-type`: a job runs only on GPUs of its types, on any server, under every policy.

The view turns a GPU type into nodes (`gpuq.daemon.scheduler.view`): a
server with GPUs of several types is a node per type, so every policy's
node constraint keeps such a job to its GPUs. A type no GPU has, or too few
of on one server, is refused at submission; one whose GPUs are all down
waits, saying which types are up.
"""

from __future__ import annotations

import pytest

from gpuq.daemon.scheduler.binding import misshaped
from gpuq.daemon.scheduler.constraints import Constraints, check_gpu_types
from gpuq.daemon.scheduler.view import build_state, view_nodes
from gpuq.daemon.state import GpuSnapshot
from gpuq.errors import ResourceError
from gpuq.models import GpuInfo, Job, JobSpec, JobState
from gpuq.policies.interface import JobView, NodeView

G = 1024**3


def gpu(uuid: str, index: int, name: str, node: str) -> GpuInfo:
    return GpuInfo(uuid, index, name, 40 * G, 0, node=node)


MIXED = [
    gpu("a0", 0, "NVIDIA A100-SXM4-40GB", "head"),
    gpu("l0", 1, "NVIDIA L4", "head"),
    gpu("l1", 2, "NVIDIA L4", "head"),
    gpu("t0", 0, "Tesla T4", "gpu2"),
]


def queued(job_id: int, **spec: object) -> Job:
    return Job(job_id, JobSpec(command=("true",), cwd="/", **spec), JobState.QUEUED)  # type: ignore[arg-type]


def test_a_server_with_several_types_is_a_node_per_type_in_the_view() -> None:
    assert view_nodes(MIXED) == {
        "a0": ("head/A100", "A100"),
        "l0": ("head/L4", "L4"),
        "l1": ("head/L4", "L4"),
        "t0": ("gpu2", "T4"),
    }
    state = build_state([], [], GpuSnapshot(devices=MIXED), 0.05, 0, lambda job: None)
    assert state.nodes == (
        NodeView("head/A100", 1, "A100"),
        NodeView("head/L4", 2, "L4"),
        NodeView("gpu2", 1, "T4"),
    )
    assert [g.node for g in state.gpus] == ["head/A100", "head/L4", "head/L4", "gpu2"]


def test_a_jobs_types_and_servers_become_the_views_nodes() -> None:
    jobs = [
        queued(1, gpu_types=("a100",)),
        queued(2, gpu_types=("L4", "T4")),
        queued(3, nodes=("head",)),
        queued(4),
        queued(5, nodes=("head",), gpu_types=("T4",)),
    ]
    state = build_state(
        jobs,
        [],
        GpuSnapshot(devices=MIXED),
        0.05,
        0,
        lambda job: None,
        nodes_of=lambda spec: frozenset({"head"}) if spec.nodes else None,
    )
    nodes = {view.id: view.nodes for view in state.jobs}
    assert nodes[1] == frozenset({"head/A100"})
    assert nodes[2] == frozenset({"head/L4", "gpu2"})
    assert nodes[3] == frozenset({"head/A100", "head/L4"})  # the server, all its types
    assert nodes[4] is None
    assert nodes[5] == frozenset()  # no T4 on the head: placed nowhere


def test_without_types_a_homogeneous_cluster_looks_as_it_did() -> None:
    same = [gpu("a", 0, "Fake L4", "head"), gpu("b", 0, "Fake L4", "gpu2")]
    state = build_state(
        [queued(1, nodes=("gpu2",))],
        [],
        GpuSnapshot(devices=same),
        0.05,
        0,
        lambda job: None,
        nodes_of=lambda spec: frozenset(spec.nodes),
    )
    assert state.nodes == (NodeView("head", 1, "L4"), NodeView("gpu2", 1, "L4"))
    assert state.jobs[0].nodes == frozenset({"gpu2"})


def test_a_type_no_gpu_has_is_refused_naming_the_types_there_are() -> None:
    with pytest.raises(ResourceError) as caught:
        check_gpu_types(JobSpec(("true",), "/", gpu_types=("H100",)), MIXED, [])
    assert caught.value.message == (
        "no GPU of type H100: the GPUs are A100 (head 1); L4 (head 2); T4 (gpu2 1)"
    )
    assert "gpuq gpus --json" in (caught.value.hint or "")


def test_more_gpus_of_a_type_than_one_server_has_are_refused() -> None:
    with pytest.raises(
        ResourceError, match=r"needs 2 GPU\(s\) of type A100 on one server; .*head 1"
    ):
        check_gpu_types(JobSpec(("true",), "/", gpus=2, gpu_types=("A100",)), MIXED, [])
    check_gpu_types(JobSpec(("true",), "/", gpus=2, gpu_types=("l4",)), MIXED, [])


def test_a_type_is_not_refused_while_a_server_is_unseen() -> None:
    check_gpu_types(JobSpec(("true",), "/", gpu_types=("H100",)), MIXED, ["gpu3"])


def test_a_job_whose_types_are_not_up_waits_saying_which_are() -> None:
    constraints = Constraints(
        {"head": (), "gpu2": ()},
        frozenset({"head"}),
        types={"head": frozenset({"A100", "L4"})},
    )
    spec = JobSpec(("true",), "/", gpu_types=("T4",))
    assert constraints.waiting(spec) == "waiting for a GPU of type T4 (GPU types up: head A100/L4)"
    assert constraints.waiting(JobSpec(("true",), "/", gpu_types=("L4",))) is None


def test_the_parts_of_a_multi_node_job_never_go_to_two_types_of_one_server() -> None:
    state = build_state([], [], GpuSnapshot(devices=MIXED), 0.05, 0, lambda job: None)
    node_of = {g.uuid: g.node for g in state.gpus}
    server_of = {g.uuid: g.server or g.node for g in state.gpus}
    assert [g.server for g in state.gpus] == ["head", "head", "head", ""]
    gang = JobView(id=1, submit_time=0.0, gpus_requested=2, spread=2)
    assert misshaped(node_of, gang, ("a0", "l0"), server_of) == (
        "the policy gave it GPUs of several types of one server (1 on head/A100, 1 on head/L4)"
    )
    assert misshaped(node_of, gang, ("a0", "t0"), server_of) == ""
