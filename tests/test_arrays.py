"""An array has an id of its own, and every command that takes ids accepts it.

`gpuq submit --array 0-2` prints `Submitted array job A (3 tasks: B-D)`: A
names the array, B-D its tasks. `ls`, `show`, `hold`, `release`, `cancel`,
`wait` and `--after` given A act on the whole array, as Slurm's `32_[0-2]`
does, while each task keeps its own id.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys

from tests.daemon_harness import DaemonHarness, listed, wait_for
from tests.daemon_harness import submit_cli as submit


def submit_array(daemon: DaemonHarness, *args: str) -> tuple[int, list[int]]:
    """Submit a 3-task array with `args` before the command; (array id, task ids)."""
    result = daemon.cli("submit", "--gpus", "0", "--array", "0-2", *args)
    assert result.returncode == 0, result.stderr
    found = re.fullmatch(r"Submitted array job (\d+) \(3 tasks: (\d+)-(\d+)\)\n", result.stdout)
    assert found, result.stdout
    array_id, first, last = map(int, found.groups())
    return array_id, list(range(first, last + 1))


def test_submit_names_the_array_apart_from_its_tasks(daemon: DaemonHarness) -> None:
    array_id, tasks = submit_array(daemon, "--hold", "--", "true")
    assert len(tasks) == 3 and array_id not in tasks
    as_json = daemon.cli(
        "submit", "--json", "--gpus", "0", "--array", "0-1", "--hold", "--", "true"
    )
    reply = json.loads(as_json.stdout)
    assert reply["array_id"] not in reply["ids"] and len(reply["ids"]) == 2


def test_ls_and_show_of_an_array_id_list_its_tasks(daemon: DaemonHarness) -> None:
    array_id, tasks = submit_array(daemon, "--hold", "--", "true")
    other = submit(daemon, "--gpus", "0", "--hold", "--", "true")
    assert [job["id"] for job in listed(daemon, str(array_id))] == tasks
    assert other not in [job["id"] for job in listed(daemon, str(array_id))]
    shown = daemon.cli("show", str(array_id))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"Array {array_id}: true (3 tasks: 3 held)\n")
    assert all(f"\n{task} " in shown.stdout for task in tasks)


def test_release_and_wait_act_on_every_task(daemon: DaemonHarness) -> None:
    array_id, tasks = submit_array(daemon, "--hold", "--", "true")
    released = daemon.cli("release", str(array_id))
    assert released.returncode == 0, released.stderr
    assert released.stdout == "".join(f"job {task}: queued\n" for task in tasks)
    waited = daemon.cli("wait", "--json", str(array_id))
    assert waited.returncode == 0, waited.stderr
    jobs = json.loads(waited.stdout)["jobs"]
    assert [(job["id"], job["state"]) for job in jobs] == [(t, "succeeded") for t in tasks]


def test_hold_and_cancel_act_on_every_task(daemon: DaemonHarness) -> None:
    array_id, tasks = submit_array(daemon, "--begin", "now+1h", "--", "true")
    held = daemon.cli("hold", str(array_id))
    assert held.returncode == 0, held.stderr
    assert {job["state"] for job in listed(daemon, str(array_id))} == {"held"}
    cancelled = daemon.cli("cancel", str(array_id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == "".join(f"job {task}: cancelled\n" for task in tasks)


def test_an_action_on_a_large_array_prints_a_range_not_a_line_per_task(
    daemon: DaemonHarness,
) -> None:
    result = daemon.cli(
        "submit", "--json", "--gpus", "0", "--hold", "--array", "0-11", "--", "true"
    )
    assert result.returncode == 0, result.stderr
    submitted = json.loads(result.stdout)
    array_id, tasks = submitted["array_id"], submitted["ids"]
    assert len(tasks) == 12
    cancelled = daemon.cli("cancel", str(array_id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout == f"jobs {tasks[0]}-{tasks[-1]}: cancelled\n"
    again = daemon.cli("cancel", str(tasks[0]), str(array_id))
    assert again.returncode == 4
    assert again.stderr == (
        f"gpuq: job {tasks[0]} already ended (cancelled)\n"
        f"gpuq: array {array_id} has no task to cancel (11 cancelled)\n"
    )


def test_an_action_on_an_array_acts_on_the_tasks_it_applies_to_and_passes_over_the_rest(
    daemon: DaemonHarness,
) -> None:
    """`gpuq hold ARRAY` while two tasks run holds the two that wait, and that is a success."""
    result = daemon.cli("submit", "--json", "--gpus", "0", "--array", "0-3%2", "--", "sleep", "60")
    assert result.returncode == 0, result.stderr
    array_id, tasks = json.loads(result.stdout)["array_id"], json.loads(result.stdout)["ids"]
    wait_for(lambda: len(listed(daemon, str(array_id), "--state", "running")) == 2, what="2 runs")
    queued = [job["id"] for job in listed(daemon, str(array_id), "--state", "queued")]
    held = daemon.cli("hold", str(array_id))
    assert (held.returncode, held.stderr) == (0, "")
    assert held.stdout == "".join(f"job {task}: held\n" for task in queued)
    suspended = daemon.cli("resume", str(array_id))
    assert suspended.returncode == 4
    assert suspended.stderr == f"gpuq: array {array_id} has no task to resume (2 held, 2 running)\n"
    daemon.cli("cancel", str(tasks[0]))  # a cancel of the array cut short, say
    rest = daemon.cli("cancel", str(array_id))
    assert (rest.returncode, rest.stderr) == (0, ""), "what is left is cancelled, nothing failed"
    assert {job["state"] for job in listed(daemon, str(array_id))} == {"cancelled"}


def test_an_id_given_twice_or_as_a_task_of_an_array_given_too_is_acted_on_once(
    daemon: DaemonHarness,
) -> None:
    array_id, tasks = submit_array(daemon, "--hold", "--", "true")
    released = daemon.cli("release", str(tasks[0]), str(tasks[0]), str(array_id))
    assert (released.returncode, released.stderr) == (0, "")
    assert released.stdout == "".join(f"job {task}: queued\n" for task in tasks)
    waited = daemon.cli("wait", "--json", str(array_id), str(tasks[-1]))
    assert [job["id"] for job in json.loads(waited.stdout)["jobs"]] == tasks


def test_a_command_for_one_job_given_an_array_id_names_its_tasks(daemon: DaemonHarness) -> None:
    array_id, tasks = submit_array(daemon, "--hold", "--", "true")
    for command in (("logs",), ("metrics",), ("migrate", "--to", "elsewhere")):
        result = daemon.cli(*command[:1], str(array_id), *command[1:])
        assert result.returncode == 3, (command, result.stderr)
        assert f"{array_id} is an array, not a job" in result.stderr
        assert f"give one of its tasks' ids, {tasks[0]} to {tasks[-1]}" in result.stderr


def test_after_an_array_id_waits_for_the_whole_array(daemon: DaemonHarness) -> None:
    gate = daemon.root / "gate"
    task = f"[ $GPUQ_ARRAY_INDEX != 2 ] || while [ ! -e {gate} ]; do sleep 0.05; done"
    array_id, tasks = submit_array(daemon, "--", "sh", "-c", task)
    dependent = submit(daemon, "--gpus", "0", "--after", str(array_id), "--", "true")
    for first_two in tasks[:2]:
        daemon.wait_state(first_two, "succeeded")
    daemon.wait_state(tasks[2], "running")
    job = daemon.job(dependent)
    assert (job["state"], job["reason"]) == ("queued", f"waiting for job {array_id} (ok)")
    gate.touch()
    daemon.wait_state(dependent, "succeeded")


def test_after_ok_on_an_array_with_a_failed_task_never_runs(daemon: DaemonHarness) -> None:
    array_id, _ = submit_array(daemon, "--", "sh", "-c", "exit $GPUQ_ARRAY_INDEX")
    dependent = submit(daemon, "--gpus", "0", "--after", f"{array_id}:ok", "--", "true")
    job = daemon.wait_state(dependent, "cancelled")
    assert job["reason"] == (
        f"dependency {array_id}:ok can never be satisfied: job {array_id} failed"
    )


def test_an_arrays_tasks_store_their_environment_once_and_each_runs_with_it(
    daemon: DaemonHarness,
) -> None:
    """A shell with a megabyte of variables must not write a megabyte per task."""
    big = {f"GPUQ_TEST_BIG{i}": "x" * 60_000 for i in range(4)}  # 128 KiB at most each
    script = 'test "${#GPUQ_TEST_BIG3}" = 60000'
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", "submit", "--json", "--gpus", "0", "--hold",
         "--array", "0-49", "--", "sh", "-c", script],
        env={**daemon.env, **big}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    submitted = json.loads(result.stdout)
    [database] = daemon.state_dir.glob("*.db")
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as db:
        in_tasks = db.execute("SELECT SUM(LENGTH(env)) FROM jobs").fetchone()[0]
        in_array = db.execute("SELECT LENGTH(env) FROM arrays").fetchone()[0]
    assert in_tasks == 0 and 240_000 < in_array < 480_000  # once, not 50 times
    daemon.cli("release", str(submitted["array_id"]))
    waited = daemon.cli("wait", "--timeout", "300s", str(submitted["array_id"]))
    assert waited.returncode == 0, waited.stderr  # every task saw the variable
