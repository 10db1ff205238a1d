"""How `cancel`, `hold`, `release` and the other actions word what they did, job by job."""

from __future__ import annotations

from typing import Any

from gpuq.cli.app import GROUPED_RUN, outcome_lines


def applied(job_id: int, state: str = "cancelled", message: str = "") -> dict[str, Any]:
    return {"id": job_id, "ok": True, "message": message, "state": state, "code": None}


def refused(job_id: int, message: str, code: str = "conflict") -> dict[str, Any]:
    return {"id": job_id, "ok": False, "message": message, "state": None, "code": code}


def test_a_few_jobs_get_a_line_each_worded_as_the_daemon_said() -> None:
    results = [
        applied(3),
        applied(4, "running", "cancel requested"),
        refused(5, "job 5 already ended (succeeded)"),
        refused(9, "no job 9", "not_found"),
        refused(7, "cannot release job 7: it is running"),
        refused(8, "waiting for job 80", "conflict"),
    ]
    assert outcome_lines(results) == [
        (True, "job 3: cancelled"),
        (True, "job 4: cancel requested"),
        (False, "job 5 already ended (succeeded)"),
        (False, "no job 9"),
        (False, "cannot release job 7: it is running"),
        (False, "job 8: waiting for job 80"),
    ]


def test_a_run_of_consecutive_ids_alike_is_one_range() -> None:
    run = [applied(job_id) for job_id in range(10, 10 + GROUPED_RUN)]
    assert outcome_lines(run) == [(True, f"jobs 10-{9 + GROUPED_RUN}: cancelled")]
    ended = [
        refused(i, f"job {i} already ended (cancelled)") for i in range(100, 100 + GROUPED_RUN)
    ]
    assert outcome_lines(ended) == [
        (False, f"jobs 100-{99 + GROUPED_RUN}: already ended (cancelled)")
    ]
    busy = [refused(i, f"cannot hold job {i}: it is running") for i in range(1, 1 + GROUPED_RUN)]
    assert outcome_lines(busy) == [(False, f"jobs 1-{GROUPED_RUN}: cannot hold: it is running")]


def test_a_job_unlike_its_neighbours_breaks_the_run_and_keeps_its_own_line() -> None:
    results = [applied(i) for i in range(1, 1 + GROUPED_RUN)]
    results.insert(4, applied(5, "running", "cancel requested"))
    for later, item in enumerate(results[5:], start=6):
        item["id"] = later  # the ids stay consecutive around the odd one
    lines = outcome_lines(results)
    assert (True, "job 5: cancel requested") in lines
    assert all(not line.startswith("jobs ") for _, line in lines)  # neither side is long enough


def test_a_gap_in_the_ids_ends_a_run() -> None:
    results = [applied(i) for i in range(1, 1 + GROUPED_RUN)] + [applied(50)]
    assert outcome_lines(results) == [
        (True, f"jobs 1-{GROUPED_RUN}: cancelled"),
        (True, "job 50: cancelled"),
    ]
