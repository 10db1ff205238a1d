"""Job turnover against task-spooler, and `ls` latency while jobs drain.

Run: `python -m bench.bench_turnover [--jobs N] [--held M] [--tsp-slots S]`.

1. Turnover: N trivial CPU jobs (`--gpus 0 -- true`, default 500) through a
   real daemon on fake GPUs in a temporary directory, submitted the way a
   sweep script would: one request per job on one client connection, then
   (on a fresh daemon) as one array request. Beside it, the same N `true`
   jobs through task-spooler (`tsp`, a private TS_SOCKET, one slot per CPU),
   queued by a shell loop (tsp is skipped with a message when missing).
   Each figure is the time from the first submit until the last job is seen
   ended, polled every 10 ms (`list` rather than a `wait` request, whose own
   cost grows with the number of jobs waited for); target: gpuq turns over
   at least 200 jobs/s.
2. Responsiveness: M held jobs (default 5,000, one array) released by one
   request while a second thread, every 100 ms, opens a fresh connection and
   sends `list` with limit 1 (what `gpuq ls --limit 1` sends), until every
   job has ended; target: p99 of the whole request (connect, hello, list)
   under 100 ms. The time after connecting (the hello and the `list`,
   which the client sends together) is printed too.

Benchmarks print their figures beside the targets; they never fail on time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq.client import Client
from tests.daemon_harness import DaemonHarness, running_daemon

TARGET_JOBS_PER_SECOND = 200.0
TARGET_P99_SECONDS = 0.1
POLL_SECONDS = 0.01
PROBE_SECONDS = 0.1
DRAIN_TIMEOUT = 600.0


def job_spec(root: Path, *, hold: bool = False) -> dict[str, Any]:
    """What `gpuq submit --gpus 0 -- true` sends (the whole environment is captured)."""
    return {
        "command": ["true"],
        "cwd": str(root),
        "env": dict(os.environ),
        "gpus": 0,
        "name": "true",
        "hold": hold,
    }


def unfinished(client: Client) -> bool:
    """True while any job is pending or running (`gpuq ls --limit 1` shows a row)."""
    return bool(client.call("list", include_done=False, limit=1)["jobs"])


def gpuq_turnover(root: Path, jobs: int, *, as_array: bool) -> float:
    """Seconds from the first submit until every job ended, on a fresh daemon."""
    with running_daemon(root) as daemon, daemon.client() as client:
        spec = job_spec(daemon.root)
        start = time.perf_counter()
        if as_array:
            ids = client.call("submit", spec=spec, array=list(range(jobs)))["ids"]
        else:
            ids = [client.call("submit", spec=spec)["ids"][0] for _ in range(jobs)]
        while unfinished(client):
            time.sleep(POLL_SECONDS)
        elapsed = time.perf_counter() - start
        _check_succeeded(daemon, ids, jobs)
    return elapsed


def _check_succeeded(daemon: DaemonHarness, ids: list[int], expected: int) -> None:
    """Refuse a figure for jobs that did not all run and succeed."""
    states = [j["state"] for j in daemon.call("list", ids=ids, include_done=True)["jobs"]]
    ok = states.count("succeeded")
    if len(ids) != expected or ok != expected:
        raise RuntimeError(f"{ok} of {expected} jobs succeeded ({len(ids)} submitted)")


def tsp_turnover(root: Path, jobs: int, slots: int) -> float:
    """Seconds from the first `tsp true` until every job finished, on a private server."""
    root.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "TS_SOCKET": str(root / "ts.sock"),
        "TS_SLOTS": str(slots),
        "TS_MAXFINISHED": str(jobs + 10),  # keep every finished job listed
        "TMPDIR": str(root),  # its output files go here
    }

    def tsp(*args: str) -> str:
        done = subprocess.run(["tsp", *args], env=env, capture_output=True, text=True, check=False)
        return done.stdout

    tsp("-S", str(slots))  # starts the server with its slots set
    try:
        start = time.perf_counter()
        subprocess.run(
            ["bash", "-c", "for ((i = 0; i < $0; i++)); do tsp true; done >/dev/null", str(jobs)],
            env=env,
            check=True,
        )
        while (finished := _tsp_finished(tsp("-l"))) < jobs:
            time.sleep(POLL_SECONDS)
        elapsed = time.perf_counter() - start
        if finished != jobs:
            raise RuntimeError(f"tsp lists {finished} finished jobs, expected {jobs}")
    finally:
        tsp("-K")
    return elapsed


def _tsp_finished(listing: str) -> int:
    """How many jobs of a `tsp -l` listing are finished."""
    return sum(1 for line in listing.splitlines()[1:] if line.split()[1:2] == ["finished"])


@dataclass
class Probes:
    """Times of `list` requests, each on a fresh connection: whole, and after connecting."""

    totals: list[float] = field(default_factory=list)
    replies: list[float] = field(default_factory=list)
    drained_at: float | None = None
    error: BaseException | None = None


def probe_until_drained(daemon: DaemonHarness, probes: Probes, stop: threading.Event) -> None:
    """Every PROBE_SECONDS, connect and time `list --limit 1` until no job is left."""
    config = daemon.config
    deadline = time.perf_counter() + DRAIN_TIMEOUT
    next_probe = time.perf_counter()
    try:
        while not stop.is_set() and time.perf_counter() < deadline:
            began = time.perf_counter()
            with Client.connect(config, autostart=False, timeout=DRAIN_TIMEOUT) as client:
                sent = time.perf_counter()
                rows = client.call("list", include_done=False, limit=1)["jobs"]
                replied = time.perf_counter()
            probes.totals.append(replied - began)
            probes.replies.append(replied - sent)
            if not rows:
                probes.drained_at = replied
                return
            next_probe += PROBE_SECONDS
            while next_probe < time.perf_counter():  # a late reply skips missed probes
                next_probe += PROBE_SECONDS
            stop.wait(next_probe - time.perf_counter())
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which re-raises
        probes.error = exc


def responsiveness(root: Path, held: int) -> tuple[Probes, float]:
    """Release `held` jobs at once while probing; returns the probes and the release time."""
    with running_daemon(root) as daemon:
        with daemon.client() as client:
            submitted = client.call(
                "submit", spec=job_spec(daemon.root, hold=True), array=list(range(held))
            )
        probes, stop = Probes(), threading.Event()
        thread = threading.Thread(target=probe_until_drained, args=(daemon, probes, stop))
        thread.start()
        try:
            with Client.connect(daemon.config, autostart=False, timeout=DRAIN_TIMEOUT) as client:
                released_at = time.perf_counter()
                results = client.call("release", ids=[submitted["array_id"]])["results"]
            thread.join(DRAIN_TIMEOUT)
        finally:
            stop.set()
            thread.join()
        if probes.error is not None:
            raise probes.error
        if probes.drained_at is None:
            raise RuntimeError(f"jobs still unfinished after {DRAIN_TIMEOUT:.0f}s")
        _check_succeeded(daemon, submitted["ids"], held)
        if sum(r["ok"] for r in results) != held:
            raise RuntimeError("not every job was released")
    return probes, released_at


def percentile(values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of `values`."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))]


def report_turnover(jobs: int, gpuq: dict[str, float], tsp: float | None) -> None:
    """Print jobs/s for each way of submitting, against tsp and the target."""
    print(f"[1] turnover of {jobs} `--gpus 0 -- true` jobs (first submit -> last ended):")
    for label, seconds in gpuq.items():
        rate = jobs / seconds
        ratio = "" if tsp is None else f", gpuq/tsp {tsp / seconds:.2f}"
        target = TARGET_JOBS_PER_SECOND
        verdict = "OK" if rate >= target else "UNDER TARGET"
        print(
            f"    gpuq, {label:<24} {seconds:6.2f} s  {rate:7.1f} jobs/s{ratio} "
            f"(target >= {target:.0f}/s, ratio {rate / target:.2f}): {verdict}"
        )
    if tsp is not None:
        print(f"    tsp,  {'shell loop of `tsp true`':<24} {tsp:6.2f} s  {jobs / tsp:7.1f} jobs/s")


def _spread(values: list[float]) -> str:
    """Median, p99 and max of `values` (seconds), in milliseconds."""
    return (
        f"median {statistics.median(values) * 1000:.1f} ms, "
        f"p99 {percentile(values, 0.99) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"
    )


def report_responsiveness(held: int, probes: Probes, released_at: float) -> None:
    """Print the reply-time distribution of the probes, against the target.

    The target applies to the whole request on a fresh connection (connect,
    hello, `list`), as `gpuq ls --limit 1` makes it: a stalled daemon may
    hold up the hello as well as the `list`.
    """
    p99 = percentile(probes.totals, 0.99)
    assert probes.drained_at is not None
    drain = probes.drained_at - released_at
    verdict = "OK" if p99 < TARGET_P99_SECONDS else "OVER TARGET"
    print(
        f"[2] `list --limit 1` on a fresh connection every {PROBE_SECONDS * 1000:.0f} ms "
        f"while {held} released jobs drain ({len(probes.totals)} requests):"
    )
    print(
        f"    connect + hello + list: {_spread(probes.totals)} "
        f"(target p99 < {TARGET_P99_SECONDS * 1000:.0f} ms, ratio {p99 / TARGET_P99_SECONDS:.2f}): "
        f"{verdict}"
    )
    print(f"    after connecting:       {_spread(probes.replies)}")
    print(f"    all {held} ended {drain:.2f} s after the release ({held / drain:.0f} jobs/s)")


def main() -> None:
    """Run both measurements and print them beside their targets."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500, help="jobs for the turnover race")
    parser.add_argument("--held", type=int, default=5000, help="held jobs released at once")
    parser.add_argument(
        "--tsp-slots", type=int, default=os.cpu_count() or 1, help="tsp slots (default: CPUs)"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gq-bench-"))
    try:
        runs: dict[str, Callable[[], float]] = {
            "one request per job": lambda: gpuq_turnover(root / "a", args.jobs, as_array=False),
            "one array request": lambda: gpuq_turnover(root / "b", args.jobs, as_array=True),
        }
        gpuq = {label: run() for label, run in runs.items()}
        tsp: float | None = None
        if shutil.which("tsp") is None:
            print("tsp not found: skipping task-spooler (apt-get install task-spooler)")
        else:
            tsp = tsp_turnover(root / "tsp", args.jobs, args.tsp_slots)
        report_turnover(args.jobs, gpuq, tsp)
        probes, released_at = responsiveness(root / "c", args.held)
        report_responsiveness(args.held, probes, released_at)
        print(f"{os.cpu_count()} cpus, tsp slots {args.tsp_slots}, load {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
