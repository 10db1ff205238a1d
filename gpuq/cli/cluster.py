"""`gpuq cluster`: the lab's other servers, listed and checked over ssh, and added to the config."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from gpuq.cli.common import ConfigOpt, JsonOpt, print_json, run
from gpuq.config import ServerDecl, load_config, server_decl
from gpuq.errors import ExitCode, GpuqError, NotFoundError, UsageError
from gpuq.paths import default_config_path

cluster_app = typer.Typer(
    help="The lab's other servers: list and check them over ssh, add and remove them.",
    no_args_is_help=True,
)


@cluster_app.command("add")
def add(
    host: Annotated[
        str,
        typer.Argument(
            metavar="HOST", help="The server: a host name or an alias of your ssh config."
        ),
    ],
    label: Annotated[
        list[str] | None,
        typer.Option("--label", metavar="LABEL", help="A label for placement (repeatable)."),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            metavar="GPUS",
            help="Only these GPUs of it: indices or UUIDs, comma-separated.",
        ),
    ] = None,
    command: Annotated[
        str,
        typer.Option(
            "--command",
            metavar="PATH",
            help="The gpuq command on that server, where not on ssh's PATH.",
        ),
    ] = "gpuq",
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Check a server over ssh, then add it to the config file's [[cluster.servers]].

    The check runs `ssh HOST gpuq bridge` in BatchMode (never a password
    prompt; an unknown host key fails): the server's daemon must answer, and
    run the same protocol. Nothing is written unless it does. Exit 4 if the
    server is already listed, 5 if it cannot be reached.
    """

    def body() -> None:
        from gpuq.cluster.edit import already_listed, append_server
        from gpuq.cluster.probe import check

        cfg = load_config(config)
        server = _declared(host, label or [], gpus, command)
        path = cfg.source or default_config_path()
        if any(s.host == server.host for s in cfg.cluster.servers):
            raise already_listed(server.host, path)
        if not json_out:  # under --json, stderr holds only the error object, if any
            print(f"checking {server.host} over ssh ...", file=sys.stderr)
        result = check(server, cfg)
        append_server(path, server)
        if json_out:
            print_json({"added": result.to_dict(), "config": str(path)})
        else:
            print(
                f"added {server.host} to {path}: node {result.node}, gpuq "
                f"{result.daemon_version}, {_gpus_text(result.gpus)} ({result.seconds:.2f} s)"
            )
        if result.version_note:
            print(f"warning: {result.version_note}", file=sys.stderr)

    run(json_out, body)


@cluster_app.command("remove")
def remove(
    host: Annotated[
        str, typer.Argument(metavar="HOST", help="The server's host, as in the config.")
    ],
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Remove a server's [[cluster.servers]] table from the config file (exit 3 if not there).

    Only that table's lines go; the rest of the file stays as written.
    """

    def body() -> None:
        from gpuq.cluster.edit import remove_server

        cfg = load_config(config)
        path = cfg.source or default_config_path()
        if not path.exists():
            raise NotFoundError(f"{host} is not a server: there is no config file {path}")
        remove_server(path, host)
        if json_out:
            print_json({"removed": host, "config": str(path)})
        else:
            print(f"removed {host} from {path}", file=sys.stderr)

    run(json_out, body)


@cluster_app.command("ls")
def list_servers(json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
    """List the config's servers, each checked over ssh now (exit 5 if any is unreachable)."""

    def body() -> int:
        from gpuq.cluster.probe import check

        cfg = load_config(config)
        rows: list[dict[str, Any]] = []
        for server in cfg.cluster.servers:
            try:
                rows.append({"host": server.host, "up": True, **check(server, cfg).to_dict()})
            except GpuqError as exc:
                rows.append(
                    {"host": server.host, "up": False, "error": exc.message, "hint": exc.hint}
                )
        if json_out:
            print_json({"servers": rows})
        elif not rows:
            print("no servers in the config: add one with gpuq cluster add HOST", file=sys.stderr)
        else:
            width = max(len(row["host"]) for row in rows)
            print(f"{'HOST':<{width}}  STATE  NODE / REASON")
            for row in rows:
                if row["up"]:
                    detail = (
                        f"{row['node']}, gpuq {row['daemon_version']}, {_gpus_text(row['gpus'])}"
                    )
                    print(f"{row['host']:<{width}}  up     {detail}")
                else:
                    print(f"{row['host']:<{width}}  down   {row['error']}")
        return ExitCode.UNAVAILABLE if any(not row["up"] for row in rows) else 0

    run(json_out, body)


def _declared(host: str, labels: list[str], gpus: str | None, command: str) -> ServerDecl:
    """The server as the command line gives it, checked by the config file's own rules."""
    table: dict[str, Any] = {"host": host, "command": command}
    if labels:
        table["labels"] = labels
    if gpus:
        table["gpus"] = [g.strip() for g in gpus.split(",") if g.strip()]
    try:
        return server_decl(table)
    except UsageError as exc:
        names = {"server.host": "HOST", "server.labels": "--label", "server.gpus": "--gpus"}
        names["server.command"] = "--command"
        message, hint = exc.message, exc.hint or ""
        for key, option in names.items():
            message, hint = message.replace(key, option), hint.replace(key, option)
        raise UsageError(message, hint) from None


def _gpus_text(names: tuple[str, ...] | list[str]) -> str:
    if not names:
        return "no GPUs"
    kinds = sorted(set(names))
    return f"{len(names)} GPU{'s' if len(names) != 1 else ''} ({', '.join(kinds)})"
