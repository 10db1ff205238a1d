"""Placement constraints, pure parts: the spec, the eligible nodes, waiting, binding, fit.

See the docstring of gpuq/daemon/scheduler/constraints.py. The known nodes
here are `head` (this machine, labelled fast-disk), `gpu2` (a100) and
`gpu3` (a100, nvlink).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuq.cli.submit import build_spec, parse_submit_args
from gpuq.config import DefaultsConfig, load_config
from gpuq.daemon.handlers.submit import check_fits
from gpuq.daemon.scheduler.binding import Placement, placements
from gpuq.daemon.scheduler.constraints import (
    Constraints,
    check_submit,
    eligible_nodes,
    known_nodes,
)
from gpuq.daemon.scheduler.view import ViewCache, build_state
from gpuq.daemon.state import GpuSnapshot
from gpuq.errors import ResourceError, UsageError
from gpuq.models import GpuInfo, Job, JobSpec, JobState
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView
from gpuq.protocol import validate_spec

G = 1024**3
KNOWN = {"head": ("fast-disk",), "gpu2": ("a100",), "gpu3": ("a100", "nvlink")}


def spec(**constraints: Any) -> JobSpec:
    return JobSpec(**{"command": ("true",), "cwd": "/", **constraints})


def job(job_id: int, gpus: int = 1, **constraints: Any) -> Job:
    return Job(job_id, spec(gpus=gpus, **constraints), JobState.QUEUED)


# -- the spec ------------------------------------------------------------------------------


def test_the_submit_options_accept_repeats_and_comma_lists() -> None:
    values, command = parse_submit_args(
        ["--node", "gpu2,gpu3", "--exclude-node=head", "--label", "a100", "--label", "nvlink", "x"]
    )
    wire, _ = build_spec(values, command, DefaultsConfig(), 0.0)
    assert (wire["nodes"], wire["exclude_nodes"], wire["labels"]) == (
        ["gpu2", "gpu3"],
        ["head"],
        ["a100", "nvlink"],
    )
    unconstrained, _ = build_spec({}, ["x"], DefaultsConfig(), 0.0)
    assert "nodes" not in unconstrained  # an older daemon still takes it


def test_the_constraint_survives_the_wire_and_the_store() -> None:
    sent = spec(nodes=("gpu2", "ana@gpu3"), exclude_nodes=("head",), labels=("a100",))
    data = sent.to_dict()
    assert data["nodes"] == ["gpu2", "ana@gpu3"] and data["labels"] == ["a100"]
    assert validate_spec(data) == sent
    assert JobSpec.from_dict({k: v for k, v in data.items() if k != "labels"}).labels == ()


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("nodes", ["-oProxyCommand=x"], "--node: invalid name '-oProxyCommand=x'"),
        ("nodes", ["gpu2 gpu3"], "--node: invalid name"),
        ("exclude_nodes", [""], "--exclude-node: invalid name ''"),
        ("labels", ["-x"], "--label: invalid name '-x'"),
        ("labels", ["a@b"], "--label: invalid name 'a@b'"),
        ("nodes", "gpu2", "expected tuple[str, ...]"),
        ("labels", [3], "expected str"),
    ],
)
def test_a_bad_name_is_refused(field: str, value: object, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        validate_spec({"command": ["true"], "cwd": "/", field: value})
    assert words in caught.value.message


def test_a_node_both_wanted_and_excluded_is_refused() -> None:
    with pytest.raises(UsageError, match="--node and --exclude-node both name gpu2"):
        validate_spec({"command": ["x"], "cwd": "/", "nodes": ["gpu2"], "exclude_nodes": ["gpu2"]})


# -- eligible nodes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("constraints", "eligible"),
    [
        ({}, None),
        ({"nodes": ("gpu2",)}, {"gpu2"}),
        ({"nodes": ("gpu2", "head")}, {"gpu2", "head"}),
        ({"exclude_nodes": ("head",)}, {"gpu2", "gpu3"}),
        ({"labels": ("a100",)}, {"gpu2", "gpu3"}),
        ({"labels": ("a100", "nvlink")}, {"gpu3"}),
        ({"labels": ("a100",), "exclude_nodes": ("gpu3",)}, {"gpu2"}),
        ({"nodes": ("head",), "labels": ("a100",)}, set()),
    ],
)
def test_the_eligible_nodes_meet_every_constraint(
    constraints: dict[str, tuple[str, ...]], eligible: set[str] | None
) -> None:
    found = eligible_nodes(spec(**constraints), KNOWN)
    assert found == (None if eligible is None else frozenset(eligible))


def test_the_known_nodes_are_this_machine_and_the_configured_servers(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '[daemon]\nnode_name = "head"\nlabels = ["fast-disk"]\n'
        '[[cluster.servers]]\nhost = "gpu2"\nlabels = ["a100"]\n'
        '[[cluster.servers]]\nhost = "ana@gpu3"\n'
    )
    config = load_config(str(path), environ={})
    assert known_nodes(config) == {"head": ("fast-disk",), "gpu2": ("a100",), "ana@gpu3": ()}


# -- at submission -------------------------------------------------------------------------


def test_an_unknown_node_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(UsageError) as caught:
        check_submit(spec(nodes=("gpu9", "gpu2")), KNOWN)
    assert caught.value.message == "unknown node gpu9: the known nodes are head, gpu2, gpu3"
    assert caught.value.hint is not None and "gpuq cluster add gpu9" in caught.value.hint


def test_a_label_no_node_carries_is_refused_with_every_nodes_labels() -> None:
    with pytest.raises(UsageError) as caught:
        check_submit(spec(labels=("a100", "h100")), KNOWN)
    assert caught.value.message == (
        "no node carries label h100: the nodes' labels are head (fast-disk), gpu2 (a100), "
        "gpu3 (a100, nvlink)"
    )


def test_constraints_no_node_meets_together_are_refused_with_each_nodes_reason() -> None:
    with pytest.raises(UsageError) as caught:
        check_submit(spec(exclude_nodes=("gpu3",), labels=("nvlink",)), KNOWN)
    assert caught.value.message == (
        "no node meets the job's placement constraints (head: no label nvlink; "
        "gpu2: no label nvlink; gpu3: excluded)"
    )


def test_constraints_some_node_meets_are_accepted() -> None:
    check_submit(spec(labels=("a100",), exclude_nodes=("gpu2",)), KNOWN)
    check_submit(spec(), KNOWN)


# -- at each pass --------------------------------------------------------------------------


def test_a_job_none_of_whose_nodes_is_up_waits_naming_them() -> None:
    constraints = Constraints(
        KNOWN, frozenset({"head"}), {"gpu2": "down: connection refused", "gpu3": "not reached yet"}
    )
    one = job(1, nodes=("gpu2",))
    two = job(2, labels=("a100",))
    free = job(3)
    here = job(4, labels=("fast-disk",))
    cpu, gpu, waiting = constraints.hold([one, two, free, here], "head")
    assert (cpu, gpu) == ([], [free, here])
    assert waiting == {
        1: "waiting for node gpu2 (down: connection refused)",
        2: "no eligible node is up: gpu2 (down: connection refused), gpu3 (not reached yet)",
    }


def test_a_job_the_config_no_longer_lets_run_anywhere_waits_saying_why() -> None:
    constraints = Constraints({"head": ()}, frozenset({"head"}))
    _, _, waiting = constraints.hold([job(1, labels=("a100",))], "head")
    assert waiting == {1: "no node meets its placement constraints now (head: no label a100)"}


def dirs_on(table: Mapping[tuple[str, str], bool | None]) -> Any:
    """What the other servers said of working directories: exists, missing, or not yet asked."""
    return lambda node, path: table.get((node, path))


def test_a_job_runs_only_where_its_working_directory_exists() -> None:
    said = {("gpu2", "/home/ada"): True, ("gpu3", "/home/ada"): False}
    constraints = Constraints(KNOWN, frozenset(KNOWN), {}, dirs_on(said), "head")
    assert constraints.nodes_of(spec(cwd="/home/ada")) == frozenset({"head", "gpu2"})
    assert constraints.nodes_of(spec(cwd="/home/ada", labels=("a100",))) == frozenset({"gpu2"})
    everywhere = {**said, ("gpu3", "/home/ada"): True}
    anywhere = Constraints(KNOWN, frozenset(KNOWN), {}, dirs_on(everywhere), "head")
    assert anywhere.nodes_of(spec(cwd="/home/ada")) is None  # no restriction at all


def test_a_job_whose_directory_is_on_none_of_its_nodes_waits_saying_where() -> None:
    said = {("gpu3", "/scratch/x"): False}
    constraints = Constraints(KNOWN, frozenset(KNOWN), {}, dirs_on(said), "head")
    missing = Job(1, spec(nodes=("gpu3",), cwd="/scratch/x"), JobState.QUEUED)
    unknown = Job(2, spec(nodes=("gpu2",), cwd="/scratch/x"), JobState.QUEUED)
    _, gpu, waiting = constraints.hold([missing, unknown], "head")
    assert gpu == []
    assert waiting == {
        1: "its working directory /scratch/x does not exist on gpu3",
        2: "checking its working directory on gpu2",
    }


def test_a_cpu_only_job_starts_here_only_if_this_node_is_one_of_its_own() -> None:
    constraints = Constraints(KNOWN, frozenset({"head"}))
    here, there = job(1, gpus=0, exclude_nodes=("gpu2",)), job(2, gpus=0, nodes=("gpu2",))
    cpu, gpu, waiting = constraints.hold([here, there], "head")
    assert (cpu, gpu) == ([here], [])
    assert waiting == {2: "runs only on gpu2; CPU-only jobs start on head only"}


# -- the view and the binding --------------------------------------------------------------


def two_node_snapshot() -> GpuSnapshot:
    return GpuSnapshot(
        devices=[
            GpuInfo("h0", 0, "Fake", 40 * G, 0, node="head"),
            GpuInfo("g0", 0, "Fake", 40 * G, 0, node="gpu2"),
        ],
        foreign_memory={},
    )


def test_the_view_gives_each_job_its_nodes_and_a_running_job_keeps_its_own() -> None:
    constraints = Constraints(KNOWN, frozenset({"head", "gpu2"}))
    running = Job(
        5, spec(labels=("a100",)), JobState.RUNNING, start_time=1.0, gpu_uuids=("h0",)
    )  # started on head before a reload took head's a100 label away
    ready = [job(1, labels=("a100",)), job(2)]
    cache = ViewCache()
    views = build_state(
        ready, [running], two_node_snapshot(), 0.0, 0, lambda j: None, cache=cache,
        nodes_of=constraints.nodes_of,
    ).jobs  # fmt: skip
    assert [view.nodes for view in views] == [
        frozenset({"gpu2", "gpu3"}),
        None,
        frozenset({"gpu2", "gpu3", "head"}),
    ]
    fewer = Constraints({"head": (), "gpu2": ("a100",)}, frozenset({"head", "gpu2"}))
    again = build_state(
        ready, [], two_node_snapshot(), 0.0, 0, lambda j: None, cache=cache,
        nodes_of=fewer.nodes_of,
    ).jobs  # fmt: skip
    assert again[0].nodes == frozenset({"gpu2"})  # a reload's labels reach a cached view


def binding_state(*jobs: JobView) -> ClusterState:
    return ClusterState(
        nodes=(NodeView("head", 1), NodeView("gpu2", 1)),
        jobs=jobs,
        gpus=(GpuView("h0", "head", 40 * G), GpuView("g0", "gpu2", 40 * G)),
    )


def test_the_binding_never_starts_a_job_on_a_node_it_may_not_use() -> None:
    only_gpu2 = JobView(1, 0.0, nodes=frozenset({"gpu2"}))
    state = binding_state(only_gpu2)
    refusal = (
        "not started: the policy placed it on head, where it may not run (it runs only on gpu2)"
    )
    for decision in (
        Decision(allocations={1: (1, 0)}),
        Decision(allocations={1: (1, 0)}, bindings={1: ("h0",)}),
    ):
        assert placements(state, decision) == ([], {1: refusal})
    assert placements(state, Decision(allocations={1: (0, 1)})) == ([Placement(1, ("g0",))], {})


# -- the GPUs a job is judged against at submission ----------------------------------------


def gpus_of(**counts: int) -> list[GpuInfo]:
    return [
        GpuInfo(f"{node}-{i}", i, "Fake", 40 * G, 0, node=node)
        for node, count in counts.items()
        for i in range(count)
    ]


def fits(devices: list[GpuInfo], **asked: Any) -> str | None:
    """The refusal's message, or None if the job is accepted."""
    try:
        check_fits(spec(**asked), devices, KNOWN, "head", 0.05)
    except ResourceError as exc:
        return exc.message
    return None


def test_a_job_is_judged_against_the_gpus_of_its_own_nodes() -> None:
    devices = gpus_of(head=2, gpu2=4, gpu3=1)
    assert fits(devices, gpus=4, nodes=("gpu2",)) is None
    assert fits(devices, gpus=4, nodes=("head",)) == "the job needs 4 GPUs; this server has 2"
    assert fits(devices, gpus=6, labels=("a100",)) == "the job needs 6 GPUs; gpu2, gpu3 have 5"
    assert fits(devices, gpus=8) == "the job needs 8 GPUs; gpu2, gpu3, head have 7"
    assert fits(devices, gpus=1, gpu_mem=39 * G, nodes=("gpu3",)) == (
        "--gpu-mem 39G is more than any GPU on gpu3 can give (38.0G after the 5% safety margin)"
    )


def test_a_server_whose_gpus_are_not_seen_never_makes_a_job_refused() -> None:
    devices = gpus_of(head=2, gpu2=4)  # gpu3 is down, or not sampled yet
    assert fits(devices, gpus=64, nodes=("gpu3",)) is None
    assert fits(devices, gpus=64) is None
    assert fits(devices, gpus=64, exclude_nodes=("gpu3",)) == (
        "the job needs 64 GPUs; gpu2, head have 6"
    )
