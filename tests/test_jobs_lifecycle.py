"""Managing jobs after submission, end to end: the real CLI against a real daemon.

Listing and showing, logs (tail and follow), cancel, hold and release,
retry, priority, suspend and resume, wait, clean and the daemon's status.
Jobs that should stay up wait on files the test creates, or are cancelled.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon.handlers.logs import POLL_SECONDS
from tests.daemon_harness import DaemonHarness, listed, wait_for
from tests.daemon_harness import submit_cli as submit

ENDED = ("succeeded", "failed", "cancelled", "lost")
CONFLICT = 4


def ids(daemon: DaemonHarness, *args: str) -> list[int]:
    """The ids `gpuq ls ARGS` lists."""
    return [job["id"] for job in listed(daemon, *args)]


def gpuq(*args: str) -> list[str]:
    """The argv of the real `gpuq` command."""
    return [sys.executable, "-m", "gpuq.cli.entry", *args]


def popen(daemon: DaemonHarness, *args: str) -> subprocess.Popen[str]:
    """Start `gpuq ARGS` in the background, its output captured."""
    return subprocess.Popen(
        gpuq(*args),
        env=daemon.env,
        cwd=daemon.root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def gated(path: str) -> list[str]:
    """A command that runs until the file `path` (relative to the job's cwd) exists."""
    return ["sh", "-c", f"while [ ! -e {path} ]; do sleep 0.05; done"]


def process_state(pid: int) -> str:
    """The one-letter state of a process in /proc (R, S, T, Z...)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


# -- ls and show -------------------------------------------------------------


def test_ls_filters_by_state_name_user_and_finished(daemon: DaemonHarness) -> None:
    ok = submit(daemon, "--gpus", "0", "--name", "alpha-ok", "--", "true")
    bad = submit(daemon, "--gpus", "0", "--name", "alpha-bad", "--", "sh", "-c", "exit 1")
    run = submit(daemon, "--name", "beta-run", "--", "sleep", "30")
    held = submit(daemon, "--name", "beta-held", "--hold", "--", "true")
    daemon.wait_state(ok, "succeeded")
    daemon.wait_state(bad, "failed")
    daemon.wait_state(run, "running")

    assert ids(daemon) == [run, held]  # the queue: unfinished jobs only
    assert ids(daemon, "--all") == [ok, bad, run, held]
    assert ids(daemon, "--state", "failed") == [bad]
    assert ids(daemon, "-s", "running", "-s", "held") == [run, held]
    assert ids(daemon, "--state", "succeeded", "--state", "failed") == [ok, bad]
    assert ids(daemon, "--name", "beta") == [run, held]
    assert ids(daemon, "--name", "alpha") == []
    assert ids(daemon, "--name", "alpha", "--all") == [ok, bad]
    assert ids(daemon, "-n", "alpha", "-s", "succeeded") == [ok]
    assert ids(daemon, "--all", "--user", getpass.getuser()) == [ok, bad, run, held]
    assert ids(daemon, "--all", "-u", "nobody-in-particular") == []
    assert ids(daemon, "--all", "--limit", "2") == [run, held]  # the newest two
    assert ids(daemon, "--state", "failed", "--limit", "5") == [bad]
    for limit in ("0", "-1"):
        refused = daemon.cli("ls", "--limit", limit)
        assert refused.returncode == 2 and "--limit" in refused.stderr and refused.stdout == ""

    table = daemon.cli("ls", "--all").stdout.splitlines()
    assert table[0].split() == ["ID", "NAME", "STATE", "GPUS", "TIME", "EXIT", "REASON"]
    rows = {int(line.split()[0]): line.split() for line in table[1:]}
    assert rows[ok][1:3] == ["alpha-ok", "succeeded"]
    assert rows[bad][1:3] == ["alpha-bad", "failed"]
    assert rows[held][1:3] == ["beta-held", "held"]

    unknown = daemon.cli("ls", "--state", "sleeping")
    assert unknown.returncode == 2
    assert "sleeping" in unknown.stderr
    daemon.cli("cancel", str(run), str(held))
    daemon.wait_state(run, "cancelled")


def test_ls_of_an_id_that_was_never_a_job_exits_3_and_names_it(daemon: DaemonHarness) -> None:
    done = submit(daemon, "--gpus", "0", "--", "true")
    daemon.wait_state(done, "succeeded")
    assert ids(daemon, str(done)) == [done]  # a finished job, listed by id
    assert ids(daemon, str(done), "--state", "failed") == []  # filtered out: not an error

    unknown = daemon.cli("ls", "99999", "99998")
    assert unknown.returncode == 3 and unknown.stdout == ""
    assert unknown.stderr.startswith("gpuq: error: no job 99999, 99998\nhint: gpuq ls --all")
    mixed = daemon.cli("ls", str(done), "99999")  # the known ones listed, then the error
    assert mixed.returncode == 3 and "no job 99999" in mixed.stderr
    assert [int(line.split()[0]) for line in mixed.stdout.splitlines()[1:]] == [done]
    as_json = daemon.cli("ls", "--json", str(done), "99999")
    assert as_json.returncode == 3
    listing = json.loads(as_json.stdout)
    assert [job["id"] for job in listing["jobs"]] == [done] and listing["unknown"] == [99999]
    assert json.loads(as_json.stderr)["error"]["code"] == "not_found"


def test_show_prints_the_history_with_reasons(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--retries", "1", "--", "sh", "-c", "exit 2")
    daemon.wait_state(job_id, "failed")
    shown = daemon.cli("show", "--json", str(job_id))
    assert shown.returncode == 0, shown.stderr
    result = json.loads(shown.stdout)
    assert result["schema_version"] == 1
    assert [(e["state"], e["reason"]) for e in result["events"]] == [
        ("queued", "submitted"),
        ("starting", "starting on CPU"),
        ("running", "started"),
        ("queued", "exited with code 2; retrying in 1s (attempt 2 of 2)"),
        ("starting", "starting on CPU"),
        ("running", "started"),
        ("failed", "exited with code 2"),
    ]
    text = daemon.cli("show", str(job_id)).stdout
    assert f"Job {job_id}: sh" in text
    assert "State:      failed (exited with code 2)" in text
    assert "Attempts:   2 (retries allowed: 1)" in text
    history = text.split("History:\n", 1)[1].splitlines()
    assert [line.split(None, 3)[2:] for line in history] == [
        [e["state"], e["reason"]] for e in result["events"]
    ]


def test_show_of_an_unknown_job_exits_3(daemon: DaemonHarness) -> None:
    result = daemon.cli("show", "77")
    assert result.returncode == 3
    assert "gpuq: error: no job 77" in result.stderr


# -- logs --------------------------------------------------------------------


def test_logs_tail_prints_the_last_lines(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "seq", "1", "10")
    daemon.wait_state(job_id, "succeeded")
    assert daemon.cli("logs", "--tail", "3", str(job_id)).stdout == "8\n9\n10\n"
    assert daemon.cli("logs", "--tail", "1", str(job_id)).stdout == "10\n"
    assert daemon.cli("logs", "--tail", "0", str(job_id)).stdout == ""
    refused = daemon.cli("logs", "--tail", "-1", str(job_id))
    assert refused.returncode == 2 and "--tail" in refused.stderr and refused.stdout == ""
    assert daemon.cli("logs", "--tail", "50", str(job_id)).stdout == "".join(
        f"{n}\n" for n in range(1, 11)
    )


BAR = "\u2588"
"""A block of a tqdm progress bar: three bytes in UTF-8."""


def test_logs_keep_a_character_whole_across_the_daemon_s_reads(daemon: DaemonHarness) -> None:
    # 100,000 three-byte characters: the daemon's 256 KiB reads end inside one.
    program = f"import sys; sys.stdout.write({BAR!r} * 100_000 + '\\n')"
    job_id = submit(daemon, "--gpus", "0", "--", sys.executable, "-c", program)
    daemon.wait_state(job_id, "succeeded")
    assert daemon.cli("logs", str(job_id)).stdout == BAR * 100_000 + "\n"


def test_logs_follow_sends_a_character_written_in_two_parts_whole(daemon: DaemonHarness) -> None:
    # The job writes half a character, waits to be read, then writes the rest.
    first, rest = BAR.encode()[:2], BAR.encode()[2:] + b"\n"
    program = (
        "import os, sys, time\n"
        f"sys.stdout.buffer.write({first!r}); sys.stdout.flush()\n"
        "while not os.path.exists('go'): time.sleep(0.05)\n"
        f"sys.stdout.buffer.write({rest!r})\n"
    )
    job_id = submit(daemon, "--gpus", "0", "--", sys.executable, "-c", program)
    follow = popen(daemon, "logs", "-f", str(job_id))
    try:

        def half_written() -> bool:
            log = daemon.job(job_id)["stdout"]
            return bool(log) and os.path.isfile(log) and os.path.getsize(log) == 2

        wait_for(half_written, what="half a character")
        time.sleep(4 * POLL_SECONDS)  # the daemon reads the half, and reads again
        (daemon.root / "go").touch()
        out, errors = follow.communicate(timeout=30)
    finally:
        follow.kill()
        follow.wait()
    assert follow.returncode == 0, errors
    assert out == BAR + "\n"


def test_logs_of_a_job_whose_output_was_deleted_say_it_is_gone(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "echo", "hello")
    job = daemon.wait_state(job_id, "succeeded")
    os.unlink(job["stdout"])
    gone = daemon.cli("logs", str(job_id))
    assert (gone.returncode, gone.stdout) == (1, "")
    assert f"{job['stdout']} does not exist" in gone.stderr and "hint:" in gone.stderr
    assert daemon.cli("logs", "--stderr", str(job_id)).returncode == 0  # still there, empty

    # A job that never ran has no output yet, which is not an error.
    queued = submit(daemon, "--hold", "--gpus", "0", "--", "true")
    assert daemon.cli("logs", str(queued)).returncode == 0
    assert daemon.cli("cancel", str(queued)).returncode == 0
    assert daemon.cli("logs", str(queued)).returncode == 0


def test_logs_of_a_held_or_queued_job_say_on_stderr_why_there_is_nothing(
    daemon: DaemonHarness,
) -> None:
    held = submit(daemon, "--hold", "--gpus", "0", "--", "echo", "hello")
    queued = submit(daemon, "--after", str(held), "--gpus", "0", "--", "true")
    assert daemon.job(queued)["state"] == "queued"
    for job_id, note in ((held, "is held: it has written nothing yet"),
                         (queued, "is queued: it has not started yet")):  # fmt: skip
        result = daemon.cli("logs", str(job_id))
        assert (result.returncode, result.stdout) == (0, ""), result.stderr
        assert result.stderr == f"gpuq: job {job_id} {note}\n"

    follow = popen(daemon, "logs", "-f", str(held))
    assert follow.stderr is not None
    try:
        first = follow.stderr.readline()
        assert daemon.cli("release", str(held)).returncode == 0
        out, errors = follow.communicate(timeout=30)
    finally:
        follow.kill()
        follow.wait()
    assert first == (
        f"gpuq: job {held} is held: it has written nothing yet; its output follows once it starts\n"
    )
    assert (follow.returncode, out, errors) == (0, "hello\n", "")


def test_logs_follow_streams_until_the_job_ends(daemon: DaemonHarness) -> None:
    # Three lines 0.2 s apart, a pause until the test says go, three more lines.
    script = (
        "for i in 1 2 3; do echo line $i; sleep 0.2; done; "
        "while [ ! -e go ]; do sleep 0.05; done; "
        "for i in 4 5 6; do echo line $i; sleep 0.2; done"
    )
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", script)
    follow = popen(daemon, "logs", "-f", str(job_id))
    assert follow.stdout is not None
    try:
        early = [follow.stdout.readline() for _ in range(3)]
        assert early == ["line 1\n", "line 2\n", "line 3\n"]
        assert daemon.job(job_id)["state"] == "running"  # streamed, not read at the end
        (daemon.root / "go").touch()
        rest, errors = follow.communicate(timeout=30)
    finally:
        follow.kill()
        follow.wait()
    assert follow.returncode == 0, errors
    assert rest == "line 4\nline 5\nline 6\n"
    assert daemon.job(job_id)["state"] == "succeeded"


# -- cancel, hold, release, retry, priority ----------------------------------


def test_cancel_a_pending_job_and_a_running_one(daemon: DaemonHarness) -> None:
    pending = submit(daemon, "--hold", "--", "true")
    running = submit(daemon, "--", "sh", "-c", "echo $$ > pid; exec sleep 30")
    daemon.wait_state(running, "running")
    pid = int(wait_for(lambda: (p := daemon.root / "pid").exists() and p.read_text()))

    result = daemon.cli("cancel", str(pending), str(running))
    assert result.returncode == 0, result.stderr
    assert f"job {pending}: cancelled" in result.stdout.splitlines()
    never_ran = daemon.job(pending)
    assert (never_ran["state"], never_ran["attempts"], never_ran["start_time"]) == (
        "cancelled",
        0,
        None,
    )
    stopped = daemon.wait_state(running, *ENDED)
    assert stopped["state"] == "cancelled"
    assert stopped["reason"] == "cancelled by user"
    assert stopped["signal"] == "SIGTERM"
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)

    again = daemon.cli("cancel", str(running))
    assert again.returncode == CONFLICT
    assert f"job {running} already ended (cancelled)" in again.stderr


def test_hold_and_release_refuse_jobs_in_the_wrong_state(daemon: DaemonHarness) -> None:
    running = submit(daemon, "--", "sleep", "30")
    daemon.wait_state(running, "running")
    done = submit(daemon, "--gpus", "0", "--", "true")
    daemon.wait_state(done, "succeeded")
    blocker = submit(daemon, "--", "sleep", "30")
    daemon.wait_state(blocker, "running")
    queued = submit(daemon, "--", "true")  # both GPUs are taken: it stays queued

    hold_running = daemon.cli("hold", str(running))
    assert hold_running.returncode == CONFLICT
    assert f"cannot hold job {running}: it is running" in hold_running.stderr
    release_queued = daemon.cli("release", str(queued))
    assert release_queued.returncode == CONFLICT
    assert f"cannot release job {queued}: it is queued" in release_queued.stderr
    release_done = daemon.cli("release", str(done))
    assert release_done.returncode == CONFLICT
    assert "it has ended (succeeded)" in release_done.stderr

    held = daemon.cli("hold", str(queued), str(done))  # one good id, one bad
    assert held.returncode == CONFLICT
    assert held.stdout == f"job {queued}: held\n"
    assert f"cannot hold job {done}" in held.stderr
    assert daemon.job(queued)["state"] == "held"
    assert daemon.cli("hold", str(queued)).returncode == 0  # holding a held job is harmless

    daemon.cli("cancel", str(running))
    daemon.wait_state(running, "cancelled")
    assert daemon.job(queued)["state"] == "held"  # a free GPU does not start a held job
    assert daemon.cli("release", str(queued)).returncode == 0
    daemon.wait_state(queued, "succeeded")
    daemon.cli("cancel", str(blocker))


def test_retry_reruns_a_failed_job_under_the_same_id(daemon: DaemonHarness) -> None:
    script = 'echo "run $GPUQ_ATTEMPT"; [ -e fixed ]'
    job_id = submit(daemon, "--gpus", "0", "--", "sh", "-c", script)
    daemon.wait_state(job_id, "failed")
    highest = json.loads(daemon.cli("daemon", "status", "--json").stdout)["highest_job_id"]

    (daemon.root / "fixed").touch()
    result = daemon.cli("retry", str(job_id))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"job {job_id}: queued\n"
    job = daemon.wait_state(job_id, "succeeded")
    assert job["attempts"] == 2
    assert job["exit_code"] == 0
    assert daemon.cli("logs", str(job_id)).stdout == "run 1\nrun 2\n"
    assert ids(daemon, "--all") == [job_id]
    status = json.loads(daemon.cli("daemon", "status", "--json").stdout)
    assert status["highest_job_id"] == highest

    again = daemon.cli("retry", str(job_id))
    assert again.returncode == CONFLICT
    assert (
        f"cannot retry job {job_id}: it succeeded (retry applies to cancelled, failed, lost jobs)"
        in (again.stderr)
    )


def test_priority_changes_which_pending_job_starts_next(daemon: DaemonHarness) -> None:
    fillers = [submit(daemon, "--", "sleep", "30") for _ in range(2)]
    for job_id in fillers:
        daemon.wait_state(job_id, "running")
    first = submit(daemon, "--", "sleep", "30")
    second = submit(daemon, "--", "sleep", "30")

    result = daemon.cli("priority", "7", str(second))
    assert result.returncode == 0, result.stderr
    assert [j["priority"] for j in listed(daemon, "--state", "queued")] == [0, 7]
    events = json.loads(daemon.cli("show", "--json", str(second)).stdout)["events"]
    assert events[-1]["reason"] == "priority set to 7"

    daemon.cli("cancel", str(fillers[0]))
    daemon.wait_state(second, "running")
    assert daemon.job(first)["state"] == "queued"

    refused = daemon.cli("priority", "1", str(second))
    assert refused.returncode == CONFLICT
    assert f"cannot change the priority of job {second}: it is running" in refused.stderr
    daemon.cli("cancel", str(fillers[1]), str(first), str(second))
    daemon.wait_state(second, "cancelled")


# -- suspend and resume --------------------------------------------------------


def test_suspend_stops_a_job_and_resume_continues_it(daemon: DaemonHarness) -> None:
    counter = daemon.root / "counter"
    script = "echo $$ > pid; i=0; while true; do i=$((i+1)); echo $i >> counter; sleep 0.1; done"
    job_id = submit(daemon, "--", "sh", "-c", script)
    daemon.wait_state(job_id, "running")
    wait_for(lambda: counter.exists() and len(counter.read_text().split()) >= 3, what="counting")
    pid = int((daemon.root / "pid").read_text())

    result = daemon.cli("suspend", str(job_id))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"job {job_id}: suspended\n"
    job = daemon.job(job_id)
    assert job["state"] == "suspended"
    assert job["gpu_uuids"]  # stop mode: the job keeps its GPU
    wait_for(lambda: process_state(pid) == "T", what="the job's shell to be stopped")
    count = len(counter.read_text().split())
    # While stopped it does not count: let the daemon sample the GPUs twice, then look again.
    sampled = daemon.call("gpus")["sampled_at"]
    wait_for(lambda: daemon.call("gpus")["sampled_at"] > sampled, what="a GPU sample")
    sampled = daemon.call("gpus")["sampled_at"]
    wait_for(lambda: daemon.call("gpus")["sampled_at"] > sampled, what="another GPU sample")
    assert len(counter.read_text().split()) == count
    assert process_state(pid) == "T"
    assert daemon.cli("suspend", str(job_id)).returncode == CONFLICT

    resumed = daemon.cli("resume", str(job_id))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout == f"job {job_id}: running\n"
    wait_for(lambda: len(counter.read_text().split()) > count + 2, what="counting again")
    assert daemon.job(job_id)["state"] == "running"
    assert daemon.cli("resume", str(job_id)).returncode == CONFLICT

    daemon.cli("suspend", str(job_id))
    daemon.cli("cancel", str(job_id))  # a suspended job can be cancelled
    assert daemon.wait_state(job_id, *ENDED)["state"] == "cancelled"


def test_suspend_refuses_a_job_that_is_not_running(daemon: DaemonHarness) -> None:
    held = submit(daemon, "--hold", "--", "true")
    result = daemon.cli("suspend", str(held))
    assert result.returncode == CONFLICT
    assert f"cannot suspend job {held}: it is held" in result.stderr


# -- wait ----------------------------------------------------------------------


def test_wait_any_returns_when_one_job_ends(daemon: DaemonHarness) -> None:
    quick = submit(daemon, "--gpus", "0", "--", *gated("go"))
    slow = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    waiter = popen(daemon, "wait", "--any", "--json", str(quick), str(slow))
    (daemon.root / "go").touch()
    out, errors = waiter.communicate(timeout=30)
    assert waiter.returncode == 0, errors
    states = {job["id"]: job["state"] for job in json.loads(out)["jobs"]}
    assert states == {quick: "succeeded", slow: "running"}
    daemon.cli("cancel", str(slow))
    daemon.wait_state(slow, "cancelled")


def test_wait_all_exits_with_the_largest_exit_code(daemon: DaemonHarness) -> None:
    jobs = [submit(daemon, "--gpus", "0", "--", "sh", "-c", f"exit {code}") for code in (0, 5, 2)]
    result = daemon.cli("wait", *map(str, jobs))
    assert result.returncode == 5
    rows = result.stdout.splitlines()[1:]
    assert [row.split()[2] for row in rows] == ["succeeded", "failed", "failed"]


def test_wait_timeout_exits_8(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    result = daemon.cli("wait", "--timeout", "1s", str(job_id))
    assert result.returncode == 8
    assert "1 job(s) still not done" in result.stderr
    assert daemon.job(job_id)["state"] == "running"
    daemon.cli("cancel", str(job_id))
    daemon.wait_state(job_id, "cancelled")


# -- clean ---------------------------------------------------------------------


def test_clean_removes_finished_jobs_and_their_default_logs_only(daemon: DaemonHarness) -> None:
    ok = submit(daemon, "--gpus", "0", "--", "echo", "fine")
    bad = submit(daemon, "--gpus", "0", "--", "sh", "-c", "echo oops >&2; exit 1")
    own_log = submit(daemon, "--gpus", "0", "--output", "mine-%j.log", "--", "echo", "kept")
    running = submit(daemon, "--gpus", "0", "--", "sleep", "30")
    held = submit(daemon, "--hold", "--", "true")
    for job_id in (ok, bad, own_log):
        daemon.wait_state(job_id, *ENDED)
    daemon.wait_state(running, "running")
    default_logs = [
        Path(daemon.job(job_id)[stream]) for job_id in (ok, bad) for stream in ("stdout", "stderr")
    ]
    mine = daemon.root / f"mine-{own_log}.log"
    assert all(p.exists() for p in [*default_logs, mine])

    dry = daemon.cli("clean", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["ids"] == [ok, bad, own_log]
    assert sorted(planned["files"]) == sorted(map(str, default_logs))
    assert planned["dry_run"] is True
    assert ids(daemon, "--all") == [ok, bad, own_log, running, held]
    assert all(p.exists() for p in default_logs)
    assert daemon.cli("clean", "--dry-run").stdout.startswith("Would remove 3 job(s) and 4 log")

    cleaned = daemon.cli("clean")
    assert cleaned.returncode == 0, cleaned.stderr
    # The logs hold a line or two: under 1 KiB, counted in bytes.
    assert cleaned.stdout == f"Removed 3 job(s) and 4 log file(s) ({planned['bytes']} bytes).\n"
    assert ids(daemon, "--all") == [running, held]
    assert not any(p.exists() for p in default_logs)
    assert mine.read_text() == "kept\n"  # not in gpuq's log directory: not gpuq's to delete
    assert daemon.cli("show", str(ok)).returncode == 3
    assert daemon.job(running)["state"] == "running"

    daemon.cli("cancel", str(running), str(held))
    daemon.wait_state(running, "cancelled")
    daemon.cli("clean")
    assert ids(daemon, "--all") == []
    newest = submit(daemon, "--gpus", "0", "--", "true")
    assert newest > max(ok, bad, own_log, running, held)


def test_a_cleaned_jobs_id_is_said_to_be_removed_by_clean_by_every_one_job_command(
    daemon: DaemonHarness,
) -> None:
    cleaned = submit(daemon, "--gpus", "0", "--", "true")
    daemon.wait_state(cleaned, *ENDED)
    kept = submit(daemon, "--hold", "--", "true")
    assert daemon.cli("clean").returncode == 0
    removed = f"job ids so far run from 1 to {kept}; job {cleaned} was removed by gpuq clean"
    for command in (["show"], ["wait"], ["logs"], ["metrics"]):
        result = daemon.cli(*command, str(cleaned))
        assert result.returncode == 3, command
        assert f"hint: {removed}" in result.stderr, command
    beyond = daemon.cli("show", str(kept + 1))
    assert beyond.stderr.splitlines()[-1] == f"hint: job ids so far run from 1 to {kept}"


def test_clean_keeps_a_finished_job_a_queued_one_depends_on_until_that_one_ends(
    daemon: DaemonHarness,
) -> None:
    first = submit(daemon, "--gpus", "0", "--", "true")
    alone = submit(daemon, "--gpus", "0", "--", "true")
    daemon.wait_state(first, "succeeded")
    daemon.wait_state(alone, "succeeded")
    after = submit(daemon, "--gpus", "0", "--after", str(first), "--hold", "--", "true")

    cleaned = daemon.cli("clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert cleaned.stdout.splitlines()[1].startswith("Kept 1 still in use (a queued job's --after")
    assert cleaned.stdout.endswith(f": {first}.\n")
    assert ids(daemon, "--all") == [first, after]
    assert daemon.cli("release", str(after)).returncode == 0
    daemon.wait_state(after, "succeeded")  # its dependency was still there to be met
    result = json.loads(daemon.cli("clean", "--json").stdout)
    assert (result["ids"], result["kept"]) == ([first, after], [])


def test_clean_keeps_every_task_of_an_array_a_queued_job_depends_on(
    daemon: DaemonHarness,
) -> None:
    array = json.loads(
        daemon.cli("submit", "--json", "--gpus", "0", "--array", "0-1", "--", "true").stdout
    )
    for task in array["ids"]:
        daemon.wait_state(task, "succeeded")
    after = submit(daemon, "--gpus", "0", "--after", str(array["array_id"]), "--hold", "--", "true")
    result = json.loads(daemon.cli("clean", "--json").stdout)
    assert (result["ids"], result["kept"]) == ([], array["ids"])
    daemon.cli("cancel", str(after))


def test_clean_keeps_the_ended_tasks_of_an_array_that_runs_on(daemon: DaemonHarness) -> None:
    script = '[ "$GPUQ_ARRAY_INDEX" = 0 ] && exit 1; while [ ! -e go ]; do sleep 0.05; done'
    array = json.loads(
        daemon.cli(
            "submit", "--json", "--gpus", "0", "--array", "0-1%1", "--", "sh", "-c", script
        ).stdout
    )
    failed, running = array["ids"]
    daemon.wait_state(failed, "failed")
    daemon.wait_state(running, "running")
    result = json.loads(daemon.cli("clean", "--json").stdout)
    assert (result["ids"], result["kept"]) == ([], [failed])
    (daemon.root / "go").touch()
    waited = daemon.cli("wait", str(array["array_id"]))
    assert waited.returncode == 1, waited.stderr  # the failed task still counts
    cleaned = json.loads(daemon.cli("clean", "--json").stdout)
    assert (cleaned["ids"], cleaned["kept"]) == ([failed, running], [])


def kept_by_clean(daemon: DaemonHarness) -> list[int]:
    kept: list[int] = json.loads(daemon.cli("clean", "--dry-run", "--json").stdout)["kept"]
    return kept


def test_clean_keeps_what_a_wait_is_waiting_on_until_it_has_its_answer(
    daemon: DaemonHarness,
) -> None:
    ended = submit(daemon, "--gpus", "0", "--", "sh", "-c", "exit 3")
    daemon.wait_state(ended, "failed")
    held = submit(daemon, "--hold", "--gpus", "0", "--", "true")
    answers: list[dict[str, Any]] = []
    with daemon.client() as client:
        waiting = threading.Thread(
            target=lambda: answers.append(client.call("wait", ids=[ended, held]))
        )
        waiting.start()
        wait_for(lambda: kept_by_clean(daemon) == [ended])  # the wait has begun
        result = json.loads(daemon.cli("clean", "--json").stdout)
        assert (result["ids"], result["kept"]) == ([], [ended])
        assert daemon.cli("release", str(held)).returncode == 0
        waiting.join(timeout=60)
    assert [(job["id"], job["exit_code"]) for job in answers[0]["jobs"]] == [(ended, 3), (held, 0)]
    assert json.loads(daemon.cli("clean", "--json").stdout)["ids"] == [ended, held]


def test_clean_older_than_keeps_recent_jobs(daemon: DaemonHarness) -> None:
    job_id = submit(daemon, "--gpus", "0", "--", "true")
    daemon.wait_state(job_id, "succeeded")
    result = daemon.cli("clean", "--older-than", "1h", "--json")
    assert json.loads(result.stdout)["ids"] == []
    assert ids(daemon, "--all") == [job_id]


# -- the daemon ----------------------------------------------------------------


def test_daemon_status(daemon: DaemonHarness) -> None:
    assert daemon.process is not None
    running = submit(daemon, "--", "sleep", "30")
    held = submit(daemon, "--hold", "--", "true")
    daemon.wait_state(running, "running")
    result = daemon.cli("daemon", "status", "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["schema_version"] == 1
    assert status["pid"] == daemon.process.pid
    assert (status["gpus"], status["backend"], status["policy"]) == (2, "fake", "gpuq")
    assert status["jobs"] == {"running": 1, "held": 1}
    assert status["highest_job_id"] == held
    assert status["state_dir"] == str(daemon.state_dir)
    assert status["runtime_dir"] == str(daemon.runtime_dir)
    assert set(status["decisions"]) == {"gpuq"}  # the job was placed by a decision
    times = status["decisions"]["gpuq"]
    assert times["count"] >= 1 and 0 < times["median"] <= times["max"]
    lag = status["loop_lag"]
    assert (lag["window"], lag["interval"]) == (60.0, 0.02)
    assert lag["wakeups"] > 0 and 0 <= lag["p99"] <= lag["max"]

    text = daemon.cli("daemon", "status").stdout
    assert text.startswith(f"gpuq daemon running: pid {daemon.process.pid}")
    assert "1 held, 1 running" in text
    assert "  Decisions: gpuq: last " in text
    assert "  Loop lag:  max " in text

    daemon.cli("cancel", str(running))
    daemon.wait_state(running, "cancelled")
    daemon.stop()
    down = daemon.cli("daemon", "status")
    assert down.returncode == 5
    assert "no gpuq daemon is running" in down.stderr
