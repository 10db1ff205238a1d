"""Moves on one server, live: the daemon moves a runner job to other GPUs for a waiting job.

Two fake GPUs of 16G under `fifo` (moves after 2 s). Two gpuq.runner jobs
(tests/control_job.py, real PyTorch on the CPU) asking 4G each end up one
per GPU (a plain 10G job holds the rest of GPU 0 while the second starts,
then is cancelled); a job that needs a whole GPU then waits for one. The
policy moves the runner job of GPU 0 onto GPU 1: it checkpoints with the
reason, restarts on exactly GPU 1, and ends bit for bit as a run never
moved, while the whole-GPU job starts on GPU 0 once it is free. Four fake
GPUs on two PCIe switches: a two-GPU job is placed within one switch, and a
runner job is moved out of the way when only that gives it one.

A daemon killed with SIGKILL at each step of a move (booked, checkpoint
asked, checkpoint saved) finishes or undoes it after its restart, with a
reason: every job ends once, and no attempt of a job overlaps another.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.test_control_runner import JOB, job_env, latest_metrics, same_state

G = 1024**3
TWO_GPUS = '[[gpus.fake]]\nname = "Fake 16G"\nmemory = "16G"\ncount = 2\n'
SWITCHES = (
    '[[gpus.fake]]\nmemory = "16G"\ncount = 2\nlink_group = "switch0"\n'
    '[[gpus.fake]]\nmemory = "16G"\ncount = 2\nlink_group = "switch1"\n'
)
FIFO = '[scheduler]\npolicy = "fifo:move_after=2"\ninterval = 0.5\n'
RUNNER_ARGS = ["--epochs", "12", "--step-delay", "0.05"]
"""About 20 s of training: time for the jobs around it to start and for a move."""
SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]
ENDED = ("succeeded", "failed", "cancelled", "lost")

pytestmark = [pytest.mark.torch]


def gpu(daemon: DaemonHarness, index: int) -> str:
    """The UUID of the daemon's GPU `index`."""
    return str(daemon.call("gpus")["gpus"][index]["uuid"])


def reasons(daemon: DaemonHarness, job_id: int) -> list[str]:
    """The job's event log, oldest first."""
    return [event["reason"] for event in daemon.call("show", id=job_id)["events"]]


def runner_job(daemon: DaemonHarness, out: Path, **spec: Any) -> int:
    command = [sys.executable, str(JOB), *RUNNER_ARGS, "--out", str(out)]
    return daemon.submit(command, env=job_env(), **spec)


def running_on(daemon: DaemonHarness, job_id: int, *indexes: int) -> bool:
    """True once the job runs on the daemon's GPUs `indexes`."""
    job = daemon.job(job_id)
    wanted = tuple(gpu(daemon, i) for i in indexes)
    return job["state"] == "running" and tuple(job["gpu_uuids"]) == wanted


def settled(daemon: DaemonHarness, *ids: int) -> None:
    """Wait until each runner job reports and has run past `move_after`: it may be moved."""
    wait_for(
        lambda: all(
            latest_metrics(daemon, i) and float(daemon.job(i)["run_time"] or 0) > 3 for i in ids
        ),
        timeout=120,
        what=f"jobs {ids} to report and run past move_after",
    )


def one_share_job_per_gpu(daemon: DaemonHarness, tmp_path: Path) -> tuple[int, int]:
    """Two 4G runner jobs, on GPU 0 and GPU 1 (a plain 10G job fills GPU 0 meanwhile)."""
    first = runner_job(daemon, tmp_path / "first.pt", gpus=1, gpu_mem=4 * G, name="first")
    wait_for(lambda: running_on(daemon, first, 0), timeout=60, what="the first job")
    filler = daemon.submit(SLEEP, gpus=1, gpu_mem=10 * G, name="filler")
    wait_for(lambda: running_on(daemon, filler, 0), timeout=60, what="the filler")
    second = runner_job(daemon, tmp_path / "second.pt", gpus=1, gpu_mem=4 * G, name="second")
    wait_for(lambda: running_on(daemon, second, 1), timeout=60, what="the second job")
    daemon.call("cancel", ids=[filler])
    daemon.wait_state(filler, "cancelled", timeout=30)
    settled(daemon, first, second)
    return first, second


def reference(tmp_path: Path) -> subprocess.Popen[bytes]:
    """The runner job outside gpuq, never moved: the state every run must end in."""
    command = [sys.executable, str(JOB), *RUNNER_ARGS, "--out", str(tmp_path / "reference.pt")]
    return subprocess.Popen(command, env=job_env(), stdout=subprocess.DEVNULL)


def attempts_one_at_a_time(daemon: DaemonHarness, job_id: int) -> None:
    """Each attempt started only after the one before ended: never two at once."""
    log = daemon.call("show", id=job_id)["events"]
    states = [event["state"] for event in log]
    starts = [i for i, state in enumerate(states) if state == "starting"]
    assert len(starts) == daemon.job(job_id)["attempts"]
    for before, after in zip(starts, starts[1:], strict=False):
        assert "queued" in states[before:after], f"job {job_id}: attempt started over another"


def test_a_share_job_is_moved_so_a_whole_gpu_job_gets_a_gpu_and_it_ends_bit_for_bit(
    tmp_path: Path,
) -> None:
    with (
        reference(tmp_path) as plain,
        running_daemon(tmp_path / "d", gpus_toml=TWO_GPUS, extra_toml=FIFO) as daemon,
    ):
        first, second = one_share_job_per_gpu(daemon, tmp_path)
        whole = daemon.submit(["sleep", "1"], gpus=1, name="whole")
        moved = f"moved to GPU 1: frees GPU 0 for job {whole}"
        wait_for(
            lambda: f"{moved} (checkpoint requested)" in reasons(daemon, first),
            timeout=120,
            what="the first job's move",
        )
        assert daemon.wait_state(whole, *ENDED, timeout=180)["state"] == "succeeded"
        assert daemon.wait_state(first, *ENDED, timeout=180)["state"] == "succeeded"
        assert daemon.wait_state(second, *ENDED, timeout=180)["state"] == "succeeded"
        assert plain.wait(timeout=180) == 0

        log = reasons(daemon, first)
        saved = next(r for r in log if "checkpoint saved" in r)
        assert saved.startswith(f"{moved}: checkpoint saved at step ")
        assert f"starting on {gpu(daemon, 1)} ({moved})" in log  # exactly the GPU chosen
        assert daemon.job(first)["attempts"] == 2
        assert daemon.job(second)["attempts"] == 1  # never moved
        # The whole-GPU job started on GPU 0 only once the moved job had left it.
        events = daemon.call("show", id=whole)["events"]
        started = next(e for e in events if e["reason"].startswith("starting on"))
        assert started["reason"] == f"starting on {gpu(daemon, 0)}"
        left = next(
            e["time"]
            for e in daemon.call("show", id=first)["events"]
            if "checkpoint saved" in e["reason"]
        )
        assert left <= started["time"]
        shown = daemon.cli("show", str(first))
        assert moved in shown.stdout, shown.stdout
    same_state(tmp_path / "reference.pt", tmp_path / "first.pt")
    same_state(tmp_path / "reference.pt", tmp_path / "second.pt")


def test_a_two_gpu_job_gets_two_gpus_of_one_switch(tmp_path: Path) -> None:
    with running_daemon(tmp_path / "d", gpus_toml=SWITCHES, extra_toml=FIFO) as daemon:
        plain = daemon.submit(SLEEP, gpus=1, name="plain")
        wait_for(lambda: running_on(daemon, plain, 0), timeout=60, what="the plain job")
        pair = daemon.submit(["sleep", "60"], gpus=2, name="pair")
        # GPU order alone would give GPUs 1 and 2, across the switches.
        wait_for(lambda: running_on(daemon, pair, 2, 3), timeout=60, what="the pair")
        gpus = daemon.call("gpus")["gpus"]
        assert [g["link_group"] for g in gpus] == ["switch0", "switch0", "switch1", "switch1"]
        table = daemon.cli("gpus").stdout.splitlines()
        assert table[0].split()[-2:] == ["LINK", "UUID"]
        assert [line.split()[-2] for line in table[1:]] == [g["link_group"] for g in gpus]
        daemon.call("cancel", ids=[plain, pair])


def test_a_runner_job_is_moved_out_of_a_switch_so_a_two_gpu_job_gets_it_whole(
    tmp_path: Path,
) -> None:
    with (
        reference(tmp_path) as plain_run,
        running_daemon(tmp_path / "d", gpus_toml=SWITCHES, extra_toml=FIFO) as daemon,
    ):
        holder = daemon.submit(SLEEP, gpus=1, name="holder")
        wait_for(lambda: running_on(daemon, holder, 0), timeout=60, what="GPU 0 held")
        mover = runner_job(daemon, tmp_path / "mover.pt", gpus=1, name="mover")
        wait_for(lambda: running_on(daemon, mover, 1), timeout=60, what="the runner job")
        blocker = daemon.submit(SLEEP, gpus=1, name="blocker")
        wait_for(lambda: running_on(daemon, blocker, 2), timeout=60, what="GPU 2 held")
        daemon.call("cancel", ids=[holder])
        daemon.wait_state(holder, "cancelled", timeout=30)
        settled(daemon, mover)
        # Free now: GPU 0 (switch0) and GPU 3 (switch1). Moving the runner job from GPU 1
        # to GPU 3 gives the pair both GPUs of switch0.
        pair = daemon.submit(["sleep", "1"], gpus=2, name="pair")
        moved = (
            f"moved to GPU 3: frees GPU 1 for job {pair}, so that its 2 GPUs share a "
            "PCIe switch or NVLink"
        )
        wait_for(
            lambda: f"{moved} (checkpoint requested)" in reasons(daemon, mover),
            timeout=120,
            what="the runner job's move",
        )
        assert daemon.wait_state(pair, *ENDED, timeout=180)["state"] == "succeeded"
        assert next(r for r in reasons(daemon, pair) if r.startswith("starting on")) == (
            f"starting on {gpu(daemon, 0)}, {gpu(daemon, 1)}"
        )
        assert daemon.wait_state(mover, *ENDED, timeout=180)["state"] == "succeeded"
        assert f"starting on {gpu(daemon, 3)} ({moved})" in reasons(daemon, mover)
        assert plain_run.wait(timeout=180) == 0
        daemon.call("cancel", ids=[blocker])
    same_state(tmp_path / "reference.pt", tmp_path / "mover.pt")


UNDONE = "is undone: the daemon stopped before asking it to"
MOVE_START = re.compile(r"starting on (\S+) \(moved to GPU (\d): frees GPU \d for job (\d+)\)")


def moves_made(daemon: DaemonHarness, job_id: int) -> list[tuple[str, int, int]]:
    """(GPU it restarted on, GPU index the move named, job it was for) of each move made."""
    return [
        (m.group(1), int(m.group(2)), int(m.group(3)))
        for r in reasons(daemon, job_id)
        if (m := MOVE_START.match(r))
    ]


@pytest.mark.parametrize("point", ["move-booked", "move-committed", "move-checkpointed"])
def test_a_daemon_killed_in_the_middle_of_a_move_finishes_or_undoes_it(
    tmp_path: Path, point: str
) -> None:
    """Killed at each step of a move, the daemon takes it up again after its restart.

    Booked but not asked: undone with a reason (the job kept running where
    it was), and a job (this one or the other, once settled) moved later.
    Asked but not sent, or checkpointed but not restarted: finished on the
    GPU chosen. Every job ends once; the moved one bit for bit as the other.
    """
    harness = DaemonHarness(tmp_path / "d", gpus_toml=TWO_GPUS, extra_toml=FIFO)
    try:
        first_daemon = harness.start(extra_env={"GPUQ_CRASH_POINT": point})
        first, second = one_share_job_per_gpu(harness, tmp_path)
        whole = harness.submit(["sleep", "1"], gpus=1, name="whole")
        assert first_daemon.wait(timeout=120) == -9  # killed in the middle of the move
        harness.start()
        ids = [first, second, whole]
        for job_id in ids:
            assert harness.wait_state(job_id, *ENDED, timeout=240)["state"] == "succeeded"
        first_log = reasons(harness, first)
        if point == "move-booked":
            assert any(f"the move to GPU 1 {UNDONE}" in r for r in first_log), first_log
            made = {job_id: moves_made(harness, job_id) for job_id in (first, second)}
            assert sorted(len(m) for m in made.values()) == [0, 1], made
        else:
            assert not any("undone" in r for r in first_log), first_log
            made = {first: moves_made(harness, first), second: moves_made(harness, second)}
            assert made == {first: [(gpu(harness, 1), 1, whole)], second: []}
        for job_id, moves in made.items():
            for uuid, index, for_job in moves:
                assert (uuid, for_job) == (gpu(harness, index), whole)  # the GPU chosen
            assert harness.job(job_id)["attempts"] == 1 + len(moves)
        for job_id in ids:
            attempts_one_at_a_time(harness, job_id)
    finally:
        harness.close()
    same_state(tmp_path / "first.pt", tmp_path / "second.pt")
