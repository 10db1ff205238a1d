"""`--signal SIG@SECONDS` also warns a job before a suspend stops it."""

from __future__ import annotations

import signal

from tests.daemon_harness import DaemonHarness, wait_for


def test_suspend_sends_the_signal_first_then_stops_the_job(daemon: DaemonHarness) -> None:
    marker, ready = daemon.root / "warned", daemon.root / "ready"
    script = f"trap 'touch {marker}' USR1; touch {ready}; while true; do sleep 0.05; done"
    job = daemon.submit(["sh", "-c", script], gpus=0, signal=[int(signal.SIGUSR1), 1.0])
    wait_for(ready.exists, what="the job to install its USR1 trap")
    result = daemon.call("suspend", ids=[job])["results"][0]
    assert result == {"id": job, "ok": True, "message": "", "state": "suspending", "code": None}
    wait_for(marker.exists, what="the job to get SIGUSR1")
    daemon.wait_state(job, "suspended")
    reasons = [e["reason"] for e in daemon.call("show", id=job)["events"]]
    assert reasons[-2:] == ["suspend requested (stop mode)", "suspended (stop mode)"]
    daemon.call("cancel", ids=[job])
    daemon.wait_state(job, "cancelled")


def test_resume_during_the_warning_keeps_the_job_running(daemon: DaemonHarness) -> None:
    ready = daemon.root / "ready"
    script = f"trap '' USR2; touch {ready}; sleep 30"  # the warning is ignored
    job = daemon.submit(["sh", "-c", script], gpus=0, signal=[int(signal.SIGUSR2), 2.0])
    wait_for(ready.exists, what="the job to ignore USR2")
    daemon.call("suspend", ids=[job])
    daemon.call("resume", ids=[job])
    assert daemon.job(job)["state"] == "running"
    reasons = [e["reason"] for e in daemon.call("show", id=job)["events"]]
    assert reasons[-1] == "resumed by user"
    daemon.call("cancel", ids=[job])
    daemon.wait_state(job, "cancelled")
