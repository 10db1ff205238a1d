"""The gpuq command tree (typer): parse, call the daemon, render.

Every read command has `--json` (a versioned schema, docs/json-schema.md);
errors go to stderr, as JSON with `--json`, with the exit codes of
`gpuq.errors.ExitCode`. `submit` is declared in `gpuq.cli.submit` and added
here as a click command built from the same option table.
"""

from __future__ import annotations

import inspect
import re
import sys
import time
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from typer._click import exceptions as click_exceptions

from gpuq.cli import cluster, lab, migrate, render, replay, sim
from gpuq.cli.common import ConfigOpt, JsonOpt
from gpuq.cli.common import print_json as _print_json
from gpuq.cli.common import run as _run
from gpuq.cli.errors import asks_json, render_error, said_lost
from gpuq.cli.link import connected, opened
from gpuq.cli.submit import SUBMIT_OPTIONS, run_submit, wait_exit_code
from gpuq.config import Config, load_config
from gpuq.errors import ExitCode, NotFoundError, UsageError
from gpuq.textsafe import visible

app = typer.Typer(
    name="gpuq",
    help="Queue, pack and run GPU jobs on your lab's servers.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
daemon_app = typer.Typer(help="Start, stop and inspect the gpuq daemon.", no_args_is_help=True)
app.add_typer(daemon_app, name="daemon")
app.add_typer(cluster.cluster_app, name="cluster")
app.command("migrate")(migrate.migrate)
app.add_typer(lab.lab_app, name="lab")
app.command("audit")(lab.audit)
app.command("share")(lab.share)


def _print_version(value: bool) -> None:
    if value:
        from gpuq import __version__
        from gpuq.wire import PROTOCOL_VERSION

        print(f"gpuq {__version__} (protocol {PROTOCOL_VERSION})")
        raise typer.Exit(0)


@app.callback()
def main_options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            callback=_print_version,
            is_eager=True,
            help="Print gpuq's version and protocol version, and exit.",
        ),
    ] = False,
) -> None:
    """Queue, pack and run GPU jobs on your lab's servers.

    Exit codes: 0 ok, 1 failure, 2 usage, 3 no such job, 4 wrong state,
    5 daemon unreachable or impossible resources, 6 protocol, 7 state
    directory, 8 timeout (see man gpuq). `gpuq wait` and `submit --wait`
    exit with the job's own code; `gpuq wait --exit-zero --json` keeps the
    jobs' codes out of the exit status, for scripts.
    """


IdsArg = Annotated[
    list[int],
    typer.Argument(
        metavar="ID", help="Job ids; an array's id stands for all its tasks.", show_default=False
    ),
]

T = TypeVar("T")


def _client(config: str | Config | None, autostart: bool = True) -> Any:
    """A connected client for the config at path `config` (or already read): `connected`."""
    loaded = config if isinstance(config, Config) else load_config(config)
    return connected(loaded, autostart=autostart)


def _print_warnings(result: dict[str, Any]) -> None:
    """The daemon's own problems (a full disk, a deleted state directory), on stderr."""
    from gpuq.textsafe import visible

    for warning in result.get("warnings") or ():
        print(f"gpuq: warning: {visible(warning)}", file=sys.stderr)


@app.command("ls")
def list_jobs(
    ids: Annotated[
        list[int] | None,
        typer.Argument(
            metavar="ID",
            help="Only these jobs; an array's id lists all its tasks.",
            show_default=False,
        ),
    ] = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state", "-s", metavar="STATE", help="Only jobs in this state (repeatable)."
        ),
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", "-u", metavar="USER", help="Only this user's jobs.")
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", "-n", metavar="TEXT", help="Only jobs whose name contains this."),
    ] = None,
    all_jobs: Annotated[bool, typer.Option("--all", "-a", help="Include finished jobs.")] = False,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, metavar="N", help="Only the newest N jobs.")
    ] = None,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """List the queue: pending and running jobs (and finished ones with --all).

    TIME is how long a job has run, over all its attempts and without the
    time it spent suspended; for a job that never started, how long it has
    waited. With several servers ([[cluster.servers]] configured, or jobs
    listed that ran on more than one), a NODE column names the server each
    job runs or ran on, empty while it waits. Problems of the daemon itself
    (a full disk) are printed to stderr. An ID that is no job (never one, or
    removed by gpuq clean) is named on stderr after the others are listed,
    and the exit code is 3.
    """

    def body() -> None:
        with _client(config) as client:
            result = client.call(
                "list",
                ids=ids or [],
                states=state or [],
                user=user,
                name=name,
                include_done=all_jobs or bool(state) or bool(ids),
                limit=limit,
            )
        _print_warnings(result)
        unknown: list[int] = result.get("unknown") or []
        if json_out:
            _print_json(
                {"jobs": result["jobs"], "warnings": result.get("warnings", []), "unknown": unknown}
            )
        elif result["jobs"] or not unknown:
            print(render.jobs_table(result["jobs"], nodes=result.get("nodes") or ()))
        if unknown:
            raise NotFoundError(
                f"no job {', '.join(map(str, unknown))}",
                "gpuq ls --all lists every job there is (finished ones removed by gpuq clean "
                "are gone)",
            )

    _run(json_out, body)


@app.command()
def show(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="Job id, or an array's id.")],
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Show a job: spec, state, server and GPUs, run and wall time, each attempt, history.

    Given an array's id, show the array and all its tasks.
    """

    def body() -> None:
        with _client(config) as client:
            result = client.call("show", id=job_id)
        if json_out:
            _print_json(result)
        elif "array" in result:
            print(render.array_detail(result["array"], result["jobs"]))
        else:
            print(
                render.job_detail(
                    result["job"],
                    result["events"],
                    result.get("metrics"),
                    result["attempts"],
                    migrations=result.get("migrations") or (),
                    sizing=result.get("sizing"),
                )
            )

    _run(json_out, body)


@app.command()
def metrics(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="Job id.")],
    last: Annotated[
        int | None,
        typer.Option("--last", "-n", min=1, metavar="N", help="Only the newest N samples."),
    ] = None,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Print what a gpuq.runner job reported: step time, throughput, batch, memory, goodput.

    A sample arrives every few seconds while the job runs; older ones are
    thinned out, so a long job keeps a bounded history. Jobs that do not use
    gpuq.runner have none.
    """

    def body() -> None:
        with _client(config) as client:
            result = client.call("metrics", id=job_id, limit=last)
        if json_out:
            _print_json(result)
        else:
            print(render.metrics_table(result["samples"]))

    _run(json_out, body)


@app.command()
def logs(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="Job id.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job ends.")
    ] = False,
    tail: Annotated[
        int | None,
        typer.Option(
            "--tail", min=0, metavar="N", help="Start with the last N lines (0: only what follows)."
        ),
    ] = None,
    stderr: Annotated[bool, typer.Option("--stderr", help="Show standard error instead.")] = False,
    part: Annotated[
        int,
        typer.Option(
            "--part",
            metavar="N",
            min=0,
            help="For a multi-node job (--nodes N): the output of part N (its NODE_RANK), "
            "read on its server; 0, the first part, by default.",
        ),
    ] = 0,
    config: ConfigOpt = None,
) -> None:
    """Print a job's output (its stdout, or stderr with --stderr).

    For a held or queued job that has written nothing, a note on stderr says
    so (with --follow, that its output follows once it starts).
    """

    def body() -> None:
        from gpuq.client import ConnectionLost, reconnect

        stream = "stderr" if stderr else "stdout"
        options: dict[str, Any] = {"part": part} if part else {}
        loaded = load_config(config)
        client = opened(loaded)
        try:
            if follow:
                _note_not_started(job_id, _unstarted_state(client, job_id), follow=True)
            while True:
                try:
                    for kind, item in client.stream(
                        "logs", id=job_id, stream=stream, tail=tail, follow=follow, **options
                    ):
                        if kind == "event":
                            sys.stdout.write(item["data"])
                            sys.stdout.flush()
                            if "offset" in item:  # where to go on from if the daemon restarts
                                options["offset"] = item["offset"]
                        elif not follow and "offset" not in options:  # nothing was written
                            _note_not_started(job_id, str(item.get("state", "")), follow=False)
                    return
                except ConnectionLost as lost:  # a followed log outlives a daemon restart
                    if not (follow and client.greeted):
                        raise
                    said_lost(lost)
                    client.close()
                    client = reconnect(loaded, lost)
        finally:
            client.close()

    _run(False, body)


_NOT_STARTED = {"held": "it has written nothing yet", "queued": "it has not started yet"}


def _unstarted_state(client: Any, job_id: int) -> str:
    """The job's state if it never started (it has no output to read yet), else ""."""
    listed = client.call("list", ids=[job_id], include_done=True)["jobs"]
    return str(listed[0]["state"]) if listed and not listed[0].get("stdout") else ""


def _note_not_started(job_id: int, state: str, *, follow: bool) -> None:
    """Say on stderr why a held or queued job's log is empty, so silence is not a mystery."""
    if (why := _NOT_STARTED.get(state)) is None:
        return
    then = "; its output follows once it starts" if follow else ""
    print(f"gpuq: job {job_id} is {state}: {why}{then}", file=sys.stderr)


def _action(
    method: str,
    ids: list[int],
    config: str | None,
    json_out: bool,
    *,
    wait: bool = False,
    **extra: Any,
) -> int:
    """Apply an action to jobs; with `wait`, also wait until they ended and show how."""
    from gpuq.client import wait_jobs

    loaded = load_config(config)
    with _client(loaded) as client:
        results = client.call(method, ids=ids, **extra)["results"]
    done: dict[int, dict[str, Any]] = {}
    acted = [r["id"] for r in results if r["ok"]]
    if wait and acted:
        done = {j["id"]: j for j in wait_jobs(loaded, acted, on_lost=said_lost)}
    for item in results:
        if item["id"] in done:  # ended: "cancel requested" is over
            item.update(state=done[item["id"]]["state"], message="")
    if json_out:
        _print_json({"results": results})
    else:
        for ok, line in outcome_lines(results):
            print(line if ok else f"gpuq: {line}", file=sys.stdout if ok else sys.stderr)
    failed = [r for r in results if not r["ok"]]
    if not failed:
        return 0
    codes = {r.get("code") for r in failed}
    if codes == {"not_found"}:
        return int(ExitCode.NOT_FOUND)
    if codes == {"permission"}:
        return int(ExitCode.PERMISSION)
    return int(ExitCode.CONFLICT)


GROUPED_RUN = 10
"""Consecutive ids with the same outcome, at least this many, are shown as one range."""


def outcome_lines(results: list[dict[str, Any]]) -> list[tuple[bool, str]]:
    """What an action did, a line per job or per run of ids alike: (applied, line).

    Cancelling a 2,000-task array prints "jobs 18-2017: cancel requested",
    not 2,000 lines; a job whose outcome differs from its neighbours' keeps
    a line of its own, worded as always.
    """

    def single(item: dict[str, Any]) -> str:
        if item["ok"]:
            return f"job {item['id']}: {visible(item.get('message') or item['state'])}"
        message = visible(item["message"])
        named = re.search(rf"\b(job|array) {item['id']}\b", message)  # "array 5 has no task ..."
        return message if named else f"job {item['id']}: {message}"

    def common(item: dict[str, Any]) -> str:
        """The outcome without the job's own id in it."""
        if item["ok"]:
            return visible(item.get("message") or item["state"])
        message = visible(item["message"])
        own = f"job {item['id']}"
        if message.startswith(own + " "):
            return message.removeprefix(own + " ")
        return message.replace(f" {own}", "")

    lines: list[tuple[bool, str]] = []
    run: list[dict[str, Any]] = []

    def flush() -> None:
        if len(run) >= GROUPED_RUN:
            lines.append((run[0]["ok"], f"jobs {run[0]['id']}-{run[-1]['id']}: {common(run[0])}"))
        else:
            lines.extend((item["ok"], single(item)) for item in run)
        run.clear()

    for item in results:
        if run and (
            item["id"] != run[-1]["id"] + 1
            or (item["ok"], common(item)) != (run[-1]["ok"], common(run[-1]))
        ):
            flush()
        run.append(item)
    flush()
    return lines


def _register_action(method: str, help_text: str) -> None:
    def command(ids: IdsArg, json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
        _run(json_out, lambda: _action(method, ids, config, json_out))

    command.__doc__ = help_text
    app.command(method)(command)


@app.command()
def cancel(
    ids: IdsArg,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Wait until the jobs have ended; show how.")
    ] = False,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Cancel jobs (or whole arrays, by the array's id).

    A pending job is cancelled at once; a running one gets SIGTERM, then
    SIGKILL after the kill grace: it prints `cancel requested`, and with
    --wait the state it ended in.
    """
    _run(json_out, lambda: _action("cancel", ids, config, json_out, wait=wait))


for _method, _help in (
    ("hold", "Keep queued jobs from starting until released."),
    ("release", "Let held jobs start."),
    ("retry", "Queue failed, cancelled or lost jobs again, under their own ids."),
    ("resume", "Continue suspended jobs (a job suspended to a checkpoint is queued again)."),
):
    _register_action(_method, _help)


@app.command()
def suspend(
    ids: IdsArg,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            "-m",
            metavar="MODE",
            help="auto (checkpoint for gpuq.runner jobs, else stop), checkpoint "
            "(save and exit: GPUs freed), park (state to host memory: GPUs kept) "
            "or stop (SIGSTOP: GPU memory kept).",
        ),
    ] = "auto",
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Suspend running jobs: to a checkpoint, parked, or stopped (see --mode)."""
    _run(json_out, lambda: _action("suspend", ids, config, json_out, mode=mode))


@app.command(context_settings={"ignore_unknown_options": True})  # -3 is a value, not an option
def priority(
    value: Annotated[
        int,
        typer.Argument(
            metavar="PRIORITY", help="New priority (higher runs first; negative lowers it)."
        ),
    ],
    ids: IdsArg,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Change the priority of pending jobs.

    On a lab daemon a user may give at most [lab] max_priority (0 unless the
    config says otherwise), so lowering is what users do; admins give any.
    """
    _run(json_out, lambda: _action("priority", ids, config, json_out, priority=value))


@app.command()
def wait(
    ids: IdsArg,
    any_job: Annotated[bool, typer.Option("--any", help="Return when any one job ends.")] = False,
    timeout: Annotated[
        str | None,
        typer.Option(
            "--timeout", metavar="DURATION", help="Give up after this long (exit 8): 30s, 10m, 2h."
        ),
    ] = None,
    exit_zero: Annotated[
        bool,
        typer.Option(
            "--exit-zero",
            help="Exit 0 once the jobs ended, whatever their outcome (read it from --json), "
            "so that any other code is gpuq's own.",
        ),
    ] = False,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Wait for jobs (or whole arrays) to end.

    Exits 0 if all succeeded, else with the largest exit code of the jobs
    (1 for a job that ended without one). A job's own code may equal one of
    gpuq's (3 no such job, 5 daemon unreachable, 8 timeout); scripts that
    must tell them apart use --exit-zero with --json, which lists each
    job's state and exit code.
    """

    def body() -> int:
        from gpuq.client import wait_jobs
        from gpuq.units import parse_duration

        seconds = None if timeout is None else parse_duration(timeout, bare_minutes=False)
        loaded = load_config(config)
        jobs = wait_jobs(
            loaded,
            ids,
            any_job=any_job,
            timeout=seconds,
            on_lost=said_lost,
            client=opened(loaded),
        )
        if json_out:
            _print_json({"jobs": jobs})
        else:
            print(render.jobs_table(jobs))
        return 0 if exit_zero else wait_exit_code(jobs)

    _run(json_out, body)


@app.command()
def gpus(json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Show every GPU: memory used by gpuq jobs / other processes / free, and its jobs.

    With several servers, GPUs are grouped by server and named NODE:INDEX
    (each server has a GPU 0); below the table, each server that is down
    (since when, and why), not yet checked, or without GPUs.
    """

    def body() -> None:
        with _client(config) as client:
            result = client.call("gpus")
        if json_out:
            _print_json(result)
        else:
            print(render.gpus_text(result))

    _run(json_out, body)


@app.command()
def top(
    interval: Annotated[
        float,
        typer.Option("--interval", "-i", metavar="SECONDS", help="Seconds between GPU samples."),
    ] = 1.0,
    compact: Annotated[
        bool, typer.Option("--compact", help="One line per GPU, for servers with many GPUs.")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Watch and steer jobs and GPUs live in a terminal UI (q quits, ? lists the keys)."""

    def body() -> None:
        from gpuq.tui.main import run_top

        run_top(load_config(config), interval=interval, compact=compact)

    _run(False, body)


@app.command()
def clean(
    older_than: Annotated[
        str,
        typer.Option(
            "--older-than", metavar="DURATION", help="Only jobs that ended this long ago (7d, 12h)."
        ),
    ] = "0s",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what would go; delete nothing.")
    ] = False,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Delete finished jobs, their state and the logs gpuq kept for them.

    A finished job still in use is kept: one a queued job depends on
    (--after), one a gpuq wait is waiting on, a task of an array that has
    not ended. Logs named with --output or --error are the user's and are
    never deleted.
    """

    def body() -> None:
        from gpuq.units import format_size, parse_duration

        seconds = (
            0.0 if older_than in ("0", "0s") else parse_duration(older_than, bare_minutes=False)
        )
        with _client(config) as client:
            result = client.call("clean", older_than=seconds, dry_run=dry_run)
        if json_out:
            _print_json(result)
            return
        verb = "Would remove" if dry_run else "Removed"
        size = result["bytes"]
        print(
            f"{verb} {len(result['ids'])} job(s) and {len(result['files'])} log file(s) "
            f"({format_size(size) if size >= 1024 else f'{size} bytes'})."
        )
        if kept := result.get("kept"):
            print(
                f"Kept {len(kept)} still in use (a queued job's --after, a gpuq wait's, "
                f"or a task of an array that runs on): {', '.join(map(str, kept))}."
            )

    _run(json_out, body)


@daemon_app.command("start")
def daemon_start(config: ConfigOpt = None) -> None:
    """Start the daemon in the background (the first gpuq command does this too)."""

    def body() -> None:
        from gpuq.client import running_daemon_pid, start_daemon

        cfg = load_config(config)
        pid = running_daemon_pid(cfg)
        if pid is not None:
            print(f"gpuq daemon already running (pid {pid})", file=sys.stderr)
            return
        print(f"gpuq daemon started (pid {start_daemon(cfg)})", file=sys.stderr)

    _run(False, body)


@daemon_app.command("stop")
def daemon_stop(config: ConfigOpt = None) -> None:
    """Stop the daemon. Running jobs keep running and are re-adopted on restart."""

    def body() -> None:
        _stop(load_config(config))

    _run(False, body)


def _stop(cfg: Config, *, final: bool = True) -> None:
    """Stop the daemon; `final` (a stop, not a restart) tells clients waiting on it to stop too."""
    from gpuq.client import Client, socket_path
    from gpuq.errors import DaemonUnavailable, ProtocolError

    try:
        with Client.connect(cfg, autostart=False) as client:
            try:
                result = client.call("shutdown", final=True) if final else client.call("shutdown")
            except ProtocolError as exc:
                if "unknown parameter" not in exc.message:
                    raise
                result = client.call("shutdown")  # a daemon from before `final`
    except DaemonUnavailable:
        from gpuq import statelock

        if statelock.holder(cfg.daemon.state_dir) is not None:
            raise  # it runs, but cannot be reached (its socket removed): say so, not "not running"
        print("gpuq daemon is not running", file=sys.stderr)
        return
    deadline = time.monotonic() + 15
    while socket_path(cfg).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    print(
        f"gpuq daemon stopped ({result['jobs_left_running']} job(s) left running)", file=sys.stderr
    )


@daemon_app.command("restart")
def daemon_restart(config: ConfigOpt = None) -> None:
    """Stop the daemon and start it again; jobs are re-adopted."""

    def body() -> None:
        from gpuq.client import start_daemon

        cfg = load_config(config)
        _stop(cfg, final=False)
        print(f"gpuq daemon started (pid {start_daemon(cfg)})", file=sys.stderr)

    _run(False, body)


@daemon_app.command("reload")
def daemon_reload(json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Apply the config file without a restart (SIGHUP does the same).

    [scheduler], [logs], [client], [cluster], daemon.kill_grace and
    daemon.labels change at once ([defaults] needs no reload: each command
    reads it from the file); other [daemon] keys and [gpus] need gpuq daemon
    restart, and the command names them. An invalid file changes nothing
    (exit 2).
    """

    def body() -> None:
        with _client(config, autostart=False) as client:
            result = client.call("reload")
        if json_out:
            _print_json(result)
            return
        applied = ", ".join(result["applied"]) or (
            "nothing to apply now" if result["restart_needed"] else "nothing changed"
        )
        print(f"gpuq daemon reloaded {result['source'] or 'the built-in defaults'}: {applied}")
        if result["restart_needed"]:
            keys = ", ".join(result["restart_needed"])
            print(f"gpuq: {keys} take effect after gpuq daemon restart", file=sys.stderr)

    _run(json_out, body)


@daemon_app.command("run")
def daemon_run(
    config: ConfigOpt = None,
    log_level: Annotated[
        str, typer.Option("--log-level", metavar="LEVEL", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
) -> None:
    """Run the daemon in the foreground, logging to stderr (for systemd and containers)."""
    from gpuq.daemon.__main__ import LOG_LEVELS
    from gpuq.daemon.__main__ import main as daemon_main

    if log_level.upper() not in LOG_LEVELS:
        _run(False, lambda: _bad_log_level(log_level, LOG_LEVELS))
    args = ["--log-level", log_level] + (["--config", config] if config else [])
    raise typer.Exit(daemon_main(args))


def _bad_log_level(level: str, levels: tuple[str, ...]) -> None:
    raise UsageError(
        f"--log-level must be one of {', '.join(levels)} (in any case), got {level!r}",
        "e.g. gpuq daemon run --log-level debug",
    )


@daemon_app.command("status")
def daemon_status(json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Show whether the daemon runs: pid, paths, jobs, decision times, loop lag (exit 5 if down)."""

    def body() -> None:
        with _client(config, autostart=False) as client:
            status = client.call("status")
        if json_out:
            _print_json(status)
            return
        from gpuq.units import format_duration

        counts = ", ".join(f"{n} {s}" for s, n in sorted(status["jobs"].items())) or "no jobs"
        print(f"gpuq daemon running: pid {status['pid']}, up {format_duration(status['uptime'])}")
        print(f"  GPUs:      {status['gpus']} ({status['backend']})")
        print(f"  Policy:    {status['policy']}")
        for line in _responsiveness_lines(status):
            print(line)
        print(f"  Jobs:      {counts}")
        for line in _server_lines(status, format_duration):
            print(visible(line))
        print(visible(f"  State dir: {status['state_dir']}"))
        print(visible(f"  Socket:    {status['runtime_dir']}/gpuq.sock"))
        for warning in status.get("warnings") or []:
            print(visible(f"  Warning:   {warning}"))

    _run(json_out, body)


def _server_lines(status: dict[str, Any], format_duration: Callable[[float], str]) -> list[str]:
    """One line per server of [cluster]: up or down, since when, and why."""
    lines = []
    now = time.time()
    for server in status.get("servers") or []:
        since = format_duration(max(0.0, now - server["since"]))
        if server["state"] == "up":
            detail = f"up {since}: node {server['node']}, {server['gpus']} GPUs"
        elif server["state"] == "down":
            detail = f"down for {since}: {server['reason']}"
        else:
            detail = "not checked yet" + (f" ({server['reason']})" if server["reason"] else "")
        lines.append(f"  Server:    {server['host']} {detail}")
    return lines


def _responsiveness_lines(status: dict[str, Any]) -> list[str]:
    """Decision times per policy and the loop's worst lag, from a status reply."""

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.0095 else f"{seconds * 1000:.1f} ms"

    lines: list[str] = []
    for policy, times in (status.get("decisions") or {}).items():
        label = "Decisions:" if not lines else ""
        lines.append(
            f"  {label:<10} {policy}: last {ms(times['last'])}, median {ms(times['median'])}, "
            f"max {ms(times['max'])} ({times['count']} in all)"
        )
    lag = status.get("loop_lag")
    if lag and lag["wakeups"]:
        lines.append(
            f"  Loop lag:  max {ms(lag['max'])}, p99 {ms(lag['p99'])} "
            f"over the last {lag['window']:.0f} s"
        )
    return lines


@app.command()
def doctor(json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Check the set-up: config, state directory, socket, NVML, linger, ssh, and each server."""
    from gpuq.cli.doctor import print_checks, run_checks

    checks = run_checks(config)
    if json_out:
        _print_json({"checks": [c.to_dict() for c in checks]})
    else:
        print_checks(checks)
    raise typer.Exit(1 if any(c.status == "fail" for c in checks) else 0)


@app.command()
def bridge(config: ConfigOpt = None) -> None:
    """Relay stdin and stdout to this server's daemon, starting it if needed.

    What a head daemon on another server runs as `ssh HOST gpuq bridge`: the
    daemon's protocol passes through unchanged, so no port is opened. Ends
    when the daemon closes the connection or the other side goes away. A
    daemon that cannot be reached fails it as it fails any command (exit 5
    when none can be started).
    """

    def body() -> None:
        from gpuq.bridge import relay
        from gpuq.client import connect_socket

        cfg = load_config(config)
        relay(connect_socket(cfg, timeout=cfg.client.timeout), sys.stdin.fileno(), 1)

    _run(False, body)


app.command("sim")(sim.sim_command)
app.command("replay")(replay.replay_command)


def _register_submit() -> None:
    """Declare `gpuq submit` to typer from SUBMIT_OPTIONS.

    Typer gives it help, completion and man pages; running it goes through
    the fast parser on the raw arguments, so both read the options alike.
    """
    params = []
    annotations: dict[str, Any] = {}
    for opt in SUBMIT_OPTIONS:
        info = typer.Option(
            *opt.flags,
            help=opt.help,
            metavar=opt.metavar or None,
            show_default=False,
            envvar=opt.envvar,
            show_envvar=opt.envvar is not None,
        )
        kind: Any = {
            "flag": bool,
            "int": int | None,
            "str": str | None,
            "gpus": str | None,
            "multi": list[str] | None,
        }
        annotations[opt.dest] = Annotated[kind[opt.kind], info]
        default = False if opt.kind == "flag" else None
        params.append(
            inspect.Parameter(
                opt.dest,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=annotations[opt.dest],
            )
        )
    annotations["command"] = Annotated[
        list[str] | None,
        typer.Argument(help="The command and its arguments, or a script file.", show_default=False),
    ]
    params.append(
        inspect.Parameter(
            "command",
            inspect.Parameter.KEYWORD_ONLY,
            default=None,
            annotation=annotations["command"],
        )
    )

    def submit(**_: Any) -> None:
        raise typer.Exit(run_submit(_ARGS[1:]))

    submit.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    submit.__annotations__ = annotations
    submit.__doc__ = (
        "Queue a job and print its id.\n\n"
        "The command follows the options, after -- or as the first argument that is not an "
        "option; a script file may carry '#GPUQ --option' lines at its top. A script runs "
        "through its #! line, or under /bin/sh when it has none and is not executable (a "
        "Python file without one is refused: submit 'python train.py'). The first gpuq "
        "command starts the daemon if none runs."
    )
    app.command(
        "submit",
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    )(submit)


_register_submit()
_ARGS: list[str] = []


def run_app(args: list[str]) -> int:
    """Run the command tree on `args`; returns the exit code.

    A command line typer refuses (an unknown option, a missing argument, a
    value of the wrong type) is reported as every other gpuq error: "gpuq:
    error:" and a hint on stderr, or the JSON error object where the command
    takes --json and was given it, exit code 2.
    """
    _ARGS[:] = args
    try:
        code = app(args, prog_name="gpuq", standalone_mode=False)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except click_exceptions.NoArgsIsHelpError as exc:  # `gpuq`, `gpuq daemon`: their help
        print(exc.format_message(), file=sys.stderr)
        return int(ExitCode.USAGE)
    except click_exceptions.UsageError as exc:
        return _usage_error(exc, args)
    except typer.Abort:  # end of input at a prompt
        return 1
    return code if isinstance(code, int) else 0


def _usage_error(exc: click_exceptions.UsageError, args: list[str]) -> int:
    """Render a command line typer refused, as `render_error` renders gpuq's own errors."""
    message = _with_value(exc).rstrip(".")
    if message[1:2].islower():  # "No such option: ..." reads as the rest of gpuq's errors
        message = message[:1].lower() + message[1:]
    path, command = _command_of(args)
    takes_json = any("--json" in getattr(param, "opts", ()) for param in command.params)
    error = UsageError(message, f"see {' '.join(path)} --help")
    return render_error(error, json_mode=takes_json and asks_json(args))


def _with_value(exc: click_exceptions.UsageError) -> str:
    """A refused value's message, quoting the value: "invalid value for 'ID': got 'abc': ...".

    typer checks a value's type through pydantic, whose error (the cause)
    holds the input; its message alone ("Input should be a valid integer")
    does not say which of several values was wrong.
    """
    message = exc.format_message()
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if not isinstance(exc, click_exceptions.BadParameter) or not callable(errors):
        return message
    try:
        (first, *_) = errors()
        value, reason = first["input"], str(first["msg"])
    except (TypeError, ValueError, KeyError):
        return message
    if not isinstance(value, (str, int, float)) or exc.message not in message:
        return message
    reason = reason.split(", ")[0]  # "..., unable to parse string as an integer" says it twice
    return message.replace(exc.message, f"got {value!r}: {reason[:1].lower()}{reason[1:]}")


def _command_of(args: list[str]) -> tuple[list[str], Any]:
    """The command `args` name (its words from `gpuq` on, and its click command), as far as known.

    Found from the words themselves: the error of an option the parser could
    not read carries the context of the group above the command.
    """
    command: Any = typer.main.get_command(app)
    path = ["gpuq"]
    for word in args:
        commands = getattr(command, "commands", None)
        if word.startswith("-") or not commands or word not in commands:
            if commands and not word.startswith("-"):
                break  # an unknown command: the group's help is the one to see
            continue
        command = commands[word]
        path.append(word)
    return path, command
