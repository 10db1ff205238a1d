"""The CLI documents itself, and the documentation cannot drift from the code.

Every command has help text and a generated man page that matches the
command tree; `--help` and shell completion work through the real `gpuq`
entry point; every key the CLI prints with `--json` is in
docs/json-schema.md, and every protocol method is in docs/protocol.md.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuq.cli.app import app
from gpuq.cli.manpages import EXAMPLES, EXIT_STATUS, CommandDoc, command_tree, escape, generate
from gpuq.cli.manpages import main as manpages_main
from gpuq.cli.submit import SUBMIT_OPTIONS
from gpuq.env import CONTRACT
from gpuq.errors import ExitCode, GpuqError
from gpuq.models import JobState
from gpuq.protocol import METHODS
from tests.daemon_harness import DaemonHarness

ROOT = Path(__file__).resolve().parents[1]
MAN_DIR = ROOT / "man"
JSON_SCHEMA_DOC = ROOT / "docs" / "json-schema.md"
PROTOCOL_DOC = ROOT / "docs" / "protocol.md"

COMMANDS = command_tree()
MAN_SECTIONS = (
    "NAME",
    "SYNOPSIS",
    "DESCRIPTION",
    "OPTIONS",
    "ENVIRONMENT",
    '"EXIT STATUS"|EXIT STATUS',
    "EXAMPLES",
    '"SEE ALSO"|SEE ALSO',
)
INTERNAL_VARIABLES = {"GPUQ_CRASH_POINT"}
"""GPUQ_* names in the code that users never set (fault injection for tests)."""


def gpuq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real console entry point (`gpuq.cli.entry:main`)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def page_text(doc: CommandDoc) -> str:
    return (MAN_DIR / f"{doc.page}.1").read_text()


def section(markdown: str, heading: str) -> str:
    """The text under a markdown heading, up to the next heading."""
    lines = markdown.splitlines()
    for number, line in enumerate(lines):
        if re.fullmatch(rf"#+ {re.escape(heading)}", line):
            body = []
            for following in lines[number + 1 :]:
                if following.startswith("#"):
                    break
                body.append(following)
            return "\n".join(body)
    raise AssertionError(f"no section {heading!r}")


def table_keys(text: str) -> set[str]:
    """The backquoted names in the first column of a markdown table."""
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE))


# -- help text and man pages -------------------------------------------------


@pytest.mark.parametrize("doc", COMMANDS, ids=lambda doc: doc.invocation)
def test_every_command_has_help_text(doc: CommandDoc) -> None:
    assert doc.command.get_short_help_str().strip(), f"{doc.invocation} has no help text"


@pytest.mark.parametrize("doc", COMMANDS, ids=lambda doc: doc.invocation)
def test_every_command_has_a_man_page_with_every_section(doc: CommandDoc) -> None:
    path = MAN_DIR / f"{doc.page}.1"
    assert path.exists(), f"no man page for {doc.invocation}: run python -m gpuq.cli.manpages"
    text = path.read_text()
    for heading in MAN_SECTIONS:
        assert re.search(rf"^\.SH (?:{heading})$", text, re.MULTILINE), (path.name, heading)


@pytest.mark.parametrize("doc", COMMANDS, ids=lambda doc: doc.invocation)
def test_every_option_is_in_its_man_page(doc: CommandDoc) -> None:
    text = page_text(doc)
    for param in doc.command.get_params(doc.ctx):
        for flag in (*param.opts, *param.secondary_opts):
            if flag.startswith("-"):
                assert f"\\fB{escape(flag)}\\fR" in text, (doc.page, flag)


@pytest.mark.parametrize("doc", COMMANDS, ids=lambda doc: doc.invocation)
def test_every_command_has_an_example(doc: CommandDoc) -> None:
    assert EXAMPLES.get(doc.key), f"add examples for {doc.invocation} to gpuq/cli/manpages.py"


def test_every_exit_status_has_a_meaning() -> None:
    assert set(EXIT_STATUS) == set(ExitCode)


def test_the_committed_man_pages_match_the_command_tree(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = manpages_main(["--check", "--out", str(MAN_DIR)])
    assert status == 0, capsys.readouterr().err


def test_check_names_each_page_that_drifted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert manpages_main(["--out", str(tmp_path)]) == 0
    assert manpages_main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "gpuq-ls.1").write_text("edited by hand\n")
    (tmp_path / "gpuq-show.1").unlink()
    (tmp_path / "gpuq-frobnicate.1").write_text("a removed command\n")
    capsys.readouterr()

    assert manpages_main(["--check", "--out", str(tmp_path)]) == 1

    err = capsys.readouterr().err
    assert "gpuq-ls.1 (differs)" in err
    assert "gpuq-show.1 (missing)" in err
    assert "gpuq-frobnicate.1 (no such command any more)" in err


def test_generation_is_deterministic() -> None:
    assert generate() == generate()
    for text in generate().values():
        assert not re.search(r"\d{4}-\d\d-\d\d", text), "a date in a man page"
        assert str(ROOT) not in text


def test_every_page_lists_every_variable_and_exit_status() -> None:
    gpuq_vars = ("GPUQ_CONFIG", "GPUQ_STATE_DIR", "GPUQ_RUNTIME_DIR")
    for doc in COMMANDS:
        text = page_text(doc)
        for name in (*CONTRACT, *gpuq_vars):
            assert f".B {escape(name)}\n" in text, (doc.page, name)
        for code in ExitCode:
            assert f".B {int(code)}\n" in text, (doc.page, code.name)


def test_every_gpuq_variable_in_the_code_is_in_the_man_page() -> None:
    used: set[str] = set()
    for path in (ROOT / "gpuq").rglob("*.py"):
        used |= set(re.findall(r"\bGPUQ_[A-Z_]*[A-Z]\b", path.read_text()))
    text = (MAN_DIR / "gpuq.1").read_text()
    missing = sorted(name for name in used - INTERNAL_VARIABLES if f".B {name}\n" not in text)
    assert not missing, f"document these in gpuq/env.py (or manpages.py): {missing}"


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff is not installed")
def test_man_pages_render_without_warnings() -> None:
    result = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", *sorted(map(str, MAN_DIR.glob("*.1")))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0
    assert result.stderr == ""


# -- --help ----------------------------------------------------------------------


@pytest.mark.parametrize("doc", COMMANDS, ids=lambda doc: doc.invocation)
def test_every_command_answers_help(doc: CommandDoc) -> None:
    result = CliRunner().invoke(app, [*doc.words, "--help"], prog_name="gpuq")
    assert result.exit_code == 0, result.output
    assert f"Usage: {doc.invocation}" in result.output
    assert doc.command.get_short_help_str(limit=60).rstrip(".") in " ".join(result.output.split())


@pytest.mark.parametrize("doc", COMMANDS, ids=lambda doc: doc.invocation)
def test_every_option_that_takes_a_value_names_what_it_takes(doc: CommandDoc) -> None:
    """`--config FILE`, `--timeout DURATION`: never typer's bare `<str>` or `<int>`."""
    result = CliRunner().invoke(app, [*doc.words, "--help"], prog_name="gpuq", terminal_width=200)
    options = [line.strip() for line in result.output.splitlines() if line.strip().startswith("-")]
    unnamed = [line for line in options if re.match(r"(-\w, )?--[\w-]+ <[^>]+>", line)]
    assert unnamed == []


CONFIGURED = [doc for doc in COMMANDS if any(p.name == "config" for p in doc.command.params)]


@pytest.mark.parametrize("doc", CONFIGURED, ids=lambda doc: doc.invocation)
def test_every_config_option_names_the_variable_that_sets_it(doc: CommandDoc) -> None:
    result = CliRunner().invoke(app, [*doc.words, "--help"], prog_name="gpuq", terminal_width=200)
    (line,) = [line for line in result.output.splitlines() if line.strip().startswith("--config")]
    assert line.rstrip().endswith("[env var: GPUQ_CONFIG]")


def test_submit_is_among_the_commands_whose_config_option_is_checked() -> None:
    assert "gpuq submit" in {doc.invocation for doc in CONFIGURED}


def test_gpuq_help_lists_every_command() -> None:
    result = gpuq("--help")
    assert result.returncode == 0
    assert result.stderr == ""
    for doc in COMMANDS:
        if len(doc.words) == 1:
            assert re.search(rf"^  {doc.words[0]} ", result.stdout, re.MULTILINE), doc.words


def test_submit_help_lists_every_option_from_the_fast_path_table() -> None:
    for args in (["submit", "--help"], ["submit", "-h"], ["submit", "--gpus", "2", "--help"]):
        result = gpuq(*args)
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout.startswith("Usage: gpuq submit [OPTIONS]")
        for option in SUBMIT_OPTIONS:
            for flag in option.flags:
                assert re.search(rf"(^|[ ,]){re.escape(flag)}\b", result.stdout), flag


def test_daemon_help_lists_its_subcommands() -> None:
    result = gpuq("daemon", "--help")
    assert result.returncode == 0
    for name in ("start", "stop", "restart", "status"):
        assert re.search(rf"^  {name} ", result.stdout, re.MULTILINE), name


# -- shell completion --------------------------------------------------------


def complete(words: str) -> list[str]:
    """Completions for the command line `words`, as bash asks for them."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    result = gpuq(
        env={"_GPUQ_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_completion_offers_commands() -> None:
    offered = complete("gpuq su")
    assert "submit" in offered
    assert all(word.startswith("su") for word in offered)
    assert set(complete("gpuq daemon st")) == {"start", "stop", "status"}


def test_completion_offers_options_of_submit() -> None:
    assert {"--gpus", "--gpu-mem"} <= set(complete("gpuq submit --gp"))
    assert "--follow" in complete("gpuq logs --fo")


def test_completion_scripts_call_back_into_gpuq() -> None:
    bash = gpuq(env={"_GPUQ_COMPLETE": "source_bash"})
    assert bash.returncode == 0
    assert "_GPUQ_COMPLETE=complete_bash" in bash.stdout
    assert "complete -o default -F _gpuq_completion gpuq" in bash.stdout
    zsh = gpuq(env={"_GPUQ_COMPLETE": "source_zsh"})
    assert zsh.returncode == 0
    assert "compdef _gpuq_completion gpuq" in zsh.stdout


def test_install_and_show_completion_are_offered() -> None:
    result = gpuq("--help")
    assert "--install-completion" in result.stdout
    assert "--show-completion" in result.stdout


# -- docs/json-schema.md -------------------------------------------------------


def json_out(daemon: DaemonHarness, *args: str) -> dict[str, Any]:
    """Run a command with --json (before any `--`) and parse its stdout."""
    split = args.index("--") if "--" in args else len(args)
    result = daemon.cli(*args[:split], "--json", *args[split:])
    assert result.stderr == "", result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def test_every_key_the_cli_prints_is_documented(daemon: DaemonHarness) -> None:
    failed = int(daemon.cli("submit", "-q", "--", "sh", "-c", "exit 3").stdout)
    daemon.wait_state(failed, "failed")
    shown = json_out(daemon, "show", str(failed))
    gpus = json_out(daemon, "gpus")
    printed = {
        "Documents by command": {
            *shown,
            *json_out(daemon, "ls"),
            *json_out(daemon, "submit", "--gpus", "0", "--", "true"),
            *json_out(daemon, "cancel", str(failed)),
            *json_out(daemon, "doctor"),
        }
        - {"schema_version"},
        "Job object": set(shown["job"]),
        "Job spec": set(shown["job"]["spec"]),
        "Event object": set(shown["events"][0]),
        "GPU object": set(gpus["gpus"][0]),
        "GPUs document": set(gpus) - {"schema_version"},
        "Action result object": set(json_out(daemon, "cancel", str(failed))["results"][0]),
        "Clean document": set(json_out(daemon, "clean", "--dry-run")) - {"schema_version"},
        "Daemon status document": set(json_out(daemon, "daemon", "status")) - {"schema_version"},
        "Check object": set(json_out(daemon, "doctor")["checks"][0]),
        "Errors": set(json.loads(daemon.cli("show", "999", "--json").stderr)["error"]),
    }
    doc = JSON_SCHEMA_DOC.read_text()
    undocumented = {}
    for heading, keys in printed.items():
        text = section(doc, heading)
        missing = {k for k in keys if f"`{k}`" not in text}
        if missing:
            undocumented[heading] = sorted(missing)
    assert not undocumented, f"add these keys to docs/json-schema.md: {undocumented}"


def test_every_key_of_the_simulation_document_is_documented() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", "sim", "--json", "-w", "lab:1"]
        + ["-p", "fifo", "--users", "ann=1,bo=1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    document = json.loads(result.stdout)
    summary = document["results"]["fifo"]
    schema = JSON_SCHEMA_DOC.read_text()
    doc = section(schema, "Simulation document") + section(schema, "Simulation summary")
    printed = {
        *(set(document) - {"schema_version"}),
        *document["settings"],
        *document["settings"]["lab"],
        *summary,
        *summary["users"]["ann"],
    }
    assert {key for key in printed if f"`{key}`" not in doc} == set()


def test_the_json_schema_documents_no_key_that_is_not_printed(daemon: DaemonHarness) -> None:
    job_id = int(daemon.cli("submit", "-q", "--gpus", "0", "--", "true").stdout)
    daemon.wait_state(job_id, "succeeded")
    job = json_out(daemon, "show", str(job_id))["job"]
    doc = JSON_SCHEMA_DOC.read_text()
    assert table_keys(section(doc, "Job object")) == set(job)
    assert table_keys(section(doc, "Job spec")) == set(job["spec"])


def test_the_json_schema_documents_every_state_exit_status_and_error_code() -> None:
    doc = JSON_SCHEMA_DOC.read_text()
    assert table_keys(section(doc, "States")) == {state.value for state in JobState}
    statuses = set(re.findall(r"^\| (\d+) \|", section(doc, "Exit status"), re.MULTILINE))
    assert statuses == {str(int(code)) for code in ExitCode}

    def codes(cls: type[GpuqError]) -> set[str]:
        return {cls.code}.union(*(codes(sub) for sub in cls.__subclasses__()))

    documented = table_keys(section(doc, "Errors"))
    assert codes(GpuqError) <= documented


def test_the_error_code_table_gives_each_code_its_exit_status() -> None:
    table = section(JSON_SCHEMA_DOC.read_text(), "Errors").split("| `code` | Exit status |")[1]
    rows = [line for line in table.splitlines() if line.startswith("|")][1:]
    documented = {}
    for row in rows:
        match = re.fullmatch(r"\| `(\w+)` \| (\d+) \| [^|]+ \|", row)
        assert match, f"docs/json-schema.md: a malformed row in the error codes: {row!r}"
        documented[match[1]] = int(match[2])

    def classes(cls: type[GpuqError]) -> list[type[GpuqError]]:
        return [cls, *(c for sub in cls.__subclasses__() for c in classes(sub))]

    for cls in classes(GpuqError):
        assert documented.get(cls.code) == int(cls.exit_code), f"{cls.__name__} ({cls.code})"


# -- docs/protocol.md ------------------------------------------------------------


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_protocol_method_is_documented_with_its_params(method: str) -> None:
    text = section(PROTOCOL_DOC.read_text(), f"`{method}`")
    assert "Result" in text, f"docs/protocol.md: {method} does not say what it returns"
    params = {field.name for field in dataclasses.fields(METHODS[method])}
    documented = table_keys(text)
    assert documented == params, f"docs/protocol.md: params of {method}"


def test_the_protocol_doc_describes_no_method_that_does_not_exist() -> None:
    headings = re.findall(r"^### `([\w.]+)`$", PROTOCOL_DOC.read_text(), re.MULTILINE)
    assert sorted(headings) == sorted(METHODS)
