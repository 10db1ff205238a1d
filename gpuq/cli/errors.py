"""Render a GpuqError at the CLI edge: stderr, a hint, and the exit code.

Messages often quote user input (a job name, a path), so the human form
shows them through `gpuq.textsafe.visible`; the JSON form keeps them exact.
"""

from __future__ import annotations

import json
import sys

from gpuq.errors import GpuqError
from gpuq.textsafe import visible


def render_error(error: GpuqError, json_mode: bool = False) -> int:
    """Print `error` to stderr (as JSON with --json); returns its exit code."""
    if json_mode:
        payload = {"error": {**error.to_wire(), "exit_code": int(error.exit_code)}}
        print(json.dumps(payload), file=sys.stderr)
    else:
        print(f"gpuq: error: {visible(error.message)}", file=sys.stderr)
        if error.hint:
            print(f"hint: {visible(error.hint)}", file=sys.stderr)
    return int(error.exit_code)


def asks_json(args: list[str]) -> bool:
    """True if `--json` is among the options of `args`, before any `--` that starts a command."""
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def said_lost(lost: GpuqError) -> None:
    """Say on stderr that the daemon dropped a wait or a followed log, which goes on."""
    print(
        f"gpuq: {lost.message}; waiting for it to come back (a restart?), then going on",
        file=sys.stderr,
    )
