"""Render a GpuqError at the CLI edge: stderr, a hint, and the exit code."""

from __future__ import annotations

import json
import sys

from gpuq.errors import GpuqError


def render_error(error: GpuqError, json_mode: bool = False) -> int:
    """Print `error` to stderr (as JSON with --json); returns its exit code."""
    if json_mode:
        payload = {"error": {**error.to_wire(), "exit_code": int(error.exit_code)}}
        print(json.dumps(payload), file=sys.stderr)
    else:
        print(f"gpuq: error: {error.message}", file=sys.stderr)
        if error.hint:
            print(f"hint: {error.hint}", file=sys.stderr)
    return int(error.exit_code)
