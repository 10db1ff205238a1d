"""`python -m gpuq.daemon [--config FILE]`: run gpuqd in the foreground."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from gpuq.config import load_config
from gpuq.daemon.server import serve
from gpuq.errors import GpuqError

GIL_SWITCH_SECONDS = 0.001
"""How long a thread keeps the interpreter while another waits for it (Python's default: 5 ms).

A policy deciding in a worker thread holds the interpreter between its
switches, and the event loop waits that long each time it wakes from I/O;
at 1 ms a long Pollux decision over a 1,000-job queue costs the loop's
99th-percentile lag half as much (bench/bench_live_lag.py).
"""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
"""The daemon's --log-level values, in any case."""


def main(argv: list[str] | None = None) -> int:
    """Run the daemon until stopped; errors are printed with their hint."""
    parser = argparse.ArgumentParser(prog="gpuqd", description="The gpuq daemon.")
    parser.add_argument("--config", help="configuration file (default: GPUQ_CONFIG or XDG path)")
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="the log's detail"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s gpuqd[%(process)d] %(levelname)s %(message)s",
    )
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    try:
        asyncio.run(serve(load_config(args.config)))
    except GpuqError as exc:
        print(f"gpuqd: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        # The command that started the daemon reads these lines from its log
        # (gpuq.client._start_failure): the code keeps the error's kind.
        print(f"gpuqd: error code: {exc.code}", file=sys.stderr)
        return int(exc.exit_code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
