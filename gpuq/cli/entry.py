"""The `gpuq` console script: a fast path for `submit`, typer for the rest.

`gpuq submit` is what people and scripts run most, so it never imports typer
(tens of milliseconds); `gpuq submit --help` goes through typer like every
other command, so help, completion and man pages come from one tree.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run the gpuq command line; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "submit":
        from gpuq.cli.submit import run_submit

        return run_submit(args[1:])
    from gpuq.cli.app import run_app

    return run_app(args)


if __name__ == "__main__":
    sys.exit(main())
