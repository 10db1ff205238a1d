"""A command line gpuq cannot parse is refused as any other gpuq error.

An unknown option or command, a missing argument or a value of the wrong
type: "gpuq: error:" and a hint naming the help to read, on stderr, exit
status 2, nothing on stdout; the JSON error object instead where the command
takes --json and was given it. Run through the real entry point, no daemon.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.errors import ExitCode


def gpuq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        env={**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["ls", "--bogus"], "no such option: --bogus", "see gpuq ls --help"),
        (["ls", "--state"], "option '--state' requires an argument", "see gpuq ls --help"),
        (["show"], "missing argument 'ID'", "see gpuq show --help"),
        (
            ["show", "x"],
            "invalid value for 'ID': got 'x': input should be a valid integer",
            "see gpuq show --help",
        ),
        (
            ["ls", "1", "2", "3x"],
            "invalid value for 'ID': got '3x': input should be a valid integer",
            "see gpuq ls --help",
        ),
        (
            ["ls", "--limit", "-3"],
            "invalid value for '--limit': got '-3': input should be greater than or equal to 1",
            "see gpuq ls --help",
        ),
        (["lss"], "no such command 'lss'. Did you mean 'ls'?", "see gpuq --help"),
        (["daemon", "bogus"], "no such command 'bogus'", "see gpuq daemon --help"),
        (["cluster", "add"], "missing argument 'HOST'", "see gpuq cluster add --help"),
        (["top", "--json"], "no such option: --json", "see gpuq top --help"),
        (
            ["daemon", "run", "--log-level", "BOGUS"],
            "--log-level must be one of DEBUG, INFO, WARNING, ERROR (in any case), got 'BOGUS'",
            "e.g. gpuq daemon run --log-level debug",
        ),
    ],
    ids=[
        "unknown-option",
        "option-without-value",
        "missing-argument",
        "not-an-integer",
        "which-of-several-ids",
        "out-of-range",
        "unknown-command",
        "unknown-subcommand",
        "nested-missing-argument",
        "json-where-none-is-taken",
        "unknown-log-level",
    ],
)
def test_a_refused_command_line_is_a_gpuq_error_with_a_hint(
    args: list[str], message: str, hint: str
) -> None:
    result = gpuq(*args)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stdout == ""
    first, second = result.stderr.splitlines()
    assert first.startswith(f"gpuq: error: {message}")
    assert second == f"hint: {hint}"
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["show", "--json"], "missing argument 'ID'", "see gpuq show --help"),
        (["ls", "--json", "--bogus"], "no such option: --bogus", "see gpuq ls --help"),
    ],
)
def test_with_json_the_refusal_is_the_json_error_object(
    args: list[str], message: str, hint: str
) -> None:
    result = gpuq(*args)
    assert result.returncode == ExitCode.USAGE
    assert result.stdout == ""
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "invalid"
    assert error["message"].startswith(message)
    assert (error["hint"], error["exit_code"]) == (hint, ExitCode.USAGE)


@pytest.mark.parametrize("args", [[], ["daemon"], ["cluster"]])
def test_a_group_given_no_command_prints_its_help_to_stderr_with_status_2(args: list[str]) -> None:
    result = gpuq(*args)
    assert result.returncode == ExitCode.USAGE
    assert result.stdout == ""
    assert result.stderr.startswith(f"Usage: {' '.join(['gpuq', *args])} [OPTIONS] COMMAND")


def test_an_empty_timeout_is_refused_not_taken_for_none() -> None:
    """`gpuq wait --timeout "$T"` with T unset must not wait forever."""
    result = gpuq("wait", "1", "--timeout", "")
    assert result.returncode == ExitCode.USAGE
    assert result.stderr.startswith("gpuq: error: invalid duration ''\nhint: use 90s, 15m")


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "--gpus", "0", "--", "true"],  # the job's cwd
        ["submit", "--json", "--gpus", "0", "--output", "out.log", "--", "true"],
        ["submit", "./train.sh"],  # a script, found from here
    ],
    ids=["cwd", "output-json", "script"],
)
def test_a_working_directory_deleted_under_the_shell_is_a_usage_error_not_a_traceback(
    tmp_path: Path, args: list[str]
) -> None:
    here = tmp_path / "experiment"
    here.mkdir()
    entry = shlex.join([sys.executable, "-m", "gpuq.cli.entry", *args])
    result = subprocess.run(
        ["sh", "-c", f'cd {shlex.quote(str(here))} && rmdir "$PWD" && exec {entry}'],
        env={
            **os.environ,
            "PYTHONPATH": str(Path(__file__).parents[1]),
            "NO_COLOR": "1",
            "XDG_STATE_HOME": str(tmp_path / "state"),  # no daemon is reached: none of yours
            "XDG_RUNTIME_DIR": str(tmp_path / "run"),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    message = "the current directory no longer exists (it was deleted after this shell entered it)"
    if "--json" in args:
        assert json.loads(result.stderr)["error"]["message"] == message
    else:
        assert result.stderr.startswith(f"gpuq: error: {message}\nhint: cd to a directory")
