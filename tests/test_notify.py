"""`--notify` runs once for every job that reaches a final state, whatever the state.

A job cancelled before it ever started (held, or waiting on a dependency
that failed) is exactly when its owner wants to hear, so it is notified too.
"""

from __future__ import annotations

from pathlib import Path

from tests.daemon_harness import DaemonHarness, wait_for
from tests.daemon_harness import submit_cli as submit

NOTIFY = 'echo "$GPUQ_JOB_ID $GPUQ_JOB_STATE $GPUQ_JOB_EXIT_CODE" >> notified'


def notifications(daemon: DaemonHarness, count: int) -> list[str]:
    """The first `count` lines of the notification file, once there are that many."""
    path: Path = daemon.root / "notified"

    def lines() -> list[str] | None:
        found = path.read_text().splitlines() if path.exists() else []
        return found if len(found) >= count else None

    found: list[str] = wait_for(lines, what=f"{count} notifications")
    return found


def test_a_held_job_cancelled_before_it_started_is_notified(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--hold", "--notify", NOTIFY, "--", "true")
    assert daemon.cli("cancel", str(job_id)).returncode == 0
    assert notifications(daemon, 1) == [f"{job_id} cancelled "]


def test_a_dependent_cancelled_because_its_dependency_failed_is_notified(
    daemon: DaemonHarness,
) -> None:
    failing = submit(daemon, "--gpus", "0", "--", "sh", "-c", "exit 2")
    dependent = submit(
        daemon, "--gpus", "0", "--after", f"{failing}:ok", "--notify", NOTIFY, "--", "true"
    )
    daemon.wait_state(dependent, "cancelled")
    assert notifications(daemon, 1) == [f"{dependent} cancelled "]


def test_each_final_state_is_notified_exactly_once(daemon: DaemonHarness) -> None:
    ok = submit(daemon, "--gpus", "0", "--notify", NOTIFY, "--", "true")
    bad = submit(daemon, "--gpus", "0", "--notify", NOTIFY, "-r", "1", "--", "sh", "-c", "exit 4")
    for job_id in (ok, bad):
        daemon.wait_state(job_id, "succeeded", "failed", timeout=30)
    assert sorted(notifications(daemon, 2)) == sorted([f"{ok} succeeded 0", f"{bad} failed 4"])
    late = submit(daemon, "--gpus", "0", "--hold", "--notify", NOTIFY, "--", "true")
    daemon.cli("cancel", str(late))
    wait_for(lambda: f"{late} cancelled " in notifications(daemon, 3), what="the last one")
    lines = notifications(daemon, 3)
    assert len(lines) == 3, f"a retried attempt is not a final state: {lines}"
