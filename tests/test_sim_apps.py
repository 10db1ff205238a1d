"""The Pollux applications: measured tables in, step times and progress out.

The rules are in the docstring of gpuq/sim/apps.py; these tests pin each one.
"""

from __future__ import annotations

import csv
import io
from importlib import resources

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.errors import UsageError
from gpuq.goodput import GradParams, efficiency, fit_perf_params
from gpuq.sim.apps import (
    APPLICATION_NAMES,
    APPLICATIONS,
    BatchConfig,
    get_application,
    normalize_placement,
)


def rows(app: str, filename: str) -> list[list[str]]:
    path = resources.files("gpuq.sim").joinpath("data", "pollux", app, filename)
    return list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))[1:]


# Table 1 of the paper with the artifact's limits (notes/ones_pollux.md 3.3).
TABLE_1 = [
    ("bert", 12, 384, (4, 12), 2, "adamw", "sqrt"),
    ("cifar10", 128, 4096, (32, 1024), 100, "sgd", "adascale"),
    ("deepspeech2", 20, 640, (10, 80), 80, "sgd", "adascale"),
    ("imagenet", 200, 12800, (20, 200), 90, "sgd", "adascale"),
    ("ncf", 256, 32768, (32, 32768), 10, "adam", "sqrt"),
    ("yolov3", 8, 512, (4, 8), 50, "sgd", "adascale"),
]


@pytest.mark.parametrize(("name", "m0", "max_batch", "bounds", "epochs", "opt", "lr"), TABLE_1)
def test_settings_match_table_1(
    name: str,
    m0: int,
    max_batch: int,
    bounds: tuple[int, int],
    epochs: int,
    opt: str,
    lr: str,
) -> None:
    app = get_application(name)
    assert (app.init_batch_size, app.max_batch_size, app.local_bsz_bounds) == (
        m0,
        max_batch,
        bounds,
    )
    assert (app.max_epochs, app.optimizer, app.lr_scaler) == (epochs, opt, lr)


def test_ncf_keeps_the_artifacts_special_case() -> None:
    ncf = get_application("ncf")
    assert (ncf.fixed_batch_size, ncf.max_replicas) == (32768, 1)
    assert get_application("cifar10").fixed_batch_size is None


def test_applications_mapping_is_lazy_and_complete() -> None:
    assert tuple(APPLICATIONS) == APPLICATION_NAMES
    assert APPLICATIONS["bert"] is get_application("bert")
    assert "mnist" not in APPLICATIONS
    with pytest.raises(UsageError, match="known: bert, cifar10"):
        get_application("mnist")


@pytest.mark.parametrize(
    ("placement", "key"),
    [
        ((4, 4, 2), (2, 4, 4)),
        ((2, 4, 4), (2, 4, 4)),
        ((4, 2, 4), (2, 4, 4)),
        ((0, 2, 0, 1), (1, 2)),
        ((3, 1, 2), (1, 2, 3)),  # a rotation, not a sort
        ((2, 1, 3), (1, 3, 2)),
        ((8,), (4, 4)),  # bigger nodes count as 4-GPU nodes
        ((6, 1), (1, 4, 2)),
        ((0, 0), ()),
    ],
)
def test_placements_normalize_to_smallest_rotation(
    placement: tuple[int, ...], key: tuple[int, ...]
) -> None:
    assert normalize_placement(placement) == key


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_measured_placements_are_reproduced_exactly(name: str) -> None:
    app = get_application(name)
    for row in rows(name, "placements.csv")[::7]:
        placement = tuple(int(d) for d in row[0])
        step, sync = app.step_time(placement, int(row[1]))
        assert step == pytest.approx(float(row[2]), rel=1e-12)
        assert sync == pytest.approx(min(float(row[3]), float(row[2])), rel=1e-12)


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_scalability_points_are_reproduced_by_the_nd_interpolation(name: str) -> None:
    app = get_application(name)
    for row in rows(name, "scalability.csv")[::5]:
        nodes, replicas = int(row[0]), int(row[1])
        if replicas != nodes:  # only one GPU per node spells the (nodes, replicas) pair
            continue
        step, sync = app.step_time((1,) * nodes, int(row[2]))
        assert step == pytest.approx(float(row[3]), rel=1e-9)
        assert sync == pytest.approx(float(row[4]), rel=1e-9)


def test_a_rotation_of_a_measured_placement_reads_the_same_row() -> None:
    app = get_application("cifar10")
    assert app.step_time((4, 1, 2), 64) == app.step_time((1, 2, 4), 64)
    assert app.step_time((0, 4, 0, 4), 64) == app.step_time((4, 4), 64)


@given(st.sampled_from(APPLICATION_NAMES), st.data())
def test_interpolation_stays_between_measured_neighbours(name: str, data: st.DataObject) -> None:
    app = get_application(name)
    placement = data.draw(st.sampled_from(sorted(app.placements)))
    curve = app.placements[placement]
    i = data.draw(st.integers(0, len(curve.local_bsz) - 2))
    low, high = float(curve.local_bsz[i]), float(curve.local_bsz[i + 1])
    x = data.draw(st.floats(low, high))
    step, _ = app.step_time(placement, x)
    ends = sorted((float(curve.step_time[i]), float(curve.step_time[i + 1])))
    assert ends[0] - 1e-12 <= step <= ends[1] + 1e-12


def test_step_time_grows_with_batch_where_the_measurements_do() -> None:
    app = get_application("imagenet")
    curve = app.placements[(1,)]
    assert np.all(np.diff(curve.step_time) > 0)  # the data is monotone here
    xs = np.linspace(curve.local_bsz[0], curve.local_bsz[-1], 200)
    steps = [app.step_time((1,), float(x))[0] for x in xs]
    assert np.all(np.diff(steps) >= 0)


def test_outside_the_measured_batches_compute_is_flat_below_and_proportional_above() -> None:
    app = get_application("imagenet")
    curve = app.placements[(1,)]
    low, high = float(curve.local_bsz[0]), float(curve.local_bsz[-1])
    at_low, at_high = app.step_time((1,), low), app.step_time((1,), high)
    assert app.step_time((1,), low / 2) == at_low
    step, sync = app.step_time((1,), 2 * high)
    assert sync == at_high[1]
    assert step - sync == pytest.approx(2 * (at_high[0] - at_high[1]))


def test_beyond_the_measured_hull_the_nearest_group_is_extrapolated() -> None:
    app = get_application("cifar10")
    # 64 GPUs on 16 nodes were measured up to 182 per GPU; ask for 4096.
    measured = [r for r in rows("cifar10", "scalability.csv") if r[:2] == ["16", "64"]]
    last = max(measured, key=lambda r: int(r[2]))
    step_182, sync_182 = float(last[3]), float(last[4])
    step, sync = app.step_time((4,) * 16, 4096)
    assert sync == pytest.approx(sync_182)
    assert step - sync == pytest.approx((step_182 - sync_182) * 4096 / int(last[2]))
    # 17 nodes are looked up as 16 (the artifact's cap), 65 GPUs as the nearest group.
    assert app.step_time((4,) * 16 + (1,), 100) == app.step_time((4,) * 16, 100)


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_grad_params_read_the_table_at_measured_batch_sizes(name: str) -> None:
    app = get_application(name)
    for batch in app.batch_sizes:
        table = rows(name, f"validation-{batch}.csv")
        for epoch in (0, app.max_epochs - 1):
            grad = app.grad_params(epoch, batch)
            assert grad == GradParams(float(table[epoch][3]), float(table[epoch][4]))


def test_grad_params_interpolate_linearly_and_clamp_at_the_ends() -> None:
    app = get_application("cifar10")
    low, high = app.grad_params(3, 128), app.grad_params(3, 256)
    middle = app.grad_params(3, 192)
    assert middle.sqr == pytest.approx((low.sqr + high.sqr) / 2)
    assert middle.var == pytest.approx((low.var + high.var) / 2)
    assert app.grad_params(3, 64) == low
    assert app.grad_params(3, 10**6) == app.grad_params(3, 4096)


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_efficiency_at_m0_is_one_in_every_epoch(name: str) -> None:
    app = get_application(name)
    m0 = app.init_batch_size
    for epoch in range(app.max_epochs):
        grad = app.grad_params(epoch, m0)
        assert efficiency(grad, m0, m0) == pytest.approx(1.0)
        assert app.gain(epoch, m0) == pytest.approx(1.0)
        assert 1.0 <= app.gain(epoch, app.max_batch_size) <= app.max_batch_size / m0


@pytest.mark.parametrize("name", APPLICATION_NAMES)
def test_epoch_boundaries_are_the_smallest_progress_over_batch_sizes(name: str) -> None:
    app = get_application(name)
    bounds = app.epoch_progress
    assert len(bounds) == app.max_epochs + 1 and bounds[0] == 0.0
    assert all(b > a for a, b in zip(bounds, bounds[1:], strict=False))
    tables = [rows(name, f"validation-{b}.csv") for b in app.batch_sizes]
    for epoch in (1, app.max_epochs):
        assert bounds[epoch] == min(float(t[epoch - 1][0]) for t in tables)
    assert app.completion_progress == bounds[-1]


def test_remaining_iterations_run_from_the_total_down_to_zero() -> None:
    app = get_application("cifar10")
    total = app.total_iterations(2048)
    assert total == float(rows("cifar10", "validation-2048.csv")[99][1])
    assert app.remaining_iterations(2048, 0.0) == total
    assert app.remaining_iterations(2048, app.completion_progress) == 0.0
    marks = np.linspace(0.0, app.completion_progress, 50)
    left = [app.remaining_iterations(2048, float(p)) for p in marks]
    assert np.all(np.diff(left) <= 0)
    # Between measured batch sizes the counts interpolate linearly.
    assert app.total_iterations(3072) == pytest.approx(
        (app.total_iterations(2048) + app.total_iterations(4096)) / 2
    )


@pytest.mark.parametrize(
    ("name", "replicas", "batch", "config"),
    [
        ("cifar10", 1, 128, BatchConfig(128, 0)),  # M0 on one GPU: no accumulation
        ("cifar10", 1, 512, BatchConfig(256, 1)),  # one GPU above M0: two micro-batches
        ("cifar10", 6, 2048, BatchConfig(342, 0)),  # rounded up per GPU
        ("cifar10", 1, 4096, BatchConfig(1024, 3)),  # accumulate to fit 1024 per GPU
        ("ncf", 1, 32768, BatchConfig(16384, 1)),
        ("bert", 48, 384, BatchConfig(8, 0)),
        ("yolov3", 2, 64, BatchConfig(8, 3)),  # YOLOv3 is capped at 8 per GPU
        ("bert", 1, 1000, BatchConfig(12, 31)),  # clamped to the task's largest batch
        ("cifar10", 6, 4096, BatchConfig(682, 0)),  # rounding up would exceed it
    ],
)
def test_fixed_batch_config_follows_the_artifacts_rule(
    name: str, replicas: int, batch: int, config: BatchConfig
) -> None:
    assert get_application(name).fixed_batch_config(replicas, batch) == config


def test_profile_samples_are_what_the_agent_fits() -> None:
    app = get_application("cifar10")
    sample = app.profile_sample((0, 2, 2), 128)
    step, sync = app.step_time((2, 2), 128)
    assert sample == (2, 4, 128, step - sync, step)
    nodes, replicas, local_bsz, accum, optim = app.measured_samples()
    assert len(nodes) == sum(len(c.local_bsz) for c in app.placements.values())
    assert np.all(accum < optim) and np.all(nodes <= replicas)
    perf = fit_perf_params(nodes[:40], replicas[:40], local_bsz[:40], accum[:40], optim[:40])
    assert perf.beta_c > 0
