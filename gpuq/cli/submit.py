"""`gpuq submit`: its options, a fast parser, and turning them into a job spec.

`gpuq submit` must start about as fast as Python itself, so this module uses
only the standard library and gpuq's light core. `SUBMIT_OPTIONS` is the one
declaration of the options: the fast parser here executes submissions, and
the typer command tree builds its `submit` command (help, completion and man
page) from the same table.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuq.cli.errors import asks_json
from gpuq.errors import GpuqError, UsageError
from gpuq.units import MAX_INT, MAX_NODES


@dataclass(frozen=True, slots=True)
class Option:
    """One submit option: flags, destination, kind ("str", "int", "gpus", "flag", "multi").

    An "int" option's `bounds` are the lowest and highest values it takes;
    `envvar` names the variable that gives a default, for the help to show.
    """

    flags: tuple[str, ...]
    dest: str
    kind: str
    metavar: str
    help: str
    bounds: tuple[int, int] | None = None
    envvar: str | None = None


SUBMIT_OPTIONS: tuple[Option, ...] = (
    Option(
        ("--gpus", "-g"),
        "gpus",
        "gpus",
        "N|MIN-MAX",
        "Number of GPUs (0: a CPU-only job). Default 1. MIN-MAX makes the job adaptive: "
        "a goodput policy gives it from MIN to MAX GPUs by what its gpuq.runner reports "
        "(docs/runner.md) and resizes it through its checkpoint, and gpuq show says why "
        "it has the count it has; other policies give it MIN.",
    ),
    Option(
        ("--gpu-mem",),
        "gpu_mem",
        "str",
        "SIZE|auto",
        "Share GPUs instead of taking them whole: SIZE bytes on each (6G, 512M), or 'auto' "
        "to use the memory peak learned from earlier runs of a job with the same name.",
    ),
    Option(
        ("--nodes", "-N"),
        "node_count",
        "int",
        "N",
        "Run on N servers at once: one process on each, with --gpus (the total; default: "
        "the default count on each) divided evenly among them (--nodes 2 --gpus 8: 4 GPUs "
        "on each of 2 servers), started together, given "
        "the torchrun rendezvous environment (MASTER_ADDR, MASTER_PORT, NODE_RANK, "
        "WORLD_SIZE) and ended together when one part ends. Default 1.",
        (1, MAX_NODES),
    ),
    Option(("--exclusive",), "exclusive", "flag", "", "Share the GPU with no other gpuq job."),
    Option(("--name", "-n"), "name", "str", "NAME", "Job name. Default: the command's name."),
    Option(
        ("--priority", "-p"),
        "priority",
        "int",
        "N",
        "Higher runs first (under the default policy it may also preempt lower-priority "
        "jobs through their gpuq.runner checkpoint). Default 0.",
        (-MAX_INT - 1, MAX_INT),
    ),
    Option(
        ("--after", "-d"),
        "after",
        "multi",
        "ID[:ok|any|notok]",
        "Start only after job ID succeeded (ok), ended (any) or failed (notok). Repeatable; "
        "comma-separated lists work too. An array's id waits for all its tasks: ok when "
        "every task succeeded, notok when all ended and one did not.",
    ),
    Option(
        ("--array", "-a"),
        "array",
        "str",
        "SPEC",
        "Submit one task per index: 0-99, 1,3,5-7, 0-15:4; '%4' runs at most 4 at once. "
        "Each task gets its own id and sees GPUQ_ARRAY_INDEX; the array gets an id of its "
        "own (GPUQ_ARRAY_ID), which cancel, hold, release, wait, ls, show and --after "
        "accept for all its tasks.",
    ),
    Option(
        ("--node",),
        "nodes",
        "multi",
        "HOST",
        "Run only on this server (its daemon.node_name, or a [[cluster.servers]] host); "
        "repeatable or comma-separated: any one of them.",
    ),
    Option(
        ("--exclude-node",),
        "exclude_nodes",
        "multi",
        "HOST",
        "Never run on this server (repeatable or comma-separated).",
    ),
    Option(
        ("--label",),
        "labels",
        "multi",
        "LABEL",
        "Run only on a server carrying this label (daemon.labels, or a server's labels); "
        "repeatable or comma-separated: every one of them.",
    ),
    Option(
        ("--gpu-type",),
        "gpu_types",
        "multi",
        "TYPE",
        "Run only on GPUs of this type (the TYPE column of gpuq gpus --json: A100, H100, "
        "RTX4090, L4...; any case); repeatable or comma-separated: any one of them.",
    ),
    Option(("--hold", "-H"), "hold", "flag", "", "Queue the job held; start it with gpuq release."),
    Option(("--begin", "-b"), "begin", "str", "TIME", "Not before TIME: now+10m, 14:00, ISO date."),
    Option(
        ("--time", "-t"),
        "time",
        "str",
        "LIMIT",
        "Time limit: 90s, 2h, 1-12:00:00. A bare number is minutes, as in Slurm "
        "(--time 10: 10 minutes).",
    ),
    Option(
        ("--retries", "-r"),
        "retries",
        "int",
        "N",
        "Run again up to N times if it fails.",
        (0, MAX_INT),
    ),
    Option(
        ("--requeue",),
        "requeue",
        "flag",
        "",
        "Run it again elsewhere if its server is lost (gpuq.runner jobs always are).",
    ),
    Option(("--cwd", "-C"), "cwd", "str", "DIR", "Working directory. Default: the current one."),
    Option(
        ("--env", "-E"),
        "env",
        "multi",
        "KEY=VALUE",
        "Set a variable in the job's environment (repeatable). The submitting shell's "
        "environment is captured and passed on.",
    ),
    Option(
        ("--output", "-o"),
        "output",
        "str",
        "PATTERN",
        "Write stdout (and stderr, unless --error) here; %j job id, %a array index, "
        "%A array id, %x name, %u user. Default: the daemon's log directory.",
    ),
    Option(("--error", "-e"), "error", "str", "PATTERN", "Write stderr here (same placeholders)."),
    Option(
        ("--signal",),
        "signal",
        "str",
        "SIG[@SECONDS]",
        "Send SIG this long before the time limit (default 60 s), e.g. USR1@120.",
    ),
    Option(
        ("--notify",),
        "notify",
        "str",
        "CMD",
        "Run this shell command when the job ends (GPUQ_JOB_ID, GPUQ_JOB_STATE, "
        "GPUQ_JOB_EXIT_CODE set).",
    ),
    Option(
        ("--wait", "-W"),
        "wait",
        "flag",
        "",
        "Wait for the job and exit with its exit code (which may equal one of gpuq's own "
        "codes; gpuq wait --exit-zero --json tells them apart).",
    ),
    Option(
        ("--parsable", "-q"),
        "parsable",
        "flag",
        "",
        "Print only the job id (an array's own id; --json lists its tasks).",
    ),
    Option(("--json",), "json", "flag", "", "Print the result as JSON."),
    Option(("--config",), "config", "str", "FILE", "Configuration file.", envvar="GPUQ_CONFIG"),
)

_BY_FLAG = {flag: opt for opt in SUBMIT_OPTIONS for flag in opt.flags}


class HelpRequested(Exception):
    """`--help` among the submit options: the full CLI prints the help."""


def parse_submit_args(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Split `gpuq submit` arguments into options and the command.

    The command starts after `--` or at the first argument that is not an
    option, so `gpuq submit train.sh --lr 3` passes `--lr 3` to the script.
    """
    values: dict[str, Any] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return values, args[i + 1 :]
        if not arg.startswith("-") or arg == "-":
            return values, args[i:]
        flag, eq, inline = arg.partition("=")
        if flag in ("--help", "-h"):
            raise HelpRequested
        opt = _BY_FLAG.get(flag)
        if opt is None:
            raise _unknown_option(flag)
        if opt.kind == "flag":
            if eq:
                raise UsageError(f"{flag} takes no value", f"write {flag} alone")
            values[opt.dest] = True
            i += 1
            continue
        if eq:
            value = inline
            i += 1
        else:
            if i + 1 >= len(args):
                raise UsageError(
                    f"{flag} needs a value ({opt.metavar})", f"write {flag} {opt.metavar}"
                )
            value = args[i + 1]
            i += 2
        if not value and opt.kind == "str" and opt.dest != "config":  # "--time $LIMIT", unset
            raise UsageError(
                f"{flag} was given an empty value", f"write {flag} {opt.metavar}, or leave it out"
            )
        if opt.kind == "int":
            values[opt.dest] = _int_value(opt, flag, value)
        elif opt.kind == "gpus":
            from gpuq.units import parse_gpus

            parse_gpus(value)  # checked here, so a #GPUQ line's error says where it is
            values[opt.dest] = value
        elif opt.kind == "multi":
            values.setdefault(opt.dest, []).append(value)
        else:
            values[opt.dest] = value
    return values, []


def _unknown_option(flag: str) -> UsageError:
    """The error for an option submit does not take, suggesting a known one it looks like.

    Typer commands say "did you mean"; submit's own parser says it too.
    Names are compared without their dashes, which every long option shares.
    """
    import difflib

    names = [known[2:] for known in (*_BY_FLAG, "--help") if known.startswith("--")]
    close = difflib.get_close_matches(flag.lstrip("-"), names, n=1) if flag.startswith("--") else []
    hint = f"did you mean --{close[0]}? (see gpuq submit --help)" if close else None
    return UsageError(f"unknown option {flag!r} for gpuq submit", hint or "see gpuq submit --help")


def _int_value(opt: Option, flag: str, value: str) -> int:
    """The integer an "int" option was given, within its bounds.

    Checked here, so an out-of-range value is refused by the option's name
    rather than by a field of the job spec the daemon checks later.
    """
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"{flag} needs an integer, got {value!r}", f"e.g. {flag} 2") from None
    if opt.bounds is not None and not opt.bounds[0] <= number <= opt.bounds[1]:
        low, high = opt.bounds
        raise UsageError(
            f"{flag} needs an integer from {low} to {high}, got {value!r}", f"e.g. {flag} 2"
        )
    return number


@dataclass(frozen=True, slots=True)
class Script:
    """A job script given as the command: its directives and how to run it."""

    name: str
    directives: list[tuple[int, list[str]]]
    command: list[str]


def script_command(command: list[str]) -> Script | None:
    """For a script file, its `#GPUQ` directives and how to run it; else None.

    The script runs by its absolute path, so the job runs the file whose
    directives were read, whatever its working directory (`--cwd`).
    """
    path = command[0]
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as handle:
            head = handle.read(64 * 1024)
    except OSError:
        return None
    if b"\0" in head:  # a binary: nothing to parse
        return None
    from gpuq.directives import directive_lines

    text = head.decode(errors="replace")
    if text.startswith("#!") and text.split("\n", 1)[0].endswith("\r"):
        raise UsageError(
            f"{path} has Windows line endings (CRLF): its #! line cannot be run",
            f"convert it first: dos2unix {shlex.quote(path)} (or sed -i 's/\\r$//' FILE)",
        )
    if not text.startswith("#!"):
        _check_runs_without_interpreter_line(path)
    try:
        directives = directive_lines(text)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc.message}", exc.hint) from None
    run = [os.path.abspath(path), *command[1:]]
    if not os.access(path, os.X_OK):
        first = text.splitlines()[0] if text else ""
        run = [*(shlex.split(first[2:]) if first.startswith("#!") else ["/bin/sh"]), *run]
    return Script(os.path.basename(path), directives, run)


def _check_runs_without_interpreter_line(path: str) -> None:
    """A script without `#!` runs under /bin/sh: refuse one that cannot.

    A Python file would fail on its first `import` ("import: not found"),
    and an executable text file, which a shell would run, the kernel
    refuses (ENOEXEC) when the job starts.
    """
    if path.endswith(".py"):
        raise UsageError(
            f"{path} is a Python script without a #! line: it would run under /bin/sh",
            f"submit it with its interpreter: gpuq submit [OPTIONS] -- python {shlex.quote(path)}"
            " (or make its first line #!/usr/bin/env python3)",
        )
    if os.access(path, os.X_OK):
        raise UsageError(
            f"{path} is executable but has no #! line, so the system cannot run it",
            "add an interpreter line, such as #!/bin/sh, at its top",
        )


def directive_values(path: str, directives: list[tuple[int, list[str]]]) -> dict[str, Any]:
    """The submit options of a script's `#GPUQ` lines; errors name the file and line."""
    values: dict[str, Any] = {}
    for number, tokens in directives:
        where = f"{path}: line {number}"
        try:
            found, extra = parse_submit_args(tokens)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc.message}", exc.hint) from None
        if extra:
            raise UsageError(
                f"{where}: #GPUQ directives take options only, got {extra[0]!r}",
                "write options such as #GPUQ --gpus 2; the command comes from the gpuq submit line",
            )
        for dest, value in found.items():
            values[dest] = [*values.get(dest, []), *value] if isinstance(value, list) else value
    return values


def build_spec(
    values: dict[str, Any], command: list[str], defaults: Any, now: float
) -> tuple[dict[str, Any], list[int]]:
    """The wire spec and array indices for parsed options (no I/O but env)."""
    from gpuq import units

    if not command:
        raise UsageError("no command given", "gpuq submit [options] -- CMD ARGS...")
    cwd = os.path.abspath(values.get("cwd") or os.getcwd())
    env = dict(os.environ)
    for item in values.get("env", []):
        key, eq, val = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--env needs KEY=VALUE, got {item!r}", "e.g. --env SEED=1")
        env[key] = val
    # The daemon validates each ID[:kind] and each name; here lists are only split.
    after = [part.strip() for item in values.get("after", []) for part in item.split(",")]
    placement = {
        dest: [part.strip() for item in values.get(dest, []) for part in item.split(",")]
        for dest in ("nodes", "exclude_nodes", "labels", "gpu_types")
    }
    gpu_mem_text = values.get("gpu_mem")
    gpu_mem = None
    auto = gpu_mem_text == "auto"
    if gpu_mem_text and not auto:
        gpu_mem = _gpu_mem(gpu_mem_text)
    indices: list[int] = []
    parallel = None
    if values.get("array"):
        parsed, parallel = units.parse_array(values["array"])
        indices = list(parsed)
    signal_spec = None
    if values.get("signal"):
        signal_spec = list(units.parse_signal_spec(values["signal"]))
    time_limit = units.parse_duration(values["time"]) if values.get("time") else defaults.time_limit
    gpus, gpus_max = defaults.gpus, None
    if values.get("gpus") is not None:
        gpus, gpus_max = units.parse_gpus(str(values["gpus"]))
    spec: dict[str, Any] = {
        "command": command,
        "cwd": cwd,
        "env": env,
        "name": values.get("name") or os.path.basename(command[0]),
        "gpus": gpus,
        "gpus_max": gpus_max,
        "gpu_mem": gpu_mem,
        "gpu_mem_auto": auto,
        "exclusive": bool(values.get("exclusive")),
        "priority": values.get("priority", defaults.priority),
        "after": after,
        "hold": bool(values.get("hold")),
        "begin": units.parse_begin(values["begin"], now) if values.get("begin") else None,
        "time_limit": time_limit,
        "retries": values.get("retries", defaults.retries),
        "requeue": bool(values.get("requeue")),
        "output": values.get("output") or "",
        "error": values.get("error"),
        "signal": signal_spec,
        "notify": values.get("notify"),
        "array_parallel": parallel,
    }
    if values.get("node_count") is not None:
        spec["node_count"] = values["node_count"]
        if values.get("gpus") is None:  # the default count on each server
            spec["gpus"] = gpus * values["node_count"]
    spec.update((dest, names) for dest, names in placement.items() if names)
    _check_request_size(spec, indices)
    return spec, indices


def _gpu_mem(text: str) -> int:
    """Bytes of a `--gpu-mem SIZE`, refused by the option's name when too large to send."""
    from gpuq import units

    size = units.parse_size(text)
    if size > MAX_INT:
        raise UsageError(
            f"--gpu-mem needs a size under {units.format_size(MAX_INT + 1)}, got {text!r}",
            "give a size such as --gpu-mem 6G, or auto",
        )
    return size


def _check_request_size(spec: dict[str, Any], indices: list[int]) -> None:
    """Refuse a submission the daemon would refuse as too large, saying what makes it so.

    The daemon reads at most `MAX_REQUEST_BYTES` per request, and the job's
    captured environment is most of one: a shell with a huge variable would
    otherwise get "request too large" without knowing why.
    """
    import json

    from gpuq.wire import MAX_REQUEST_BYTES

    size = len(json.dumps({"spec": spec, "array": indices}).encode())
    if size <= MAX_REQUEST_BYTES - 4096:  # room for the envelope and the token
        return
    env: dict[str, str] = spec["env"]
    env_size = sum(len(key.encode()) + len(value.encode()) for key, value in env.items())
    message = (
        f"the job is too large to submit: {size} bytes, over the daemon's limit of "
        f"{MAX_REQUEST_BYTES}; its environment is {env_size} bytes"
    )
    largest = sorted(env, key=lambda key: len(env[key]), reverse=True)[:3]
    if env_size * 2 < size or not largest:
        raise UsageError(message, "shorten the command line (pass long data in a file)")
    sizes = ", ".join(f"{key} ({len(env[key].encode())} bytes)" for key in largest)
    raise UsageError(
        message,
        f"its largest variables are {sizes}: unset one for the submission, "
        f"e.g. env -u {largest[0]} gpuq submit ...",
    )


def _report(config: Any, values: dict[str, Any], ids: list[int], array_id: int | None) -> int:
    """Print what was submitted; with --wait, wait for it. The exit code.

    The jobs are queued already: if their ids cannot be written (stdout on a
    full disk), the error names them, on stderr.
    """
    try:
        if values.get("json"):
            import json

            print(json.dumps({"schema_version": 1, "ids": ids, "array_id": array_id}))
        elif values.get("parsable"):  # an array's own id, as Slurm's: wait, cancel, --after take it
            print(ids[0] if array_id is None else array_id)
        elif array_id is None:
            print(f"Submitted job {ids[0]}")
        else:
            tasks = "1 task" if len(ids) == 1 else f"{len(ids)} tasks"
            print(f"Submitted array job {array_id} ({tasks}: {task_ranges(ids)})")
        sys.stdout.flush()
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        which = f"job {ids[0]}" if array_id is None else f"array job {array_id}"
        raise GpuqError(
            f"{which} was queued, but its id could not be written: {exc.strerror}",
            "gpuq ls shows it; free space where stdout goes, or send it elsewhere",
        ) from None
    if values.get("wait"):
        return wait_for_jobs(config, ids)
    return 0


def run_submit(argv: Sequence[str]) -> int:
    """`gpuq submit ARGS`: returns the process exit code."""
    json_mode = asks_json(list(argv))
    try:
        values, command = parse_submit_args(argv)
        script = script_command(command) if command else None
        if script is not None:
            from_script = directive_values(command[0], script.directives)
            values = {"name": script.name, **from_script, **values}
            command = script.command
        from gpuq.config import load_config

        config = load_config(values.get("config"))
        spec, indices = build_spec(values, command, config.defaults, time.time())
        ids, array_id = submit_with_retry(config, spec, indices)
        try:
            return _report(config, values, ids, array_id)
        except KeyboardInterrupt:  # only --wait takes long enough to be interrupted
            one = ids[0] if array_id is None else array_id
            which = f"job {one}" if array_id is None else f"array {one}"
            print(
                f"gpuq: stopped waiting; {which} is not cancelled "
                f"(gpuq wait {one} waits again, gpuq cancel {one} stops it)",
                file=sys.stderr,
            )
            return 130
    except HelpRequested:
        from gpuq.cli.app import run_app

        return run_app(["submit", "--help"])
    except GpuqError as exc:
        from gpuq.cli.errors import render_error

        return render_error(exc, json_mode)


def task_ranges(ids: list[int]) -> str:
    """`33-35` for consecutive ids, `33-35,40` otherwise."""
    parts: list[str] = []
    start = previous = ids[0]
    for job_id in [*ids[1:], None]:
        if job_id is not None and job_id == previous + 1:
            previous = job_id
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if job_id is not None:
            start = previous = job_id
    return ",".join(parts)


def submit_with_retry(
    config: Any, spec: dict[str, Any], indices: list[int]
) -> tuple[list[int], int | None]:
    """Submit with an idempotency token, retrying once if the daemon vanished.

    Returns the job ids and, for an array, the array's own id.
    """
    from gpuq.cli.link import connected
    from gpuq.errors import DaemonUnavailable

    token = os.urandom(16).hex()
    for attempt in (1, 2):
        try:
            with connected(config, notice=attempt == 1) as client:
                result = client.call("submit", spec=spec, array=indices, token=token)
            array_id = result.get("array_id")
            return [int(i) for i in result["ids"]], None if array_id is None else int(array_id)
        except DaemonUnavailable:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def wait_for_jobs(config: Any, ids: list[int]) -> int:
    """Block until the jobs end; the largest exit code (1 if one failed without one)."""
    from gpuq.cli.errors import said_lost
    from gpuq.client import wait_jobs

    return wait_exit_code(wait_jobs(config, ids, on_lost=said_lost))


def wait_exit_code(jobs: list[dict[str, Any]]) -> int:
    """0 if every ended job succeeded, else the largest exit code (1 if one has none)."""
    ended = [j for j in jobs if j["state"] in ("succeeded", "failed", "cancelled", "lost")]
    return max((j["exit_code"] or 1 for j in ended if j["state"] != "succeeded"), default=0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_submit(sys.argv[1:]))
