"""What `gpuq wait`, `gpuq cancel` and `gpuq daemon stop` tell a script and a person.

`wait` exits with the jobs' own code, which may equal one of gpuq's (3 is
also "no such job"); `--exit-zero` keeps job codes out of the exit status,
so any non-zero status is gpuq's own, and `--json` gives each job's state
and code. `cancel` says what it did: a running job is `cancel requested`,
and `--wait` prints the state it ended in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.daemon_harness import DaemonHarness, wait_for
from tests.daemon_harness import submit_cli as submit


def test_a_job_exit_code_of_3_reads_like_no_such_job_without_exit_zero(
    daemon: DaemonHarness,
) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", "exit 3")
    assert daemon.cli("wait", str(job_id)).returncode == 3
    assert daemon.cli("wait", "999").returncode == 3


def test_exit_zero_with_json_tells_job_codes_from_gpuqs_own(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", "exit 3")
    waited = daemon.cli("wait", "--exit-zero", "--json", str(job_id))
    assert waited.returncode == 0, waited.stderr
    [job] = json.loads(waited.stdout)["jobs"]
    assert (job["id"], job["state"], job["exit_code"]) == (job_id, "failed", 3)
    missing = daemon.cli("wait", "--exit-zero", "--json", "999")
    assert missing.returncode == 3
    assert json.loads(missing.stderr)["error"]["code"] == "not_found"


def test_exit_zero_still_reports_a_timeout(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    waited = daemon.cli("wait", "--exit-zero", "--timeout", "0.5s", str(job_id))
    assert waited.returncode == 8, waited.stderr
    daemon.cli("cancel", str(job_id))


def test_cancel_says_a_running_job_was_asked_to_stop(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    daemon.wait_state(job_id, "running")
    cancelled = daemon.cli("cancel", str(job_id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"job {job_id}: cancel requested\n"
    daemon.wait_state(job_id, "cancelled")


def test_cancel_wait_prints_the_state_each_job_ended_in(daemon: DaemonHarness) -> None:
    stubborn = "trap '' TERM; while :; do sleep 0.1; done"
    running = submit(daemon, "--gpus", "0", "--", "sh", "-c", stubborn)
    pending = submit(daemon, "--gpus", "0", "--hold", "--", "true")
    daemon.wait_state(running, "running")
    cancelled = daemon.cli("cancel", "--wait", str(running), str(pending))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"job {running}: cancelled\njob {pending}: cancelled\n"
    assert daemon.job(running)["state"] == "cancelled", "it waited out the kill grace"

    again = submit(daemon, "--gpus", "0", "--", "sh", "-c", stubborn)
    daemon.wait_state(again, "running")
    waited = daemon.cli("cancel", "--wait", "--json", str(again))
    assert waited.returncode == 0, waited.stderr
    [ended] = json.loads(waited.stdout)["results"]  # ended: no "cancel requested" left
    assert (ended["ok"], ended["state"], ended["message"]) == (True, "cancelled", "")

    as_json = daemon.cli("cancel", "--json", str(running))
    assert as_json.returncode == 4
    [result] = json.loads(as_json.stdout)["results"]
    assert (result["ok"], result["message"]) == (False, f"job {running} already ended (cancelled)")


def test_a_refused_cancel_names_the_job_once(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "true")
    daemon.wait_state(job_id, "succeeded")
    refused = daemon.cli("cancel", str(job_id))
    assert refused.returncode == 4
    assert refused.stderr == f"gpuq: job {job_id} already ended (succeeded)\n"


def test_daemon_stop_gets_its_reply_and_says_what_it_left_running(
    daemon: DaemonHarness,
) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    daemon.wait_state(job_id, "running")
    stopped = daemon.cli("daemon", "stop")
    assert stopped.returncode == 0
    assert stopped.stderr == "gpuq daemon stopped (1 job(s) left running)\n"
    assert daemon.process is not None and daemon.process.wait(timeout=20) == 0
    assert "Traceback" not in daemon.log()


@pytest.mark.parametrize(
    "command",
    [
        ["submit", "--wait", "--gpus", "0", "--", "sleep", "60"],
        ["wait", "{job}"],
        ["logs", "-f", "{job}"],
    ],
    ids=["submit --wait", "wait", "logs -f"],
)
def test_ctrl_c_stops_waiting_with_status_130_and_leaves_the_job_alone(
    daemon: DaemonHarness, command: list[str]
) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "60")
    daemon.wait_state(job_id, "running")
    args = [arg.format(job=job_id) for arg in command]
    waiting = subprocess.Popen(
        [sys.executable, "-u", "-m", "gpuq.cli.entry", *args],
        env=daemon.env,
        cwd=daemon.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stdout is not None
        if args[0] == "submit":
            submitted = waiting.stdout.readline()  # unbuffered: printed before the wait
            assert submitted.startswith("Submitted job "), submitted
            job_id = int(submitted.split()[-1])
        else:
            wait_for(lambda: _has_a_socket(waiting.pid), what="the client connected")
        waiting.send_signal(signal.SIGINT)
        out, errors = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
        waiting.wait()
    assert waiting.returncode == 130
    assert "Traceback" not in errors
    if args[0] == "submit":
        assert errors == (
            f"gpuq: stopped waiting; job {job_id} is not cancelled "
            f"(gpuq wait {job_id} waits again, gpuq cancel {job_id} stops it)\n"
        )
    assert daemon.job(job_id)["state"] in {"queued", "starting", "running"}


def _has_a_socket(pid: int) -> bool:
    """Whether the process has a socket open: it is past its imports, talking to the daemon."""
    fds = f"/proc/{pid}/fd"
    try:
        return any(os.readlink(f"{fds}/{fd}").startswith("socket:") for fd in os.listdir(fds))
    except OSError:
        return False
