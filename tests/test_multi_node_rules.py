"""The rules of multi-node jobs and of spread, without a daemon.

A daemon job is one process (`JobView.spread` 1: its GPUs on one server) or
a multi-node job (`--nodes N`: spread N, the same count on each of N
servers). Submission checks (gpuq/protocol.py), placement
(gpuq/policies/placement.py, gpuq/policies/fifo.py), the gpuq policy and
the binding safety net (gpuq/daemon/scheduler/binding.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.daemon.scheduler.binding import placements
from gpuq.errors import UsageError
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.gpuq.policy import GpuqPolicy
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView
from gpuq.policies.placement import Capacity, Hardware
from gpuq.policies.pollux.policy import PolluxPolicy
from gpuq.protocol import validate_spec

G = 1024**3


def cluster(*jobs: JobView, sizes: tuple[int, ...] = (2, 3, 3)) -> ClusterState:
    """Nodes n0, n1, n2 with `sizes` GPUs (`n1/0`, ...), in node order."""
    names = [f"n{i}" for i in range(len(sizes))]
    gpus = tuple(
        GpuView(f"{name}/{g}", name, 24 * G)
        for name, size in zip(names, sizes, strict=True)
        for g in range(size)
    )
    return ClusterState(
        nodes=tuple(NodeView(name, size) for name, size in zip(names, sizes, strict=True)),
        jobs=tuple(sorted(jobs, key=lambda job: job.id)),
        gpus=gpus,
    )


def job(job_id: int, gpus: int, spread: int | None = 1, **fields: object) -> JobView:
    return JobView(job_id, float(job_id), gpus_requested=gpus, min_gpus=gpus, max_gpus=gpus,
                   spread=spread, **fields)  # type: ignore[arg-type]  # fmt: skip


def running(job_id: int, *uuids: str, spread: int = 1) -> JobView:
    return replace(job(job_id, len(uuids), spread), gpu_uuids=uuids)


def nodes_of(uuids: tuple[str, ...]) -> list[str]:
    return [uuid.split("/")[0] for uuid in uuids]


def nodes_at(state: ClusterState, gpus: tuple[int, ...] | None) -> list[str]:
    """The nodes of GPU positions `gpus` (what `Capacity.choose` returns)."""
    return [state.gpus[i].node for i in gpus or ()]


# -- submission -------------------------------------------------------------------------


def spec(**fields: object) -> dict[str, object]:
    return {"command": ["true"], "cwd": "/", **fields}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"node_count": 0, "gpus": 2}, "--nodes must be from 1 to 256, got 0"),
        ({"node_count": -1, "gpus": -1}, "--nodes must be from 1 to 256, got -1"),
        ({"node_count": 2, "gpus": 3}, "--gpus 3 cannot be split evenly over --nodes 2"),
        ({"node_count": 2, "gpus": 0}, "--nodes 2 needs a GPU on each server, got --gpus 0"),
        ({"node_count": 2, "gpus": 2, "gpus_max": 4}, "a GPU range resizes the job"),
        ({"node_count": 2, "gpus": 2, "gpu_mem": G}, "--nodes takes whole GPUs on each server"),
        ({"node_count": "2"}, "spec.node_count"),
    ],
)
def test_impossible_multi_node_specs_are_refused_with_the_reason(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        validate_spec(spec(**fields))


def test_the_tasks_of_an_array_cannot_span_servers() -> None:
    with pytest.raises(UsageError, match="an array task cannot span servers") as caught:
        validate_spec(spec(node_count=2, gpus=2), array=True)
    assert caught.value.hint == "submit --nodes jobs one by one"
    assert validate_spec(spec(gpus=2), array=True).node_count == 1


def test_a_multi_node_spec_is_accepted_and_single_node_is_the_default() -> None:
    assert validate_spec(spec(node_count=2, gpus=8)).node_count == 2
    plain = validate_spec(spec())
    assert plain.node_count == 1 and not plain.multi_node


# -- choosing GPUs -----------------------------------------------------------------------


def test_spread_one_keeps_a_job_on_one_server_where_spanning_would_fit() -> None:
    state = cluster(running(9, "n1/0", "n2/0"))
    capacity = Capacity.from_state(state)
    # 4 GPUs are free in all (n0 2, n1 2, n2 2) but no server has 3.
    assert capacity.choose(3, None, False) is not None  # the simulator's jobs may span
    assert capacity.choose(3, None, False, spread=1) is None
    assert nodes_at(state, capacity.choose(2, None, False, spread=1)) == ["n0", "n0"]


def test_a_multi_node_job_gets_the_same_count_on_each_of_its_servers_fullest_first() -> None:
    state = cluster(running(9, "n2/0"))
    capacity = Capacity.from_state(state)
    chosen = capacity.choose(4, None, False, spread=2)
    assert nodes_at(state, chosen) == ["n0", "n0", "n2", "n2"]  # n0 and n2 have 2 free, n1 3
    assert capacity.choose(6, None, False, spread=2) is None  # 3 on each: only n1 has 3
    assert capacity.choose(3, None, False, spread=3) is not None
    assert capacity.choose(5, None, False, spread=2) is None  # not an even split


def test_a_request_no_set_of_servers_could_ever_hold_is_impossible_with_the_counts() -> None:
    hardware = Hardware(cluster())
    assert hardware.impossible_reason(6, None, 2) is None
    assert hardware.impossible_reason(8, None, 2) == (
        "needs 4 GPUs on each of 2 servers (n0 2, n1 3, n2 3)"
    )
    assert hardware.impossible_reason(4, None, 1) == "needs 4 GPUs on one server (n0 2, n1 3, n2 3)"


@pytest.mark.parametrize("policy", [FifoBackfill(), GpuqPolicy()], ids=["fifo", "gpuq"])
def test_the_lab_policies_place_multi_node_jobs_and_say_what_they_wait_for(
    policy: FifoBackfill | GpuqPolicy,
) -> None:
    assert policy.capabilities.multi_node
    state = cluster(running(9, "n1/0", "n1/1"), job(1, 4, spread=2), job(2, 4, spread=2))
    decision = policy.decide(state, 100.0)
    assert nodes_of(decision.bindings[1]) == ["n0", "n0", "n2", "n2"]
    starts, waiting = placements(state, decision)
    assert [start.job_id for start in starts] == [1]
    assert waiting[2] == "waiting for 2 free GPUs on each of 2 servers (free: n0 0, n1 1, n2 1)"


def test_fifo_says_a_multi_gpu_job_waits_for_one_server_with_room() -> None:
    state = cluster(running(9, "n1/0", "n2/0"), job(1, 3))
    decision = FifoBackfill().decide(state, 100.0)
    assert decision.notes[1] == "waiting for 3 free GPUs on one server (free: n0 2, n1 2, n2 2)"


def test_pollux_never_spreads_the_daemons_single_process_jobs_over_servers() -> None:
    jobs = [replace(job(i, 1), max_gpus=4, adaptive=True) for i in range(1, 3)]
    decision = PolluxPolicy(seed=0).decide(cluster(*jobs, sizes=(2, 2)), 0.0)
    for allocation in decision.allocations.values():
        assert sum(1 for count in allocation if count) <= 1


# -- the binding safety net --------------------------------------------------------------


def test_a_start_of_the_wrong_shape_is_refused_and_the_job_waits_with_the_reason() -> None:
    state = cluster(job(1, 2), job(2, 4, spread=2))
    decision = Decision(
        allocations={1: (1, 1, 0), 2: (0, 1, 3)},
        bindings={1: ("n0/0", "n1/0"), 2: ("n1/1", "n2/0", "n2/1", "n2/2")},
    )
    starts, waiting = placements(state, decision)
    assert starts == []
    assert waiting == {
        1: "not started: the policy gave it GPUs on several servers (1 on n0, 1 on n1); "
        "it runs on one",
        2: "not started: the policy gave it 1 on n1, 3 on n2; "
        "it runs 2 GPU(s) on each of 2 servers",
    }
