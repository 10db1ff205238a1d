"""The pure layer of `gpuq top`: rows, filters, sorting, diffs, bars and charts."""

from __future__ import annotations

from typing import Any

import pytest

from gpuq.errors import UsageError
from gpuq.tui.gpumodel import GpuBoard, gpu_mark, memory_segments, sparkline
from gpuq.tui.model import (
    COLUMNS,
    JobFilter,
    QueueModel,
    job_facts,
    row_cells,
    summary_line,
    time_cell,
)
from gpuq.tui.series import build_series, merge_samples, plot_rows

NOW = 1_800_000_000.0
GIB = 1024**3


def job(job_id: int, state: str = "queued", **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": job_id,
        "name": f"train{job_id}",
        "user": "ana",
        "state": state,
        "reason": "",
        "exit_code": None,
        "signal": None,
        "gpus": 1,
        "gpu_mem": None,
        "gpu_uuids": [],
        "gpu_mem_reserved": None,
        "node": "",
        "priority": 0,
        "submit_time": NOW - 100,
        "start_time": None,
        "end_time": None,
        "attempts": 0,
        "array_id": None,
        "array_index": None,
        "stdout": "",
        "stderr": "",
        "spec": {"command": ["python", "train.py"], "cwd": "/tmp", "retries": 0, "after": []},
    }
    base.update(changes)
    return base


def test_row_cells_follow_the_column_order() -> None:
    running = job(
        7,
        "running",
        gpu_mem=6 * GIB,
        gpu_mem_reserved=6 * GIB,
        gpu_uuids=["GPU-a"],
        start_time=NOW - 3723,
        array_index=2,
        priority=5,
        reason="started",
        node="gpu2",
    )
    cells = dict(zip(COLUMNS, row_cells(running, NOW), strict=True))
    assert cells == {
        "id": "7",
        "state": "running",
        "user": "ana",
        "name": "train7[2]",
        "gpus": "1x6.0G",
        "memory": "6.0G",
        "node": "gpu2",
        "time": "1h02m",
        "priority": "5",
        "reason": "started",
    }


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, "1m40s"),  # pending: time waited
        ({"state": "running", "start_time": NOW - 30}, "30s"),
        ({"state": "succeeded", "start_time": NOW - 90, "end_time": NOW - 30}, "1m00s"),
        ({"state": "cancelled", "end_time": NOW - 30}, "-"),  # never started
    ],
)
def test_time_is_run_time_or_waiting_time(changes: dict[str, Any], expected: str) -> None:
    assert time_cell(job(1, **changes), NOW) == expected


def test_filter_terms_must_all_hold() -> None:
    jobs = [
        job(1, "running", user="ana", name="bert"),
        job(2, "queued", user="bo", name="bert", reason="waiting for 2 free GPUs"),
        job(3, "queued", user="ana", name="resnet", gpus=2),
    ]

    def ids(text: str) -> list[int]:
        return [j["id"] for j in jobs if JobFilter.parse(text).matches(j)]

    assert ids("") == [1, 2, 3]
    assert ids("state:queued") == [2, 3]
    assert ids("state:running,queued user:ana") == [1, 3]
    assert ids("name:BERT") == [1, 2]
    assert ids("gpus:2") == [3]
    assert ids("free gpus") == [2]  # bare words search the reason too
    assert ids("'free GPUs' bo") == [2]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour:red", "unknown key 'colour'"),
        ("state:sleeping", "unknown state sleeping"),
        ("gpus:two", "gpus takes numbers"),
        ("'open", "filter:"),
    ],
)
def test_bad_filters_are_refused_with_a_hint(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        JobFilter.parse(text)
    assert info.value.hint


def test_finished_jobs_are_hidden_unless_asked_for() -> None:
    model = QueueModel()
    model.replace([job(1, "running"), job(2, "failed"), job(3, "succeeded")])
    assert model.visible_ids(NOW) == [1]
    model.job_filter = JobFilter.parse("state:failed")
    assert model.visible_ids(NOW) == [2]  # naming a finished state shows it
    model.job_filter = JobFilter()
    model.show_finished = True
    assert model.visible_ids(NOW) == [1, 2, 3]


def test_default_sort_puts_running_first_then_priority() -> None:
    model = QueueModel()
    model.replace(
        [job(1, "queued"), job(2, "queued", priority=9), job(3, "running"), job(4, "held")]
    )
    assert model.visible_ids(NOW) == [3, 2, 1, 4]
    model.sort_column, model.reverse = "id", True
    assert model.visible_ids(NOW) == [4, 3, 2, 1]
    model.sort_column, model.reverse = "priority", False
    assert model.visible_ids(NOW)[-1] == 2


def test_apply_reports_only_rows_that_change() -> None:
    model = QueueModel()
    model.replace([job(1, "queued"), job(2, "queued"), job(3, "running")])
    assert model.apply([job(1, "queued")], NOW).empty  # same row: nothing to do
    changes = model.apply(
        [job(1, "queued", reason="waiting"), job(2, "cancelled"), job(4, "held")], NOW
    )
    assert changes.updated == (1,)
    assert changes.removed == (2,)  # finished: leaves the default view
    assert changes.added == (4,)
    assert changes.reorder  # a new row needs its place
    moved = model.apply([job(1, "running", start_time=NOW - 5)], NOW)
    assert moved.updated == (1,) and moved.reorder  # its state sorts elsewhere now
    same_place = model.apply([job(1, "running", start_time=NOW - 5, reason="x")], NOW)
    assert same_place.updated == (1,) and not same_place.reorder


def test_summary_counts_states_in_lifecycle_order() -> None:
    assert summary_line({"queued": 3, "running": 2, "failed": 0}) == "2 running · 3 queued"
    assert summary_line({}) == "no jobs"


def test_job_facts_are_relative_to_now() -> None:
    facts = dict(job_facts(job(1, "running", start_time=NOW - 60, gpu_uuids=["GPU-x"]), NOW))
    assert facts["Started"] == "1m00s ago"
    assert facts["Ended"] == "-"
    assert facts["GPUs"] == "1 on GPU-x"
    assert facts["Command"] == "python train.py"


def gpu(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "uuid": "GPU-a",
        "index": 0,
        "name": "Fake",
        "memory_total": 40 * GIB,
        "memory_used": 0,
        "utilization": 0.0,
        "memory_gpuq": 0,
        "memory_foreign": 0,
        "jobs": [],
        "mode": "idle",
    }
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("gpuq", "foreign", "expected"),
    [
        (0, 0, (0, 0, 20)),
        (20 * GIB, 10 * GIB, (10, 5, 5)),
        (1, 0, (1, 0, 19)),  # any use shows at least one cell
        (40 * GIB, 5 * GIB, (20, 0, 0)),  # never more than the bar
    ],
)
def test_memory_bar_splits_by_owner(gpuq: int, foreign: int, expected: tuple[int, ...]) -> None:
    parts = memory_segments(gpu(memory_gpuq=gpuq, memory_foreign=foreign), 20)
    assert (parts.gpuq, parts.foreign, parts.free) == expected


def test_gpu_marks_packed_and_time_sliced() -> None:
    states = {1: "running", 2: "running", 3: "suspended"}
    assert gpu_mark(gpu(jobs=[1, 2], mode="shared"), states) == "packed x2"
    assert gpu_mark(gpu(jobs=[1, 3], mode="whole"), states) == "time-sliced"
    assert gpu_mark(gpu(jobs=[1], mode="whole"), states) == "whole"
    assert gpu_mark(gpu(), states) == "idle"


def test_sparkline_scales_to_percent_and_keeps_the_latest() -> None:
    assert sparkline([0, 50, 100], 3) == "▁▅█"
    assert sparkline([0, 100, None], 5) == "  ▁█ "
    assert sparkline([10, 80, 100], 2) == "▇█"  # only the last `width` values


def test_board_keeps_a_utilization_history_per_gpu() -> None:
    board = GpuBoard()
    board.update_many({"gpus": [gpu(utilization=u)], "backend": "fake"} for u in (10.0, 20.0))
    assert list(board.history["GPU-a"]) == [10.0, 20.0]
    board.update({"gpus": [gpu(uuid="GPU-b")], "backend": "fake"})
    assert set(board.history) == {"GPU-b"}  # a GPU that went away is forgotten


def test_plot_rows_stack_eighth_blocks() -> None:
    rows = plot_rows([1.0, 2.0, 3.0], 4, 2)
    assert len(rows) == 2 and all(len(r) == 4 for r in rows)
    assert rows[0][0] == rows[1][0] == " "  # fewer values than columns: blank on the left
    assert rows[0][-1] == rows[1][-1] == "█"  # the maximum fills the column
    assert rows[1][1] != " "  # the minimum still shows
    assert plot_rows([], 3, 1) == ["   "]


def test_series_skip_missing_fields_and_merge_only_newer_samples() -> None:
    samples = [
        {"time": 1.0, "step": 1, "step_seconds": 0.5},
        {"time": 2.0, "step": 2, "step_seconds": 0.25, "batch_size": 64},
    ]
    series = {s.spec.key: s for s in build_series(samples)}
    assert series["step"].values == (0.5, 0.25)
    assert series["batch"].values == (64.0,)
    assert series["goodput"].values == ()
    assert series["step"].caption == "step time  250 ms  (min 250 ms, max 500 ms)"
    assert series["goodput"].caption == "goodput  -"
    merged = merge_samples(samples, [{"time": 2.0, "step": 2}, {"time": 3.0, "step": 3}])
    assert [s["time"] for s in merged] == [1.0, 2.0, 3.0]


def test_sync_drops_jobs_missing_from_a_full_list() -> None:
    model = QueueModel()
    model.replace([job(1), job(2), job(3, "failed")])
    changes = model.sync([job(2, reason="still here"), job(4)], NOW)
    assert set(model.jobs) == {2, 4}
    assert changes.removed == (1,)  # job 3 was not shown, so no row goes
    assert changes.updated == (2,) and changes.added == (4,)
    assert model.visible_ids(NOW) == [2, 4]


def test_state_counts_follow_every_change_to_the_jobs() -> None:
    model = QueueModel()
    model.replace([job(1), job(2), job(3, "running")])
    assert model.counts() == {"queued": 2, "running": 1}
    model.apply([job(1, "running"), job(4, "held")], NOW)
    assert model.counts() == {"queued": 1, "running": 2, "held": 1}
    model.sync([job(1, "failed"), job(4, "held")], NOW)
    assert model.counts() == {"failed": 1, "held": 1}  # states left at zero are left out
    model.replace([job(5, "suspended")])
    assert model.counts() == {"suspended": 1}
