"""Daemon benchmarks, each printed beside its target: `python -m bench.bench_daemon`.

1. 1,000 jobs submitted from 10 parallel client processes: no loss, no
   duplicate ids (and the submission rate).
2. A full scheduler pass (readiness, view, policy, reasons) over 10,000
   queued jobs on a full server: target under 100 ms (median of passes).
3. Daemon RSS with 10,000 jobs: target under 100 MB.
4. Start latency: a queued job starts within 0.5 s of its GPU freeing
   (end of the previous job as the shim recorded it, to the next job's start).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuq.daemon import jobfiles
from gpuq.daemon.scheduler import tick
from tests.daemon_harness import DaemonHarness, running_daemon, wait_for

ONE_GPU = '[[gpus.fake]]\nname = "Fake"\nmemory = "16G"\ncount = 1\n'


def _submitter(config_path: str, root: str, count: int, queue: Any) -> None:
    from gpuq.client import Client
    from gpuq.config import load_config

    spec = {"command": ["true"], "cwd": root, "env": {"PATH": os.environ["PATH"]}, "hold": True}
    ids = []
    with Client.connect(load_config(config_path), autostart=False) as client:
        for _ in range(count):
            ids.extend(client.call("submit", spec={**spec, "gpus": 0})["ids"])
    queue.put(ids)


def parallel_submits(daemon: DaemonHarness, clients: int = 10, each: int = 100) -> None:
    """1,000 submissions from 10 processes at once."""
    queue: Any = multiprocessing.Queue()
    procs = [
        multiprocessing.Process(
            target=_submitter, args=(str(daemon.config_path), str(daemon.root), each, queue)
        )
        for _ in range(clients)
    ]
    start = time.perf_counter()
    for proc in procs:
        proc.start()
    ids = [i for _ in procs for i in queue.get(timeout=120)]
    for proc in procs:
        proc.join()
    elapsed = time.perf_counter() - start
    stored = [j["id"] for j in daemon.call("list", include_done=True)["jobs"]]
    lost = clients * each - len(set(ids))
    dupes = len(ids) - len(set(ids))
    ok = lost == 0 and dupes == 0 and sorted(ids) == sorted(stored)
    print(
        f"[1] {len(ids)} jobs from {clients} clients in {elapsed:.2f}s "
        f"({len(ids) / elapsed:.0f}/s): lost {lost}, duplicate ids {dupes}, "
        f"store matches replies: {sorted(ids) == sorted(stored)}: {'OK' if ok else 'FAIL'}"
    )


def scheduler_pass_and_rss(root: Path, jobs: int = 10_000) -> None:
    """Fill a daemon with 10,000 queued jobs behind two long ones; time passes, read RSS."""
    with running_daemon(root) as daemon:
        for _ in range(2):
            daemon.submit(["sleep", "600"])
        wait_for(lambda: len(daemon.call("list", states=["running"])["jobs"]) == 2)
        spec = {"command": ["true"], "cwd": str(root), "env": dict(os.environ)}
        with daemon.client() as client:
            for i in range(jobs):
                client.call("submit", spec={**spec, "priority": i % 7, "name": f"j{i}"})
        status = daemon.call("status")
        assert daemon.process is not None
        rss = _rss_bytes(daemon.process.pid)
        print(
            f"[3] daemon RSS with {jobs + 2} jobs ({status['jobs']}): {rss / 2**20:.1f} MB "
            f"(target < 100 MB, ratio {rss / (100 * 2**20):.2f}): "
            f"{'OK' if rss < 100 * 2**20 else 'OVER TARGET'}"
        )
        daemon.stop()
        times = asyncio.run(_time_passes(daemon))
        median = statistics.median(times)
        print(
            f"[2] scheduler pass over {jobs} queued jobs: median {median * 1000:.1f} ms, "
            f"max {max(times) * 1000:.1f} ms over {len(times)} passes "
            f"(target < 100 ms, ratio {median / 0.1:.2f}): "
            f"{'OK' if median < 0.1 else 'OVER TARGET'}"
        )


async def _time_passes(daemon: DaemonHarness, passes: int = 15) -> list[float]:
    """Run real scheduler passes in-process on the daemon's own state."""
    from gpuq.daemon.server import Server

    server = Server(daemon.config)
    await server.startup()
    try:
        state = server.state
        assert state is not None
        times = []
        for _ in range(passes):
            start = time.perf_counter()
            starts = await tick.schedule_pass(state)
            times.append(time.perf_counter() - start)
            assert not starts, "the server is full: nothing may start"
        return times
    finally:
        await server.shutdown()


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def start_latency(root: Path, rounds: int = 10) -> None:
    """Chain jobs on one GPU; measure previous end -> next start."""
    with running_daemon(root, gpus_toml=ONE_GPU) as daemon:
        ids = [daemon.submit(["sleep", "0.3"]) for _ in range(rounds + 1)]
        for job_id in ids:
            daemon.wait_state(job_id, "succeeded", timeout=60)
        gaps = []
        for prev, nxt in zip(ids, ids[1:], strict=False):
            ended = jobfiles.read_json(daemon.state_dir / "jobs" / str(prev) / "exit.json")
            assert ended is not None
            gaps.append(daemon.job(nxt)["start_time"] - ended["end_time"])
    median, worst = statistics.median(gaps), max(gaps)
    print(
        f"[4] start after GPU frees: median {median * 1000:.0f} ms, worst {worst * 1000:.0f} ms "
        f"over {len(gaps)} hand-overs (target < 500 ms, ratio {worst / 0.5:.2f}): "
        f"{'OK' if worst < 0.5 else 'OVER TARGET'}"
    )


def main() -> None:
    """Run every daemon benchmark."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gq-bench-"))
    try:
        with running_daemon(root / "a") as daemon:
            parallel_submits(daemon)
        scheduler_pass_and_rss(root / "b", args.jobs)
        start_latency(root / "c")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
