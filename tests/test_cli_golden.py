"""Golden output of the real `gpuq` command against a real daemon.

Each test runs the CLI as a user would and compares its output with the
expected text below, after a small normalizer has replaced what differs
from run to run with tokens: `<ROOT>` (the test directory), `<GPU0>` and
`<GPU1>` (the fake GPUs' UUIDs, by index), `<TIME>` (a timestamp), `<T>`
(a duration in the TIME column of a job table), `<USER>` and `<NODE>`.
Errors go to stderr with a hint and the documented exit code; with
`--json`, stdout is exactly one JSON document and errors are JSON too.
"""

from __future__ import annotations

import getpass
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from gpuq.errors import ExitCode
from gpuq.models import JSON_SCHEMA_VERSION
from tests.daemon_harness import DaemonHarness, wait_for

DURATION = re.compile(r"\d+[dhms](?:\d\d[hms])?")
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def mask_column(text: str, header: str, token: str, pattern: re.Pattern[str]) -> str:
    """Replace the cells of one table column that match `pattern` by `token`.

    The column also gets a fixed width, so the golden text does not depend on
    how wide the real values were.
    """
    lines = text.split("\n")
    head = lines[0]
    match = re.search(rf"(?<!\S){header}(?!\S)", head)
    if match is None:
        return text
    start = match.start()
    following = re.search(r"\S", head[match.end() :])
    end = None if following is None else match.end() + following.start()
    width = max(len(header), len(token)) + 2
    out = []
    for number, line in enumerate(lines):
        cell = line[start:end].strip()
        if number == 0:
            cell = header
        elif pattern.fullmatch(cell):
            cell = token
        padded = cell if end is None else cell.ljust(width)
        out.append((line[:start] + padded + ("" if end is None else line[end:])).rstrip())
    return "\n".join(out)


class Normalizer:
    """Replaces the run-dependent parts of gpuq's output with tokens."""

    def __init__(self, daemon: DaemonHarness) -> None:
        status = daemon.call("status")
        self.node = str(status["node"])
        root = daemon.root
        self.literal = [(str(path), "<ROOT>") for path in {root.resolve(), root}]
        self.literal += [
            (gpu["uuid"], f"<GPU{gpu['index']}>") for gpu in daemon.call("gpus")["gpus"]
        ]

    def __call__(self, text: str) -> str:
        for value, token in self.literal:
            text = text.replace(value, token)
        text = TIMESTAMP.sub("<TIME>", text)
        text = re.sub(
            rf"^(  User: +){re.escape(getpass.getuser())}$", r"\1<USER>", text, flags=re.M
        )
        text = re.sub(rf"^(  Node: +){re.escape(self.node)}$", r"\1<NODE>", text, flags=re.M)
        if text.startswith("ID "):
            text = mask_column(text, "TIME", "<T>", DURATION)
        duration = DURATION.pattern
        text = re.sub(
            rf"(Run time: +)({duration})( .*; )({duration})", r"\1<DURATION>\3<DURATION>", text
        )
        text = re.sub(rf"( ran )({duration})", r"\1<DURATION>", text)
        return text


@pytest.fixture
def normalize(daemon: DaemonHarness) -> Normalizer:
    return Normalizer(daemon)


@pytest.fixture
def jobs_to_cancel(daemon: DaemonHarness) -> Iterator[list[int]]:
    """Ids of long jobs a test started; cancelled when it ends."""
    ids: list[int] = []
    yield ids
    if ids:
        daemon.cli("cancel", *map(str, ids))


def submit(daemon: DaemonHarness, *args: str) -> int:
    """`gpuq submit -q ARGS` (options, then `--` and the command): the new id."""
    result = daemon.cli("submit", "-q", *args)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def gpu_of_job(daemon: DaemonHarness, job_id: int) -> dict[str, Any] | None:
    """The GPU object of the job's GPU, once a sample shows the job busy on it."""
    for gpu in daemon.call("gpus")["gpus"]:
        if job_id in gpu["jobs"] and gpu["utilization"] == 100.0:
            return dict(gpu)
    return None


# -- tables and details ------------------------------------------------------------

LS_GOLDEN = """\
ID  NAME   STATE    GPUS  TIME  EXIT  REASON
2   train  running  1     <T>         started
4   later  held     1     <T>         held at submission
5   big    queued   2     <T>         waiting for 2 free GPUs (1 free)
"""

LS_ALL_GOLDEN = """\
ID  NAME   STATE      GPUS  TIME  EXIT  REASON
1   sh     failed     1     <T>   3     exited with code 3
2   train  running    1     <T>         started
3   true   succeeded  -     <T>   0     exited with code 0
4   later  held       1     <T>         held at submission
5   big    queued     2     <T>         waiting for 2 free GPUs (1 free)
"""

CANCEL_GOLDEN = """\
job 2: cancel requested
job 4: cancelled
job 5: cancelled
"""


def test_ls_lists_pending_and_running_jobs_and_with_all_the_finished_ones_too(
    daemon: DaemonHarness, normalize: Normalizer, jobs_to_cancel: list[int]
) -> None:
    failed = submit(daemon, "--", "sh", "-c", "exit 3")
    daemon.wait_state(failed, "failed")
    running = submit(daemon, "-n", "train", "--", "sleep", "30")
    done = submit(daemon, "--gpus", "0", "--", "true")
    held = submit(daemon, "--hold", "-n", "later", "--", "true")
    big = submit(daemon, "--gpus", "2", "-n", "big", "--", "sleep", "30")
    jobs_to_cancel += [running, held, big]
    daemon.wait_state(running, "running")
    daemon.wait_state(done, "succeeded")
    wait_for(
        lambda: daemon.call("list", ids=[big])["jobs"][0]["reason"].startswith("waiting"),
        what="the big job's waiting reason",
    )

    listing = daemon.cli("ls")
    everything = daemon.cli("ls", "-a")
    cancelled = daemon.cli("cancel", str(running), str(held), str(big))

    assert (listing.returncode, listing.stderr) == (0, "")
    assert normalize(listing.stdout) == LS_GOLDEN
    assert (everything.returncode, everything.stderr) == (0, "")
    assert normalize(everything.stdout) == LS_ALL_GOLDEN
    assert (cancelled.returncode, cancelled.stderr) == (0, "")
    assert cancelled.stdout == CANCEL_GOLDEN


SHOW_GOLDEN = """\
Job 1: three
  State:      failed (exited with code 3)
  Command:    sh -c 'exit 3'
  Directory:  <ROOT>
  User:       <USER>
  GPUs:       1 on <GPU0>
  Node:       <NODE>
  Priority:   5
  Submitted:  <TIME>
  Started:    <TIME>
  Ended:      <TIME>
  Run time:   <DURATION> (suspended time excluded); <DURATION> since the first start
  Exit code:  3
  Output:     <ROOT>/state/logs/1.out
  Errors:     <ROOT>/state/logs/1.err
  Time limit: 1m30s
  Attempts:   1 (retries allowed: 0)
      1  <TIME> .. <TIME>  ran <DURATION>  failed: exited with code 3
  History:
    <TIME>  queued      submitted
    <TIME>  starting    starting on <GPU0>: next in the queue at priority 5
    <TIME>  running     started
    <TIME>  failed      exited with code 3
"""


def test_show_prints_the_spec_state_gpus_timings_and_history(
    daemon: DaemonHarness, normalize: Normalizer
) -> None:
    job_id = submit(daemon, "-n", "three", "-p", "5", "-t", "90s", "--", "sh", "-c", "exit 3")
    daemon.wait_state(job_id, "failed")

    result = daemon.cli("show", str(job_id))

    assert (result.returncode, result.stderr) == (0, "")
    assert normalize(result.stdout) == SHOW_GOLDEN


GPUS_GOLDEN = """\
GPU  NAME       TOTAL  GPUQ  OTHER  FREE  UTIL  MODE    JOBS  UUID
0    Fake A100  40G    0     0      40G   100%  whole   1     <GPU0>
1    Fake A100  40G    6.0G  0      34G   100%  shared  2     <GPU1>
"""


def test_gpus_shows_memory_by_owner_and_the_jobs_on_each_gpu(
    daemon: DaemonHarness, normalize: Normalizer, jobs_to_cancel: list[int]
) -> None:
    whole = submit(daemon, "--", "sleep", "30")
    shared = submit(daemon, "--gpu-mem", "6G", "--", "sleep", "30")
    jobs_to_cancel += [whole, shared]
    wait_for(lambda: gpu_of_job(daemon, whole), what="a sample with the whole-GPU job")
    wait_for(
        lambda: (gpu := gpu_of_job(daemon, shared)) and gpu["memory_gpuq"] > 0,
        what="a sample with the shared job's memory",
    )

    result = daemon.cli("gpus")

    assert (result.returncode, result.stderr) == (0, "")
    assert normalize(result.stdout) == GPUS_GOLDEN


# -- submit ------------------------------------------------------------------


def test_submit_prints_the_id_in_each_output_form(daemon: DaemonHarness) -> None:
    cases = [
        ([], "Submitted job 1\n"),
        (["-q"], "2\n"),
        (["--parsable"], "3\n"),
        (["--json"], '{"schema_version": 1, "ids": [4], "array_id": null}\n'),
        (["--array", "0-2"], "Submitted array job 5 (3 tasks: 6-8)\n"),
        (["-q", "--array", "1,3"], "9\n"),  # the array's id, as Slurm's --parsable
        (["--json", "--array", "0-1"], '{"schema_version": 1, "ids": [13, 14], "array_id": 12}\n'),
        (["--array", "7"], "Submitted array job 15 (1 task: 16)\n"),
    ]
    for options, expected in cases:
        result = daemon.cli("submit", "--gpus", "0", *options, "--", "true")
        assert (result.returncode, result.stdout, result.stderr) == (0, expected, ""), options


# -- errors ------------------------------------------------------------------

DURATION_HINT = (
    "use 90s, 15m, 2h, 1d, 1h30m, 1.5h, or Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"
)


@pytest.mark.parametrize(
    ("args", "exit_code", "code", "message", "hint"),
    [
        (["show", "99"], ExitCode.NOT_FOUND, "not_found", "no job 99", "no job was submitted"),
        (
            ["submit", "--gpus", "5", "--", "true"],
            ExitCode.UNAVAILABLE,
            "resources",
            "the job needs 5 GPUs; this server has 2",
            "use --gpus 2 or fewer",
        ),
        (
            ["submit", "--gpus", "3-8", "--", "true"],
            ExitCode.UNAVAILABLE,
            "resources",
            "the job needs at least 3 GPUs (--gpus 3-8); this server has 2",
            "start the range at 2 or fewer, e.g. --gpus 1-8",
        ),
        (
            ["submit", "--time", "xyz", "--", "true"],
            ExitCode.USAGE,
            "invalid",
            "invalid duration 'xyz'",
            DURATION_HINT,
        ),
    ],
    ids=["unknown-job", "too-many-gpus", "range-too-high", "bad-duration"],
)
def test_an_error_goes_to_stderr_with_a_hint_and_its_exit_code(
    daemon: DaemonHarness,
    args: list[str],
    exit_code: ExitCode,
    code: str,
    message: str,
    hint: str,
) -> None:
    split = args.index("--") if "--" in args else len(args)
    plain = daemon.cli(*args)
    as_json = daemon.cli(*args[:split], "--json", *args[split:])

    assert plain.returncode == exit_code
    assert plain.stdout == ""
    assert plain.stderr == f"gpuq: error: {message}\nhint: {hint}\n"
    assert as_json.returncode == exit_code
    assert as_json.stdout == ""
    assert json.loads(as_json.stderr) == {
        "error": {"code": code, "message": message, "hint": hint, "exit_code": exit_code}
    }
    assert as_json.stderr.count("\n") == 1


# -- --json keeps stdout pure ----------------------------------------------------


def test_json_output_is_one_document_on_stdout_and_nothing_else(
    daemon: DaemonHarness, jobs_to_cancel: list[int]
) -> None:
    failed = submit(daemon, "--", "sh", "-c", "echo noise; echo more noise >&2; exit 3")
    daemon.wait_state(failed, "failed")
    running = submit(daemon, "--", "sleep", "30")
    jobs_to_cancel.append(running)
    daemon.wait_state(running, "running")
    commands: list[tuple[list[str], int]] = [
        (["ls"], 0),
        (["ls", "-a"], 0),
        (["show", str(failed)], 0),
        (["gpus"], 0),
        (["daemon", "status"], 0),
        (["wait", str(failed)], 3),  # wait exits with the job's own exit code
        (["clean", "--dry-run"], 0),
        (["clean"], 0),
        (["cancel", str(running)], 0),
    ]
    for args, status in commands:
        result = daemon.cli(*args, "--json")
        assert (result.returncode, result.stderr) == (status, ""), args
        assert result.stdout.endswith("}\n"), args
        data = json.loads(result.stdout)  # fails on anything around the document
        assert next(iter(data)) == "schema_version", args
        assert data["schema_version"] == JSON_SCHEMA_VERSION, args
