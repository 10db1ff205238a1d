r"""User text cannot drive the terminal: every human-readable output escapes it.

Job names, commands, paths, reasons and messages are user text. Shown by
`gpuq ls`, `show`, `gpus`, errors, `doctor`, `sim` or `gpuq top`, ESC, BEL,
C1 codes and newlines in them appear as `\x1b`, `\x07`, `\x9b`, `\n`
(`gpuq.textsafe.visible`): they cannot clear the screen, set the window
title, ring or forge a table row. In `gpuq top` a job named `[bold]x` shows
its brackets: user text is never Rich markup. `--json` keeps every string
exact. `gpuq logs` is the job's own data and stays raw, like `cat`.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Log, Static

from gpuq.cli.doctor import Check, print_checks
from gpuq.cli.errors import render_error
from gpuq.cli.render import gpus_table, job_detail, jobs_table, metrics_table, table
from gpuq.cli.sim import results_table
from gpuq.errors import GpuqError, UsageError
from gpuq.textsafe import UNSAFE_CHARACTERS, visible
from gpuq.tui.app import GpuqTop
from gpuq.tui.detail import JobDetailScreen
from gpuq.tui.replay import ReplaySource, synthetic_lab
from tests.daemon_harness import DaemonHarness

NOW = 1_800_000_000.0
CLEAR = "x\x1b[2J"
TITLE = "\x1b]0;pwned\x07"
BEL = "ring\x07"
FORGED_ROW = "a\n99  forged  running"
C1_CSI = "c1\x9b2J"
HOSTILE = [CLEAR, TITLE, BEL, FORGED_ROW, C1_CSI, "bidi\u202eevil", "tab\tcell"]


def job(**changes: Any) -> dict[str, Any]:
    """A held job object as the daemon documents it (docs/json-schema.md)."""
    base: dict[str, Any] = {
        "id": 1,
        "name": "train",
        "user": "ana",
        "state": "held",
        "reason": "held at submission",
        "exit_code": None,
        "signal": None,
        "gpus": 1,
        "gpu_mem": None,
        "gpu_uuids": [],
        "gpu_mem_reserved": None,
        "node": "",
        "priority": 0,
        "submit_time": NOW - 60,
        "start_time": None,
        "end_time": None,
        "attempts": 0,
        "array_id": None,
        "array_index": None,
        "stdout": "",
        "stderr": "",
        "spec": {
            "command": ["python", "train.py"],
            "cwd": "/home/ana",
            "retries": 0,
            "after": [],
            "time_limit": None,
            "begin": None,
            "notify": None,
            "gpu_mem_auto": False,
        },
    }
    spec = {**base["spec"], **changes.pop("spec", {})}
    return {**base, **changes, "spec": spec}


def assert_safe(text: str) -> None:
    """No line of `text` holds a character a terminal would act on."""
    for line in text.split("\n"):
        assert not UNSAFE_CHARACTERS & set(line), repr(line)


# The pure renderers


@pytest.mark.parametrize("hostile", HOSTILE)
def test_ls_prints_one_row_per_job_and_escapes_every_cell(hostile: str) -> None:
    jobs = [
        job(id=1, name=hostile[:24], user=hostile, reason=hostile),
        job(id=2, name="plain"),
    ]
    out = jobs_table(jobs, now=NOW)
    assert_safe(out)
    lines = out.split("\n")
    assert len(lines) == 3  # the header and exactly one row per job
    assert [line.split()[0] for line in lines] == ["ID", "1", "2"]
    assert visible(hostile[:24]) in lines[1]


def test_a_newline_in_a_name_cannot_forge_a_row() -> None:
    out = jobs_table([job(name=FORGED_ROW)], now=NOW)
    assert out.split("\n")[1].startswith("1   a\\n99  forged  running  held")
    assert not any(line.startswith("99") for line in out.split("\n"))


@pytest.mark.parametrize("hostile", HOSTILE)
def test_show_escapes_every_field_and_adds_no_line(hostile: str) -> None:
    ordinary = job(stdout="/logs/1.out", spec={"notify": "mail", "after": ["2"]})
    events = [{"time": NOW - 60, "state": "held", "reason": "held at submission"}]
    expected_lines = len(job_detail(ordinary, events).split("\n"))
    evil = job(
        name=hostile,
        user=hostile,
        reason=hostile,
        stdout=hostile,
        stderr=hostile + "err",
        spec={"command": ["echo", hostile], "cwd": hostile, "notify": hostile, "after": [hostile]},
    )
    out = job_detail(evil, [{"time": NOW - 60, "state": "held", "reason": hostile}])
    assert_safe(out)
    assert len(out.split("\n")) == expected_lines + 1  # only the extra "Errors:" line
    assert out.startswith(f"Job 1: {visible(hostile)}\n")


def test_show_and_ls_leave_ordinary_text_alone() -> None:
    ordinary = job(name="bert-ü-训练", spec={"command": ["sh", "-c", "printf 'a\\n'"]})
    out = job_detail(ordinary, []) + jobs_table([ordinary], now=NOW)
    assert "bert-ü-训练" in out
    assert """  Command:    sh -c 'printf '"'"'a\\n'"'"''\n""" in out  # quoted as a shell would


def test_show_quotes_the_command_so_that_it_can_be_copied_and_run_again() -> None:
    command = ["sh", "-c", 'echo "a b"; exit 0', "it's", ""]
    detail = job_detail(job(spec={"command": command}), [])
    (line,) = [row for row in detail.split("\n") if row.startswith("  Command:")]
    assert shlex.split(line.removeprefix("  Command:")) == command


def test_gpus_metrics_and_sim_tables_escape_their_cells() -> None:
    gpu = {
        "index": 0,
        "name": "Fake\x1b[2J A100\n1  forged",
        "memory_total": 1,
        "memory_gpuq": 0,
        "memory_foreign": 0,
        "memory_free": 1,
        "utilization": None,
        "mode": "idle",
        "jobs": [],
        "uuid": "GPU-\x9b",
        "link_group": "switch\x1b[0m",
    }
    out = gpus_table([gpu])
    assert_safe(out)
    assert len(out.split("\n")) == 2 and "Fake\\x1b[2J A100\\n1  forged" in out
    sim = results_table({"gpuq:x=\x1b]0;t\x07": {}})
    assert_safe(sim)
    assert len(sim.split("\n")) == 2
    assert_safe(metrics_table([{"time": NOW, "step": 1}]))
    assert table(["A\x07"], [["b\nc"]]) == "A\\x07\nb\\nc"


def test_errors_escape_message_and_hint_but_json_keeps_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    error = UsageError(f"cannot start {CLEAR!r} or {TITLE}", hint=f"rename {FORGED_ROW}")
    assert render_error(error) == int(error.exit_code)
    err = capsys.readouterr().err
    assert_safe(err)
    assert err == (
        "gpuq: error: cannot start 'x\\x1b[2J' or \\x1b]0;pwned\\x07\n"
        "hint: rename a\\n99  forged  running\n"
    )
    render_error(error, json_mode=True)
    wire = json.loads(capsys.readouterr().err)["error"]
    assert wire["message"] == error.message and wire["hint"] == error.hint


def test_doctor_escapes_paths_in_its_checks(capsys: pytest.CaptureFixture[str]) -> None:
    print_checks([Check("state dir", "fail", f"/tmp/{CLEAR}", hint=f"mkdir {TITLE}")])
    out = capsys.readouterr().out
    assert_safe(out)
    assert out == "[FAIL] state dir: /tmp/x\\x1b[2J\n       hint: mkdir \\x1b]0;pwned\\x07\n"


def test_a_gpuq_error_object_keeps_the_exact_text() -> None:
    assert GpuqError(CLEAR).message == CLEAR  # escaping happens only when shown


# The real CLI against a real daemon


def gpuq(daemon: DaemonHarness, *args: str, cwd: Path | None = None) -> tuple[bytes, bytes, int]:
    """Run the real `gpuq` command; its stdout and stderr as bytes, and its exit code."""
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        env=daemon.env,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=cwd or daemon.root,
    )
    return result.stdout, result.stderr, result.returncode


def assert_terminal_safe(output: bytes) -> None:
    """No ESC, BEL or C1 CSI, and no other unsafe character inside a line."""
    assert b"\x1b" not in output and b"\x07" not in output
    assert_safe(output.decode())


HOSTILE_NAME = "x\x1b[2J\x07\n9  forged"
HOSTILE_ARGS = ("echo", TITLE, "c1\x9b", "bidi\u202e")


def submit_hostile(daemon: DaemonHarness) -> tuple[int, int, Path]:
    """A held job with a hostile name, arguments and directory, and an ordinary one."""
    cwd = daemon.root / "dir\x1b[31m\nx"
    cwd.mkdir()
    out, err, code = gpuq(
        daemon, "submit", "-q", "--hold", "--name", HOSTILE_NAME, "--", *HOSTILE_ARGS, cwd=cwd
    )
    assert code == 0, err
    plain = gpuq(daemon, "submit", "-q", "--hold", "--name", "plain", "--", "echo", "hi")
    return int(out), int(plain[0]), cwd


def test_ls_and_show_through_the_cli_keep_escapes_off_the_terminal(
    daemon: DaemonHarness,
) -> None:
    evil, plain, cwd = submit_hostile(daemon)

    out, err, code = gpuq(daemon, "ls")
    assert code == 0, err
    assert_terminal_safe(out)
    rows = out.decode().rstrip("\n").split("\n")
    assert [row.split()[0] for row in rows] == ["ID", str(evil), str(plain)]
    assert "x\\x1b[2J\\x07\\n9  forged" in rows[1]

    shown, err, code = gpuq(daemon, "show", str(evil))
    assert code == 0, err
    assert_terminal_safe(shown)
    text = shown.decode()
    assert text.startswith(f"Job {evil}: x\\x1b[2J\\x07\\n9  forged\n")
    assert "  Command:    echo '\\x1b]0;pwned\\x07' 'c1\\x9b' 'bidi\\u202e'\n" in text
    assert f"  Directory:  {daemon.root}/dir\\x1b[31m\\nx\n" in text
    ordinary, _, _ = gpuq(daemon, "show", str(plain))
    assert len(text.split("\n")) == len(ordinary.decode().split("\n"))


def test_json_keeps_the_exact_strings(daemon: DaemonHarness) -> None:
    evil, _, cwd = submit_hostile(daemon)

    out, err, code = gpuq(daemon, "ls", "--json")
    assert code == 0, err
    assert b"\x1b" not in out  # json.dumps writes \u001b
    listed = {j["id"]: j for j in json.loads(out)["jobs"]}
    assert listed[evil]["name"] == HOSTILE_NAME
    assert listed[evil]["spec"]["command"] == list(HOSTILE_ARGS)
    assert listed[evil]["spec"]["cwd"] == str(cwd)

    out, err, code = gpuq(daemon, "show", "--json", str(evil))
    assert code == 0, err
    assert json.loads(out)["job"]["name"] == HOSTILE_NAME


def test_an_error_quoting_user_input_is_escaped(daemon: DaemonHarness) -> None:
    out, err, code = gpuq(daemon, "submit", "--", "no-such-command\x1b[2J\x07")
    assert code != 0 and out == b""
    assert_terminal_safe(err)
    assert b"no-such-command\\x1b[2J\\x07" in err


# gpuq top


def screen_output(app: GpuqTop) -> str:
    """What the app writes to a terminal to draw its whole screen (as `export_screenshot`)."""
    width, height = app.size
    out = io.StringIO()
    console = Console(
        width=width, height=height, file=out, force_terminal=True, color_system="truecolor"
    )
    console.print(app.screen._compositor.render_update(full=True))
    return out.getvalue()


# Textual itself draws with SGR (colours) and cursor positioning; nothing else may appear.
TEXTUAL_SEQUENCES = re.compile(r"\x1b\[[0-9;]*[mH]")


def assert_screen_safe(app: GpuqTop) -> str:
    """The drawn screen holds no sequence but Textual's own; returns it without them."""
    drawn = TEXTUAL_SEQUENCES.sub("", screen_output(app))
    assert "\x1b" not in drawn and "\x07" not in drawn and "\x9b" not in drawn
    return drawn


def plain_text(widget: Static) -> str:
    """What a Static widget shows, as text."""
    console = Console(width=200, file=io.StringIO(), record=True)
    console.print(widget.content)
    return console.export_text()


def test_top_shows_markup_and_escapes_in_user_text_literally() -> None:
    lab = synthetic_lab(n_jobs=6, n_gpus=2, now=NOW)
    target = next(j for j in lab.jobs if j["state"] in ("running", "queued", "held"))
    name = "[bold]x\x1b[2J"
    target.update(
        name=name,
        user="ana\x07",
        reason="[/red] waiting\x1b]0;pwned\x07",
        spec={**target["spec"], "command": ["python", "[/]", "\x1b[31mred"], "cwd": "/w/\x9b2J"},
    )
    lab.events[target["id"]] = [{"time": NOW - 5, "state": "queued", "reason": "[/x]\x1b[2J"}]
    lab.logs[target["id"]] = "step 1\x1b[2J\n[bold]loss\x07 0.5\n"
    lab.node = "gpu1\x1b[2J[/]"
    for sample in lab.gpu_samples:
        sample["gpus"][0]["name"] = "F\x1b]0;t\x07[red]G"
    app = GpuqTop(ReplaySource(lab), interval=3600, clock=lambda: NOW, reconnect_delays=(3600,))

    async def until(pilot: Pilot[Any], condition: Any) -> Any:
        for _ in range(400):
            value = condition()
            if value:
                return value
            await pilot.pause(0.05)
        raise AssertionError("the app did not get there in time")

    async def main() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            await until(pilot, lambda: app.connected and app.table.has_row(target["id"]))
            await pilot.pause()
            assert app.table.cell(target["id"], "name") == "[bold]x\\x1b[2J"
            drawn = assert_screen_safe(app)
            assert "[bold]x\\x1b[2J" in drawn and "gpu1\\x1b[2J[/]" in drawn
            assert "F\\x1b]0;t\\x07[red]G" in drawn

            await pilot.press("slash", *"name:[/x]", "enter")  # markup in the filter
            await until(pilot, lambda: app.model.job_filter.text == "name:[/x]")
            await pilot.pause()
            assert "filter 'name:[/x]'" in assert_screen_safe(app)
            await pilot.press("slash", "ctrl+a", "ctrl+k", "enter")

            await until(pilot, lambda: app.table.has_row(target["id"]))
            await pilot.press("home", *["down"] * (app.table.row_index(target["id"]) or 0))
            await pilot.press("enter")
            screen = await until(
                pilot,
                lambda: isinstance(app.screen, JobDetailScreen) and app.screen.job and app.screen,
            )
            log = screen.query_one("#log", Log)
            await until(pilot, lambda: len(log.lines) >= 2)
            await pilot.pause()
            assert log.lines[:2] == ["step 1\\x1b[2J", "[bold]loss\\x07 0.5"]
            assert "[bold]x\\x1b[2J" in plain_text(screen.query_one("#title", Static))
            facts = plain_text(screen.query_one("#facts", Static))
            assert "python '[/]' '\\x1b[31mred'" in facts
            assert "/w/\\x9b2J" in facts and "[/red] waiting\\x1b]0;pwned\\x07" in facts
            assert "[/x]\\x1b[2J" in plain_text(screen.query_one("#history", Static))
            assert_screen_safe(app)
            await pilot.press("q")

    asyncio.run(main())
