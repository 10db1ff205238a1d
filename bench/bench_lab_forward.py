"""A lab member's commands against the head's: `python -m bench.bench_lab_forward`.

Run as root: `python -m bench.bench_lab_forward [--count N]` (default 20).
It builds a lab of two servers in network namespaces
(tests/lab_cluster_harness.py): the head keeps the queue, gpu2 is a member
whose lab daemon forwards its users' requests to the head through `ssh head
gpuq bridge` as the service account. A real user runs the real CLI, one
command at a time, alternating between the two servers: `gpuq ls` and
`gpuq submit --hold` (held jobs: nothing runs, so only the request is
timed). It prints the median and p90 of each command's wall time on each
server, and the member's median over the head's: what forwarding costs a
user, the process start of `gpuq` included in both. There is no target;
the first command on the member (which opens the shared ssh connection) is
printed on its own row and left out of the figures.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path


def _timed(run: Callable[[], subprocess.CompletedProcess[str]]) -> float:
    """Wall seconds of one command; exits if it failed."""
    start = time.perf_counter()
    result = run()
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"command failed: {result.stderr}")
    return elapsed


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def main() -> None:
    """Parse the options, build the lab, time the commands, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20, help="commands of each kind per server")
    args = parser.parse_args()

    from bench.bench_remote_start import unavailable
    from tests.lab_cluster_harness import HEAD, MEMBER, lab_head_and_gpu2

    why = unavailable()
    if why is not None:
        raise SystemExit(f"cannot build the servers here: {why}")
    root = Path(tempfile.mkdtemp(prefix="gpuq-bench-lab-"))
    times: dict[tuple[str, str], list[float]] = {}
    try:
        with lab_head_and_gpu2(root) as lab:
            user = lab.alice
            commands = {
                "ls": ("ls", "--json"),
                "submit": ("submit", "-q", "--hold", "--", "true"),
            }
            first = _timed(lambda: lab.gpuq(MEMBER, user, *commands["ls"]))
            for _ in range(args.count):
                for kind, argv in commands.items():
                    for server in (HEAD, MEMBER):
                        elapsed = _timed(partial(lab.gpuq, server, user, *argv))
                        times.setdefault((kind, server), []).append(elapsed)
                print(".", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"first command on the member (opens the ssh connection): {first * 1000:.0f} ms")
    print(f"{'command':<10}{'server':<8}{'median ms':>10}{'p90 ms':>9}{'member/head':>13}")
    for kind in ("ls", "submit"):
        head_median = statistics.median(times[(kind, HEAD)])
        for server in (HEAD, MEMBER):
            values = times[(kind, server)]
            median = statistics.median(values)
            ratio = f"{median / head_median:.2f}" if server == MEMBER else ""
            print(
                f"{kind:<10}{server:<8}{median * 1000:>10.0f}{_p90(values) * 1000:>9.0f}{ratio:>13}"
            )


if __name__ == "__main__":
    main()
