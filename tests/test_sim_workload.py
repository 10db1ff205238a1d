"""Workloads: bundled traces, CSV files, and the Pollux recipe generator.

The recipe and its lab-scale variant are in the docstring of
gpuq/sim/workload.py; the 64-GPU expectations come from notes/ones_pollux.md 3.4.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpuq.errors import UsageError
from gpuq.sim.apps import get_application
from gpuq.sim.workload import (
    BUNDLED_WORKLOADS,
    WorkloadJob,
    bundled_workload,
    generate_workload,
    lab_workload,
    load_workload,
    packed_placement,
    tuned_configurations,
    write_workload,
)

EIGHT_HOURS = 8 * 3600


@pytest.mark.parametrize(
    ("name", "count"),
    [(f"workload-{i}", 160) for i in range(1, 5)]
    + [(f"workload-0.5-{i}", 80) for i in range(1, 5)],
)
def test_bundled_workloads_load_with_their_job_counts(name: str, count: int) -> None:
    jobs = bundled_workload(name)
    assert len(jobs) == count
    times = [job.time for job in jobs]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < EIGHT_HOURS
    assert len({job.name for job in jobs}) == count
    for job in jobs:
        assert (job.num_replicas, job.batch_size) in {
            (k, b) for k, b, _ in tuned_configurations(job.application)
        }


def test_bundled_names_are_listed_and_unknown_ones_refused() -> None:
    assert BUNDLED_WORKLOADS[0] == "workload-1" and "workload-0.5-4" in BUNDLED_WORKLOADS
    with pytest.raises(UsageError) as error:
        bundled_workload("workload-9")
    assert error.value.hint is not None and "workload-0.5-1" in error.value.hint


def test_csv_round_trips(tmp_path: Path) -> None:
    jobs = bundled_workload("workload-0.5-2")
    path = tmp_path / "w.csv"
    path.write_text(write_workload(jobs))
    assert load_workload(path) == jobs


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name,time,application\nx,0,bert\n", "missing column"),
        ("name,time,application,num_replicas,batch_size\nx,0,mnist,1,8\n", "unknown application"),
        ("name,time,application,num_replicas,batch_size\nx,soon,bert,1,8\n", "line 2"),
        ("name,time,application,num_replicas,batch_size\nx,0,bert,0,8\n", "GPUs >= 1"),
        (
            "name,time,application,num_replicas,batch_size\nx,soon,bert,1,8\n",
            "line 2: time 'soon' is not a number of seconds",
        ),
        ("name,time,application,num_replicas,batch_size\nx,nan,bert,1,8\n", "time 'nan'"),
        (
            "name,time,application,num_replicas,batch_size\nx,0,bert,two,8\n",
            "line 2: num_replicas 'two' is not a whole number",
        ),
        ("name,time,application,num_replicas,batch_size\nx,0\n", "line 2: no application"),
        ("name,time,application,num_replicas,batch_size\n", "has no jobs, only its header"),
        ("", "missing column"),
        ("name,time,application,num_replicas,batch_size\nx,0,bert,1,\x008\n", "line 2"),
    ],
)
def test_malformed_csv_is_refused_with_its_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_workload(path)


def test_a_file_that_is_not_utf8_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UsageError, match="is not UTF-8 text"):
        load_workload(path)


def test_a_spreadsheet_s_byte_order_mark_is_no_column(tmp_path: Path) -> None:
    path = tmp_path / "sheet.csv"
    path.write_bytes(b"\xef\xbb\xbfname,time,application,num_replicas,batch_size\nx,0,bert,1,8\n")
    assert load_workload(path)[0].name == "x"


def test_a_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot read workload"):
        load_workload(tmp_path / "none.csv")


# The artifact's TunedJobs choices on 64 GPUs, as read from its workload-6 (notes 3.4).
ARTIFACT_TUNED = {
    "cifar10": {(6, 2048), (8, 2048), (12, 4096), (16, 4096)},
    "deepspeech2": {(6, 320), (8, 320), (12, 640)},
    "bert": {(6, 384), (8, 384), (12, 384), (16, 384)},
    "ncf": {(1, 32768)},
    "imagenet": {(24, 3200), (32, 6400), (48, 6400)},
    "yolov3": {(4, 64)},
}


@pytest.mark.parametrize(("application", "expected"), sorted(ARTIFACT_TUNED.items()))
def test_tuned_rule_reproduces_the_artifacts_choices(
    application: str, expected: set[tuple[int, int]]
) -> None:
    assert {(k, b) for k, b, _ in tuned_configurations(application)} == expected


def test_tuned_rule_scales_between_half_and_four_fifths() -> None:
    app = get_application("cifar10")
    (k1, _, base), *_ = tuned_configurations("cifar10", cluster_gpus=1)
    assert k1 == 1
    for replicas, batch, jct in tuned_configurations("cifar10"):
        assert 0.5 < base / (jct * replicas) < 0.8 and jct < 12 * 3600
        assert batch in app.batch_sizes


@pytest.mark.parametrize(("gpus", "most"), [(4, 4), (8, 8), (16, 16)])
def test_small_clusters_cap_gpu_counts_and_fall_back_to_the_largest_good_count(
    gpus: int, most: int
) -> None:
    for application in ARTIFACT_TUNED:
        configs = tuned_configurations(application, cluster_gpus=gpus)
        assert configs and all(k <= most for k, _, _ in configs)
    # No count qualifies for ImageNet on a lab: it gets every GPU it still uses well.
    ((replicas, _, _),) = tuned_configurations("imagenet", cluster_gpus=gpus)
    assert replicas == most


def test_packed_placement_fills_nodes_first() -> None:
    assert packed_placement(10, 4) == (4, 4, 2)
    assert packed_placement(8, 8) == (8,)
    assert packed_placement(3, 4) == (3,)


def test_generator_is_deterministic_per_seed() -> None:
    assert generate_workload(7) == generate_workload(7)
    assert generate_workload(7) != generate_workload(8)
    assert generate_workload(7, variant="realistic") == generate_workload(7, variant="realistic")


def test_generator_follows_the_recipe_statistics() -> None:
    mix: Counter[str] = Counter()
    for seed in range(4):
        jobs = generate_workload(seed)
        assert len(jobs) == 160
        assert all(0 <= job.time < EIGHT_HOURS for job in jobs)
        assert [job.time for job in jobs] == sorted(job.time for job in jobs)
        assert max(job.time for job in jobs) > 7 * 3600  # the window is used to its end
        for job in jobs:
            assert (job.num_replicas, job.batch_size) in ARTIFACT_TUNED[job.application]
        mix.update(job.application for job in jobs)
    share = {name: count / 640 for name, count in mix.items()}
    # Philly's window: 78% small, 15% medium, 5% large, 2% extra large (notes 3.4).
    assert 0.70 < share["cifar10"] + share["ncf"] < 0.86
    assert abs(share["cifar10"] - share["ncf"]) < 0.08
    assert 0.10 < share["deepspeech2"] + share["bert"] < 0.22
    assert abs(share["deepspeech2"] - share["bert"]) < 0.06
    assert 0.02 < share["yolov3"] < 0.09
    assert share.get("imagenet", 0.0) < 0.05


def test_realistic_variant_uses_trace_gpu_counts_and_m0_per_gpu() -> None:
    jobs = generate_workload(3, variant="realistic")
    assert Counter(job.num_replicas for job in jobs).most_common(1)[0][0] == 1
    for job in jobs:
        app = get_application(job.application)
        assert job.batch_size == app.init_batch_size * job.num_replicas
        assert job.batch_size <= app.max_batch_size and job.num_replicas <= 64


@pytest.mark.parametrize(("load", "count"), [(0.5, 80), (1.0, 160), (1.5, 240), (2.0, 320)])
def test_load_multiplies_the_job_count(load: float, count: int) -> None:
    assert len(generate_workload(1, load=load)) == count


@pytest.mark.parametrize(("gpus", "count"), [(4, 10), (8, 20), (16, 40)])
def test_lab_variants_scale_jobs_and_gpu_counts(gpus: int, count: int) -> None:
    for seed in range(3):
        for variant in ("tuned", "realistic"):
            jobs = generate_workload(seed, cluster_gpus=gpus, variant=variant)
            assert len(jobs) == count
            assert all(job.num_replicas <= gpus for job in jobs)


def test_the_lab_variant_is_thirty_jobs_for_one_eight_gpu_server_whatever_the_cluster() -> None:
    from gpuq.sim.run import resolve_workload

    jobs = lab_workload(1)
    assert len(jobs) == 30 and all(job.num_replicas <= 8 for job in jobs)
    assert jobs == generate_workload(1, load=1.5, cluster_gpus=8, gpus_per_node=8)
    assert resolve_workload("lab:1", 64, 4) == resolve_workload("lab:1", 8, 8) == jobs
    realistic = resolve_workload("lab:1:realistic:2", 8, 8)
    assert realistic == lab_workload(1, variant="realistic", load=2.0) and len(realistic) == 40
    with pytest.raises(UsageError, match="bad generated workload"):
        resolve_workload("lab:one", 8, 8)


def test_a_four_gpu_lab_never_gets_imagenet() -> None:
    # Extra-large needs 100 GPU-hours x 64/4 = 1600 of trace GPU-time: all filtered out.
    apps = {
        job.application for seed in range(10) for job in generate_workload(seed, cluster_gpus=4)
    }
    assert "imagenet" not in apps


def test_hours_bounds_the_arrival_window() -> None:
    jobs = generate_workload(2, hours=2)
    assert all(job.time < 2 * 3600 for job in jobs)


@pytest.mark.parametrize(
    "arguments",
    [{"variant": "mixed"}, {"hours": 0}, {"load": 0.0}, {"cluster_gpus": 0}],
)
def test_bad_generator_arguments_are_usage_errors(arguments: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        generate_workload(0, **arguments)  # type: ignore[arg-type]


def test_workload_jobs_are_plain_values() -> None:
    job = WorkloadJob("bert-0", 12.0, "bert", 6, 384)
    assert job == WorkloadJob("bert-0", 12.0, "bert", 6, 384)
