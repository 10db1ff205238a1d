"""`gpuq submit` whole-process time against `python -c pass`, side by side.

Target: the median of `gpuq submit` is within 5x the median of `python -c
pass` (no heavy imports on the CLI path). Both are timed alternately in the
same run against a live daemon on fake GPUs; jobs are submitted held, so the
daemon stays idle. Run: `python -m bench.bench_submit [--runs N]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.daemon_harness import running_daemon

TARGET_RATIO = 5.0


def timed(command: list[str], env: dict[str, str]) -> float:
    """Wall time of one whole process, in seconds."""
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def gpuq_command() -> list[str]:
    """The installed console script if there is one, else the entry module."""
    script = Path(sys.executable).with_name("gpuq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gpuq.cli.entry"]


def main() -> None:
    """Print both medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gq-bench-"))
    try:
        with running_daemon(root) as daemon:
            env = daemon.env
            submit = [*gpuq_command(), "submit", "-q", "--hold", "--gpus", "0", "--", "true"]
            baseline = [sys.executable, "-c", "pass"]
            for _ in range(3):  # warm caches
                timed(submit, env), timed(baseline, env)
            submits, passes = [], []
            for _ in range(args.runs):
                submits.append(timed(submit, env))
                passes.append(timed(baseline, env))
            jobs = daemon.call("list", include_done=True)["jobs"]
            assert len(jobs) == args.runs + 3, "every submission arrived"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    s, p = statistics.median(submits), statistics.median(passes)
    print(f"gpuq submit:     median {s * 1000:.1f} ms over {args.runs} runs")
    print(f"python -c pass:  median {p * 1000:.1f} ms over {args.runs} runs")
    verdict = "OK" if s / p <= TARGET_RATIO else "OVER TARGET"
    print(f"ratio {s / p:.2f}x (target <= {TARGET_RATIO:.0f}x): {verdict}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus")


if __name__ == "__main__":
    main()
