"""`gpuq show`'s state line: the state, then why, without saying the state twice."""

from __future__ import annotations

import pytest

from gpuq.cli.render import array_detail, job_detail
from tests.test_render_escapes import NOW, job


@pytest.mark.parametrize(
    ("state", "reason", "line"),
    [
        ("failed", "exited with code 2", "failed (exited with code 2)"),
        ("suspended", "suspended (stop mode)", "suspended (stop mode)"),
        ("cancelled", "cancelled by user", "cancelled by user"),
        ("queued", "queued behind job 3", "queued behind job 3"),
        ("running", "running", "running"),
        ("held", None, "held"),
        ("suspended", "suspendedness", "suspended (suspendedness)"),
    ],
)
def test_the_state_line_gives_the_reason_once(state: str, reason: str | None, line: str) -> None:
    text = job_detail(job(state=state, reason=reason), [])
    assert f"\n  State:      {line}\n" in text


@pytest.mark.parametrize(("size", "head"), [(1, "(1 task: 1 held)"), (2, "(2 tasks: 2 held)")])
def test_an_arrays_head_counts_its_tasks_in_the_singular_for_one(size: int, head: str) -> None:
    array = {"id": 4, "name": "sweep", "size": size, "submit_time": NOW}
    tasks = [job(id=5 + i, array_id=4, array_index=i) for i in range(size)]
    assert array_detail(array, tasks).startswith(f"Array 4: sweep {head}\n")
