"""Applications per GPU type (the Sia tables) and Sia's bundled workloads.

The rules are in the docstring of gpuq/sim/apps.py; these tests pin each
one against the CSV files, read here on their own by their header names.
"""

from __future__ import annotations

import csv
import io
from importlib import resources

import numpy as np
import pytest

from gpuq.errors import UsageError
from gpuq.sim.apps import (
    APPLICATION_NAMES,
    GPU_TYPES,
    TABLES,
    get_application,
    normalize_placement,
)
from gpuq.sim.interpolate import Triangulation
from gpuq.sim.workload import BUNDLED_WORKLOADS, bundled_workload

# GPU type: (the artifact's file suffix, GPUs per node, most nodes measured).
SIA_TYPES = {
    "T4": ("aws", 4, 16),
    "RTX2080Ti": ("rtx", 8, 3),
    "A100": ("dgx-ext", 8, 2),
    "RTX6000": ("quad", 4, 1),
}
# Sia's simulator: restart delay in seconds and goodput slowdown per model.
SIA_SETTINGS = {
    "bert": (120.0, 1.2),
    "cifar10": (50.0, 1.8),
    "deepspeech2": (25.0, 1.2),
    "imagenet": (250.0, 1.2),
    "ncf": (15.0, 1.5),
    "yolov3": (80.0, 1.2),
}
SIA_PAIRS = [(name, gpu) for name in APPLICATION_NAMES for gpu in GPU_TYPES["sia"]]


def table(name: str, gpu_type: str, kind: str) -> list[dict[str, str]]:
    """The rows of an application's `placements` or `scalability` table for a GPU type."""
    suffix = SIA_TYPES[gpu_type][0]
    if suffix == "aws":  # the Sia artifact's T4 files are Pollux's
        path = ("pollux", name, f"{kind}.csv")
    else:
        path = ("sia", name, f"{kind}-{suffix}.csv")
    text = resources.files("gpuq.sim").joinpath("data", *path).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text)))


def measured_local_bsz(name: str, gpu_type: str) -> list[int]:
    return [int(row["local_bsz"]) for row in table(name, gpu_type, "placements")]


# ---- the table sets and their GPU types -------------------------------------------


def test_the_table_sets_and_their_gpu_types() -> None:
    assert TABLES == ("pollux", "sia")
    assert GPU_TYPES == {"pollux": ("T4",), "sia": ("T4", "RTX2080Ti", "A100", "RTX6000")}


@pytest.mark.parametrize(("name", "gpu_type"), SIA_PAIRS)
def test_every_application_loads_on_every_sia_type(name: str, gpu_type: str) -> None:
    app = get_application(name, gpu_type, "sia")
    _, node_gpus, max_nodes = SIA_TYPES[gpu_type]
    assert (app.name, app.gpu_type) == (name, gpu_type)
    assert (app.node_gpus, app.max_measured_nodes) == (node_gpus, max_nodes)
    assert app is get_application(name, gpu_type, "sia")  # cached


def test_the_defaults_are_the_pollux_t4_tables() -> None:
    app = get_application("bert")
    assert app is get_application("bert", "T4", "pollux")
    assert (app.gpu_type, app.node_gpus, app.max_measured_nodes) == ("T4", 4, 16)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bert", "V100", "sia"), "no GPU type 'V100' in the sia tables; known: T4, RTX2080Ti"),
        (("bert", "A100", "pollux"), "no GPU type 'A100' in the pollux tables; known: T4$"),
        (("bert", "T4", "gavel"), "unknown tables 'gavel'; known: pollux, sia"),
        (("gpt", "A100", "sia"), "unknown application 'gpt'; known: bert, cifar10"),
    ],
)
def test_unknown_types_tables_and_applications_are_refused_with_the_known_ones(
    args: tuple[str, str, str], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        get_application(*args)


# ---- step times -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "gpu_type"), SIA_PAIRS)
def test_measured_placements_are_reproduced_exactly(name: str, gpu_type: str) -> None:
    app = get_application(name, gpu_type, "sia")
    for row in table(name, gpu_type, "placements")[::5]:
        placement = tuple(int(digit) for digit in row["placement"])
        step, sync = app.step_time(placement, int(row["local_bsz"]))
        assert step == pytest.approx(float(row["step_time"]), rel=1e-12)
        assert sync == pytest.approx(min(float(row["sync_time"]), step), rel=1e-12)


def test_scalability_rows_beyond_the_placements_are_reproduced() -> None:
    # The RTX 2080 Ti placements span two nodes; three nodes come from scalability.
    app = get_application("bert", "RTX2080Ti", "sia")
    rows = [r for r in table("bert", "RTX2080Ti", "scalability") if r["num_replicas"] == "3"]
    three_nodes = [r for r in rows if r["num_nodes"] == "3"]
    assert three_nodes
    for row in three_nodes:
        step, sync = app.step_time((1, 1, 1), int(row["local_bsz"]))
        assert step == pytest.approx(float(row["step_time"]), rel=1e-9)
        assert sync == pytest.approx(float(row["sync_time"]), rel=1e-9)


def test_rows_at_the_same_point_are_averaged() -> None:
    # Three A100 GPUs on each of two nodes and 2+2+2 on three nodes (looked
    # up as two, the most measured) both read the mean of every 2-node,
    # 6-GPU row at that batch: placements 15, 24 and 33 and the scalability
    # rows there.
    app = get_application("cifar10", "A100", "sia")
    placements = table("cifar10", "A100", "placements")
    scalability = table("cifar10", "A100", "scalability")
    same = [
        float(r["step_time"])
        for r in placements
        if len(r["placement"]) == 2
        and sum(int(d) for d in r["placement"]) == 6
        and r["local_bsz"] == "64"
    ] + [
        float(r["step_time"])
        for r in scalability
        if (r["num_nodes"], r["num_replicas"], r["local_bsz"]) == ("2", "6", "64")
    ]
    assert len(same) > 3
    assert app.step_time((2, 2, 2), 64)[0] == pytest.approx(np.mean(same), rel=1e-9)


@pytest.mark.parametrize("gpu_type", ["RTX2080Ti", "A100"])
def test_an_8_gpu_node_is_one_measured_node(gpu_type: str) -> None:
    app = get_application("imagenet", gpu_type, "sia")
    assert normalize_placement((8,), app.node_gpus) == (8,)
    assert normalize_placement((8, 8), app.node_gpus) == (8, 8)
    assert normalize_placement((16,), app.node_gpus) == (8, 8)
    row = next(r for r in table("imagenet", gpu_type, "placements") if r["placement"] == "8")
    assert app.step_time((8,), int(row["local_bsz"]))[0] == float(row["step_time"])
    assert app.step_time((0, 8), 40) == app.step_time((8,), 40)
    assert app.step_time((16,), 40) == app.step_time((8, 8), 40)


def test_on_4_gpu_nodes_8_gpus_are_two_nodes() -> None:
    assert normalize_placement((8,)) == (4, 4)
    for tables in TABLES:
        app = get_application("imagenet", "T4", tables)
        assert app.step_time((8,), 40) == app.step_time((4, 4), 40)


def test_more_nodes_than_measured_are_looked_up_as_the_most_measured() -> None:
    # The Quadro RTX 6000 tables hold one node: two 1-GPU nodes read as one
    # node of two GPUs.
    app = get_application("bert", "RTX6000", "sia")
    assert app.step_time((1, 1), 8) == app.step_time((2,), 8)


def test_a_one_node_table_has_no_volume_to_triangulate() -> None:
    points = np.array([[1.0, r, b] for r in (1, 2, 4) for b in (8, 16)])
    values = np.ones((len(points), 2))
    assert Triangulation(points, values).at((1.0, 2.0, 8.0)) is None


def test_an_a100_is_faster_than_a_t4_for_bert_on_one_gpu() -> None:
    a100 = get_application("bert", "A100", "sia")
    t4 = get_application("bert", "T4", "sia")
    for local_bsz in (4, 8, 12):
        assert a100.step_time((1,), local_bsz)[0] < t4.step_time((1,), local_bsz)[0]


def test_the_sia_t4_tables_are_the_pollux_ones() -> None:
    for name in APPLICATION_NAMES:
        sia, pollux = get_application(name, "T4", "sia"), get_application(name)
        assert sia is not pollux
        assert sia.placements.keys() == pollux.placements.keys()
        assert sia.step_time((4, 4, 2), 16) == pollux.step_time((4, 4, 2), 16)
        assert sia.batch_sizes == pollux.batch_sizes
        assert sia.grad_params(1, 1000) == pollux.grad_params(1, 1000)


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_single_gpu_throughput_is_the_largest_one_gpu_batch_over_its_step_time(name: str) -> None:
    for gpu_type in GPU_TYPES["sia"]:
        rows = [r for r in table(name, gpu_type, "placements") if r["placement"] == "1"]
        largest = max(rows, key=lambda r: int(r["local_bsz"]))
        expected = int(largest["local_bsz"]) / float(largest["step_time"])
        app = get_application(name, gpu_type, "sia")
        assert app.single_gpu_throughput() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_an_a100_projects_faster_than_a_t4_for_every_application(name: str) -> None:
    a100 = get_application(name, "A100", "sia").single_gpu_throughput()
    t4 = get_application(name, "T4", "sia").single_gpu_throughput()
    assert a100 / t4 > 1


# ---- per-GPU batch bounds and Sia's settings -----------------------------------------


@pytest.mark.parametrize(("name", "gpu_type"), SIA_PAIRS)
def test_per_gpu_batch_bounds_are_the_measured_range(name: str, gpu_type: str) -> None:
    app = get_application(name, gpu_type, "sia")
    measured = measured_local_bsz(name, gpu_type)
    if (name, gpu_type) == ("deepspeech2", "RTX2080Ti"):
        assert max(measured) == 80
        assert app.local_bsz_bounds == (min(measured), 57)  # Sia's cap
    else:
        assert app.local_bsz_bounds == (min(measured), max(measured))


def test_yolov3_keeps_its_cap_of_8_only_in_the_pollux_tables() -> None:
    assert get_application("yolov3").local_bsz_bounds == (4, 8)
    for gpu_type in GPU_TYPES["sia"]:
        high = get_application("yolov3", gpu_type, "sia").local_bsz_bounds[1]
        assert high == max(measured_local_bsz("yolov3", gpu_type))
    assert get_application("yolov3", "T4", "sia").local_bsz_bounds == (4, 16)
    assert get_application("yolov3", "A100", "sia").local_bsz_bounds == (4, 32)


@pytest.mark.parametrize(("name", "gpu_type"), SIA_PAIRS)
def test_restart_delays_and_slowdowns_are_sias(name: str, gpu_type: str) -> None:
    app = get_application(name, gpu_type, "sia")
    assert (app.restart_delay, app.slowdown) == SIA_SETTINGS[name]


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_the_pollux_tables_keep_the_flat_penalty_and_no_slowdown(name: str) -> None:
    app = get_application(name)
    assert (app.restart_delay, app.slowdown) == (None, 1.0)


@pytest.mark.parametrize(
    ("tables", "gpu_type"), [("pollux", "T4"), *(("sia", g) for g in GPU_TYPES["sia"])]
)
def test_ncf_runs_its_fixed_batch_on_one_gpu_in_both_sets(tables: str, gpu_type: str) -> None:
    ncf = get_application("ncf", gpu_type, tables)
    assert (ncf.fixed_batch_size, ncf.max_replicas) == (32768, 1)


# ---- Sia's workloads ---------------------------------------------------------------


SIA_WORKLOADS = [f"philly-{i}" for i in range(1, 5)] + [f"saturn-{i}" for i in range(1, 6)]


@pytest.mark.parametrize("name", SIA_WORKLOADS)
def test_sia_workloads_are_bundled_with_160_jobs_in_time_order(name: str) -> None:
    assert name in BUNDLED_WORKLOADS
    jobs = bundled_workload(name)
    assert len(jobs) == 160
    times = [job.time for job in jobs]
    assert times == sorted(times) and times[-1] < 8 * 3600
    assert {job.application for job in jobs} <= set(APPLICATION_NAMES)


def test_sia_philly_workloads_have_no_ncf_and_saturn_is_mostly_cifar10() -> None:
    for i in range(1, 5):
        assert all(job.application != "ncf" for job in bundled_workload(f"philly-{i}"))
    for i in range(1, 6):
        jobs = bundled_workload(f"saturn-{i}")
        assert sum(job.application == "cifar10" for job in jobs) > len(jobs) / 2


def test_unknown_sia_workloads_are_refused() -> None:
    with pytest.raises(UsageError, match="no bundled workload 'philly-5'"):
        bundled_workload("philly-5")
