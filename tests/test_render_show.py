"""`gpuq show`'s state line: the state, then why, without saying the state twice."""

from __future__ import annotations

import pytest

from gpuq.cli.render import job_detail
from tests.test_render_escapes import job


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
