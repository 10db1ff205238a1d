"""What the `gpuq` command modules share: --json and --config, running a body, JSON out."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from gpuq.cli.errors import render_error
from gpuq.errors import GpuqError
from gpuq.models import JSON_SCHEMA_VERSION

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


def print_json(data: dict[str, Any]) -> None:
    """A document of docs/json-schema.md: `schema_version` first, indented."""
    print(json.dumps({"schema_version": JSON_SCHEMA_VERSION, **data}, indent=2))
