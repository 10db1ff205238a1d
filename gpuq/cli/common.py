"""What the `gpuq` command modules share: --json and --config, running a body, JSON out."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuq.cli.errors import render_error
from gpuq.errors import GpuqError
from gpuq.models import JSON_SCHEMA_VERSION

if TYPE_CHECKING:
    from gpuq.client import Client
    from gpuq.config import Config

JsonOpt = Annotated[
    bool, typer.Option("--json", help="Print JSON (schema in docs/json-schema.md).")
]
ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        metavar="FILE",
        envvar="GPUQ_CONFIG",
        help="Configuration file.",
        show_envvar=True,
    ),
]


def run(json_mode: bool, body: Callable[[], int | None]) -> None:
    """Run a command body, turning a GpuqError into stderr text and an exit code."""
    try:
        code = body() or 0
    except GpuqError as exc:
        code = render_error(exc, json_mode)
    raise typer.Exit(code)


def note(client: Any) -> None:
    """Say on stderr which daemon a command talks to, where that is not obvious."""
    if client.notice:
        print(f"gpuq: {client.notice}", file=sys.stderr)


@contextlib.contextmanager
def connected(config: Config, *, autostart: bool = True) -> Iterator[Client]:
    """A client of `config`'s daemon, its notice said; a daemon on another file is warned of.

    The warning comes once the command has its answer (the hello's answer
    arrives with the first request's) or its error: a "no GPUs" that
    comes from a test config's daemon then says so.
    """
    from gpuq.client import Client

    client = Client.connect(config, autostart=autostart)
    note(client)
    try:
        yield client
    finally:
        client.close()
        if (other := client.other_config(config)) is not None:
            print(f"gpuq: warning: {other}", file=sys.stderr)


def print_json(data: dict[str, Any]) -> None:
    """A document of docs/json-schema.md: `schema_version` first, indented."""
    print(json.dumps({"schema_version": JSON_SCHEMA_VERSION, **data}, indent=2))
