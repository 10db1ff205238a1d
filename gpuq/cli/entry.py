"""The `gpuq` console script: fast paths for `submit` and `bridge`, typer for the rest.

`gpuq submit` is what people and scripts run most, so it never imports typer
(tens of milliseconds); `gpuq submit --help` goes through typer like every
other command, so help, completion and man pages come from one tree. `gpuq
bridge` starts for each ssh session another server opens (every command a
user types on a lab member), so it skips typer too.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable


def main(argv: list[str] | None = None) -> int:
    """Run the gpuq command line; returns the exit code.

    Output that cannot be written (stdout on a full disk, `> /dev/full`) is
    an error with a hint and exit status 1, not a traceback: flushed here, so
    that it cannot surface only as Python exits. So is a working directory
    deleted under the shell, which fails whatever needs it (a job's cwd, a
    relative path), with exit status 2.
    """
    args = sys.argv[1:] if argv is None else argv
    try:
        code = _dispatch(args)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader went away: as _as_typer_would, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except FileNotFoundError:
        if _working_dir_exists():
            raise
        from gpuq.cli.errors import asks_json, render_error
        from gpuq.errors import UsageError

        gone = UsageError(
            "the current directory no longer exists (it was deleted after this shell entered it)",
            "cd to a directory that exists; gpuq submit --cwd DIR names where a job runs",
        )
        return render_error(gone, json_mode=asks_json(args))
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRORS:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush
        from gpuq.cli.errors import asks_json, render_error
        from gpuq.errors import GpuqError

        error = GpuqError(
            f"cannot write the output: {exc.strerror}",
            "free space where stdout goes, or send it elsewhere",
        )
        return render_error(error, json_mode=asks_json(args))
    return code


def _working_dir_exists() -> bool:
    try:
        os.getcwd()
    except FileNotFoundError:
        return False
    return True


_OUTPUT_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG})
"""What writing stdout can fail with, beyond a closed pipe."""


def _dispatch(args: list[str]) -> int:
    if args and args[0] == "submit":
        from gpuq.cli.submit import run_submit

        return _as_typer_would(run_submit, args[1:])
    if args and args[0] == "bridge" and (code := run_bridge(args[1:])) is not None:
        return code
    from gpuq.cli.app import run_app

    return run_app(args)


def _as_typer_would(command: Callable[[list[str]], int], args: list[str]) -> int:
    """Run a fast-path command with the endings typer gives every other one.

    Ctrl-C (`gpuq submit --wait`) exits 130 without a traceback, and a reader
    that went away (`gpuq submit ... | head -c1`) exits 1 quietly.
    """
    try:
        return command(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # What is still buffered would fail again at exit: send it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def run_bridge(argv: list[str]) -> int | None:
    """`gpuq bridge [--config PATH]`: its exit code; None for anything else (`--help`)."""
    if not argv:
        path = None
    elif len(argv) == 2 and argv[0] == "--config":
        path = argv[1]
    elif len(argv) == 1 and argv[0].startswith("--config="):
        path = argv[0].partition("=")[2]
    else:
        return None
    from gpuq.bridge import relay
    from gpuq.client import connect_socket
    from gpuq.config import load_config
    from gpuq.errors import GpuqError

    try:
        config = load_config(path)
        relay(connect_socket(config, timeout=config.client.timeout), sys.stdin.fileno(), 1)
    except GpuqError as exc:
        from gpuq.cli.errors import render_error

        return render_error(exc, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
