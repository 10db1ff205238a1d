"""Packing on a fake 2-GPU server, end to end: the real CLI against a real daemon.

The acceptance criterion: jobs with `--gpu-mem` share GPUs up to capacity
and never beyond, and memory held by a foreign process is left alone. Each
fake GPU has 40G; with the default `memory_margin` of 0.05 gpuq hands out at
most 38G of it, minus what other processes hold. A background sampler reads
the daemon's job list and GPU view throughout each test and checks that no
GPU is ever promised more than that.

Foreign processes come from the fake backend's state file
(`gpus.fake_state_file`), which the daemon re-reads at every GPU sample.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import FAKE_TWO_GPUS, DaemonHarness, running_daemon, wait_for

GIB = 1024**3
MIB = 1024**2
USABLE = int(40 * GIB * (1 - 0.05))  # 38G per GPU after the default margin
ACTIVE = ("starting", "running", "suspending", "suspended")
ENDED = ("succeeded", "failed", "cancelled", "lost")
FOREIGN_PID = 999_999


# -- helpers -------------------------------------------------------------------


def submit(daemon: DaemonHarness, *args: str) -> int:
    """`gpuq submit -q ARGS`; returns the new job's id."""
    result = daemon.cli("submit", "-q", *args)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def gated(job_file: str = "done-$GPUQ_JOB_ID") -> list[str]:
    """A job command that runs until `job_file` exists in its working directory."""
    return ["sh", "-c", f"while [ ! -e {job_file} ]; do sleep 0.1; done"]


def finish(daemon: DaemonHarness, job_id: int) -> None:
    """Let a gated job end, and wait until it has."""
    (daemon.root / f"done-{job_id}").touch()
    daemon.wait_state(job_id, "succeeded")


def gpus_json(daemon: DaemonHarness) -> list[dict[str, Any]]:
    """The GPUs of `gpuq gpus --json`, by index."""
    result = daemon.cli("gpus", "--json")
    assert result.returncode == 0, result.stderr
    gpus: list[dict[str, Any]] = json.loads(result.stdout)["gpus"]
    return gpus


def jobs_json(daemon: DaemonHarness, *args: str) -> list[dict[str, Any]]:
    """The jobs of `gpuq ls --json ARGS`."""
    result = daemon.cli("ls", "--json", *args)
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)["jobs"]
    return jobs


def running_on(daemon: DaemonHarness) -> dict[int, str]:
    """Job id -> GPU UUID of every running single-GPU job."""
    return {j["id"]: j["gpu_uuids"][0] for j in jobs_json(daemon, "--state", "running")}


def waiting_reason(daemon: DaemonHarness, job_id: int) -> str:
    """Why a queued job waits, once the scheduler has said."""
    job = wait_for(
        lambda: (j := daemon.job(job_id))["reason"].startswith("waiting") and j,
        what=f"a waiting reason for job {job_id}",
    )
    assert job["state"] == "queued"
    return str(job["reason"])


def table_rows(text: str) -> list[dict[str, str]]:
    """Parse a left-aligned CLI table (columns start where their headers do)."""
    header, *rows = text.splitlines()
    names = header.split()
    starts = [header.index(name) for name in names]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [
        {name: row[start:end].strip() for name, (start, end) in zip(names, bounds, strict=True)}
        for row in rows
    ]


def set_foreign(daemon: DaemonHarness, state_file: Path, foreign: dict[str, int]) -> None:
    """Put foreign processes (GPU UUID -> bytes) on the fake GPUs, and wait until seen."""
    data = {
        uuid: {"foreign": [{"pid": FOREIGN_PID, "memory": size}]} for uuid, size in foreign.items()
    }
    partial = state_file.with_suffix(".tmp")
    partial.write_text(json.dumps(data))
    os.replace(partial, state_file)  # the daemon never reads a half-written file

    def seen() -> bool:
        return all(
            gpu["memory_foreign"] == foreign.get(gpu["uuid"], 0) for gpu in gpus_json(daemon)
        )

    wait_for(seen, what=f"the daemon to see foreign memory {foreign}")


def over_commitments(jobs: list[dict[str, Any]], gpus: list[dict[str, Any]]) -> list[str]:
    """What breaks 'shares fit their GPU' in one sample (empty if nothing does).

    Foreign memory counts too: in these tests it is set before jobs start and
    only ever shrinks, so gpuq's shares plus it must always fit.
    """
    problems = []
    shares: dict[str, int] = {}
    holders: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        if job["state"] in ACTIVE:
            for uuid in job["gpu_uuids"]:
                holders.setdefault(uuid, []).append(job)
                shares[uuid] = shares.get(uuid, 0) + (job["gpu_mem_reserved"] or 0)
    for gpu in gpus:
        uuid = gpu["uuid"]
        if gpu["memory_reserved"] + gpu["memory_foreign"] > USABLE:
            problems.append(f"GPU {gpu['index']} view: {gpu}")
        if shares.get(uuid, 0) > USABLE:
            problems.append(f"GPU {gpu['index']} shares: {holders[uuid]}")
        sole = [
            j
            for j in holders.get(uuid, [])
            if j["gpu_mem_reserved"] is None or j["spec"]["exclusive"]
        ]
        if sole and len(holders[uuid]) > 1:
            problems.append(f"GPU {gpu['index']} is not shareable but has {holders[uuid]}")
    return problems


@contextmanager
def sampling(daemon: DaemonHarness) -> Iterator[None]:
    """Check capacity in the background for the duration of the block."""
    stop = threading.Event()

    def sample() -> tuple[int, list[str]]:
        count, problems = 0, []
        while not stop.is_set():
            jobs = daemon.call("list", include_done=False)["jobs"]
            gpus = daemon.call("gpus")["gpus"]
            problems += over_commitments(jobs, gpus)
            count += 1
            stop.wait(0.01)
        return count, problems

    with ThreadPoolExecutor(max_workers=1) as pool:
        future: Future[tuple[int, list[str]]] = pool.submit(sample)
        try:
            yield
        finally:
            stop.set()
        count, problems = future.result()
    assert count > 0
    assert problems == []


@pytest.fixture
def foreign_daemon(tmp_path: Path) -> Iterator[tuple[DaemonHarness, Path]]:
    """A two-GPU daemon whose fake GPUs also read a foreign-process state file."""
    state_file = tmp_path / "fake-gpus.json"
    gpus_toml = f'[gpus]\nfake_state_file = "{state_file}"\n{FAKE_TWO_GPUS}'
    root = tmp_path / "daemon"
    root.mkdir()
    with running_daemon(root, gpus_toml=gpus_toml) as harness:
        yield harness, state_file


# -- shares up to capacity -------------------------------------------------------


def test_the_capacity_check_notices_an_over_commitment() -> None:
    def job(job_id: int, gpu_mem: int | None, exclusive: bool = False) -> dict[str, Any]:
        return {
            "id": job_id,
            "state": "running",
            "gpu_uuids": ["GPU-a"],
            "gpu_mem_reserved": gpu_mem,
            "spec": {"exclusive": exclusive},
        }

    def gpu(reserved: int, foreign: int = 0) -> dict[str, Any]:
        return {"uuid": "GPU-a", "index": 0, "memory_reserved": reserved, "memory_foreign": foreign}

    assert over_commitments([job(1, 19 * GIB), job(2, 19 * GIB)], [gpu(38 * GIB)]) == []
    assert len(over_commitments([job(1, 20 * GIB), job(2, 19 * GIB)], [gpu(39 * GIB)])) == 2
    assert over_commitments([job(1, 10 * GIB)], [gpu(10 * GIB, foreign=29 * GIB)]) != []
    assert over_commitments([job(1, None), job(2, 1 * GIB)], [gpu(1 * GIB)]) != []
    assert over_commitments([job(1, 1 * GIB, True), job(2, 1 * GIB)], [gpu(2 * GIB)]) != []


def test_shares_fill_each_gpu_up_to_capacity_and_never_beyond(daemon: DaemonHarness) -> None:
    with sampling(daemon):
        jobs = [submit(daemon, "--gpu-mem", "10G", "--", *gated()) for _ in range(8)]

        def placed() -> dict[int, str] | None:
            on = running_on(daemon)
            return on if len(on) == 6 else None

        on = wait_for(placed, what="6 jobs to run")
        uuids = [gpu["uuid"] for gpu in gpus_json(daemon)]
        assert sorted(on.values()) == sorted(uuids * 3)  # 3 per GPU
        queued = jobs_json(daemon, "--state", "queued")
        assert [j["id"] for j in queued] == [j for j in jobs if j not in on]
        for job in queued:
            assert job["reason"] == "waiting for 10.0G on a shared GPU (largest free 8.0G)"

        def all_attached() -> list[dict[str, Any]] | None:
            gpus = gpus_json(daemon)
            return gpus if all(g["memory_gpuq"] == 30 * GIB for g in gpus) else None

        for gpu in wait_for(all_attached, what="the GPUs to show the jobs' memory"):
            assert gpu["memory_reserved"] == 30 * GIB
            assert gpu["mode"] == "shared"
            assert gpu["jobs"] == sorted(j for j, uuid in on.items() if uuid == gpu["uuid"])

        # One job ends on each GPU in turn: a waiting job takes exactly the freed room.
        for ending in (jobs[0], jobs[1]):
            freed = on[ending]
            before = set(on)
            finish(daemon, ending)
            on = wait_for(placed, what="a waiting job to start")
            (started,) = set(on) - before
            assert on[started] == freed
        assert jobs_json(daemon, "--state", "queued") == []
        for job_id in list(on):
            finish(daemon, job_id)


def test_a_share_may_take_a_gpus_whole_usable_memory_and_no_more(daemon: DaemonHarness) -> None:
    largest = submit(daemon, "--gpu-mem", "38G", "--", "true")
    assert daemon.wait_state(largest, *ENDED)["state"] == "succeeded"
    result = daemon.cli("submit", "--gpu-mem", "39G", "--", "true")
    assert result.returncode == 5
    assert "more than any GPU here can give (38.0G after the 5% safety margin)" in result.stderr


def test_exclusive_shares_with_no_other_job(daemon: DaemonHarness) -> None:
    with sampling(daemon):
        first = submit(daemon, "--gpu-mem", "10G", "--", *gated())
        daemon.wait_state(first, "running")
        alone = submit(daemon, "--gpu-mem", "10G", "--exclusive", "--", *gated())
        daemon.wait_state(alone, "running")
        shares = [submit(daemon, "--gpu-mem", "10G", "--", *gated()) for _ in range(3)]
        daemon.wait_state(shares[0], "running")
        daemon.wait_state(shares[1], "running")
        reason = waiting_reason(daemon, shares[2])
        assert reason == "waiting for 10.0G on a shared GPU (largest free 8.0G)"
        on = running_on(daemon)
        assert on[alone] != on[first]
        assert {on[first], on[shares[0]], on[shares[1]]} == {on[first]}
        by_uuid = {gpu["uuid"]: gpu for gpu in gpus_json(daemon)}
        assert by_uuid[on[alone]]["jobs"] == [alone]
        assert by_uuid[on[first]]["jobs"] == sorted([first, *shares[:2]])

        another = submit(daemon, "--gpu-mem", "1G", "--exclusive", "--", *gated())
        # No GPU is free of gpuq jobs, so an exclusive job waits however small it is.
        assert waiting_reason(daemon, another).startswith("waiting for 1.0G on an unshared GPU")

        finish(daemon, alone)
        daemon.wait_state(shares[2], "running")  # the exclusive job's GPU takes shares again
        for job_id in (first, *shares, another):
            daemon.cli("cancel", str(job_id))
            daemon.wait_state(job_id, *ENDED)


def test_gpu_mem_auto_without_history_takes_a_whole_gpu(daemon: DaemonHarness) -> None:
    """With no memory peak learned for its name, an `auto` job runs on a whole GPU.

    Observed: no share is reserved (GPUQ_GPU_MEM unset), its GPU shows mode
    `whole` and takes no shares, and `gpuq ls` shows `1xauto`. The fake
    backend reports no memory for a whole-GPU job, so on fake GPUs no peak is
    ever learned and the next `auto` run of the same name is whole again.
    """
    script = "env; while [ ! -e done-$GPUQ_JOB_ID ]; do sleep 0.1; done"
    auto = submit(daemon, "--gpu-mem", "auto", "--name", "learner", "--", "sh", "-c", script)
    job = daemon.wait_state(auto, "running")
    assert job["gpu_mem"] is None
    assert job["gpu_mem_reserved"] is None
    assert job["spec"]["gpu_mem_auto"] is True
    share = submit(daemon, "--gpu-mem", "10G", "--", *gated())
    other = daemon.wait_state(share, "running")["gpu_uuids"]
    assert other != job["gpu_uuids"]
    by_uuid = {gpu["uuid"]: gpu for gpu in gpus_json(daemon)}
    assert by_uuid[job["gpu_uuids"][0]]["mode"] == "whole"
    assert by_uuid[job["gpu_uuids"][0]]["jobs"] == [auto]
    rows = table_rows(daemon.cli("ls").stdout)
    assert {row["ID"]: row["GPUS"] for row in rows} == {str(auto): "1xauto", str(share): "1x10G"}
    finish(daemon, auto)
    seen = dict(
        line.split("=", 1)
        for line in daemon.cli("logs", str(auto)).stdout.splitlines()
        if "=" in line
    )
    assert "GPUQ_GPU_MEM" not in seen

    again = submit(daemon, "--gpu-mem", "auto", "--name", "learner", "--", "sh", "-c", script)
    assert daemon.wait_state(again, "running")["gpu_mem_reserved"] is None
    finish(daemon, again)
    finish(daemon, share)


# -- foreign memory --------------------------------------------------------------


def test_shares_leave_foreign_memory_alone(foreign_daemon: tuple[DaemonHarness, Path]) -> None:
    daemon, state_file = foreign_daemon
    gpu0, gpu1 = (gpu["uuid"] for gpu in gpus_json(daemon))
    set_foreign(daemon, state_file, {gpu0: 30 * GIB})
    rows = table_rows(daemon.cli("gpus").stdout)
    assert (rows[0]["OTHER"], rows[0]["FREE"]) == ("30G", "10G")
    assert rows[1]["OTHER"] == "0"

    with sampling(daemon):
        jobs = [submit(daemon, "--gpu-mem", "10G", "--", *gated()) for _ in range(5)]
        on = wait_for(lambda: len(r := running_on(daemon)) == 3 and r, what="3 jobs to run")
        assert set(on.values()) == {gpu1}  # 38G - 30G foreign leaves 8G on GPU 0
        waiting = [j for j in jobs if j not in on]
        for job_id in waiting:
            reason = waiting_reason(daemon, job_id)
            assert reason == "waiting for 10.0G on a shared GPU (largest free 8.0G)"

        # 25G foreign leaves 13G on GPU 0: room for exactly one more share.
        set_foreign(daemon, state_file, {gpu0: 25 * GIB})
        on = wait_for(lambda: len(r := running_on(daemon)) == 4 and r, what="a 4th job to run")
        (moved,) = set(on) & set(waiting)
        assert on[moved] == gpu0
        (last,) = set(waiting) - {moved}
        assert daemon.job(last)["state"] == "queued"

        # The foreign process goes away: GPU 0 is used again.
        set_foreign(daemon, state_file, {})
        assert daemon.wait_state(last, "running")["gpu_uuids"] == [gpu0]
        assert table_rows(daemon.cli("gpus").stdout)[0]["OTHER"] == "0"
        for job_id in jobs:
            finish(daemon, job_id)


def test_a_whole_gpu_job_waits_while_foreign_memory_exceeds_the_tolerance(
    foreign_daemon: tuple[DaemonHarness, Path],
) -> None:
    daemon, state_file = foreign_daemon
    gpu0, gpu1 = (gpu["uuid"] for gpu in gpus_json(daemon))
    set_foreign(daemon, state_file, {gpu0: 1 * GIB})  # the tolerance is 512M
    with sampling(daemon):
        first = submit(daemon, "--", *gated())
        assert daemon.wait_state(first, "running")["gpu_uuids"] == [gpu1]
        second = submit(daemon, "--", *gated())
        reason = waiting_reason(daemon, second)
        assert reason == "waiting for 1 free GPU (0 free, 1 used by other processes)"
        assert table_rows(daemon.cli("gpus").stdout)[0]["OTHER"] == "1.0G"

        set_foreign(daemon, state_file, {gpu0: 256 * MIB})  # within the tolerance
        assert daemon.wait_state(second, "running")["gpu_uuids"] == [gpu0]
        finish(daemon, first)
        finish(daemon, second)
