"""`gpuq replay`: trace jobs that behave like the simulator's applications, run by a live daemon.

See the docstrings of gpuq/replay/tracejob.py, gpuq/replay/run.py and
gpuq/cli/replay.py for the rules tested here.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpuq.errors import GpuqError, UsageError
from gpuq.policies.registry import get_policy
from gpuq.replay.run import ReplaySettings, measure, replay, trace_command
from gpuq.replay.tracejob import Trace
from gpuq.sim.apps import get_application
from gpuq.sim.engine import Simulator
from gpuq.sim.metrics import solo_run_time
from gpuq.sim.workload import WorkloadJob
from tests.daemon_harness import running_daemon

pytestmark = [pytest.mark.torch]


@pytest.mark.parametrize(
    ("app", "replicas", "batch"),
    [("cifar10", 1, 128), ("cifar10", 2, 256), ("ncf", 1, 32768), ("bert", 1, 12)],
)
def test_a_trace_trains_exactly_as_long_as_the_simulators_job_alone(
    app: str, replicas: int, batch: int
) -> None:
    application = get_application(app)
    trace = Trace(application, batch, replicas)
    expected = solo_run_time(application, replicas, batch, replicas)
    used, _, epoch = trace.advance(0.0, 0, 10 * expected)
    assert math.isclose(used, expected, rel_tol=1e-9)
    assert trace.complete(epoch)
    # In ticks, the same: only the last tick is cut short.
    progress, epoch, total, tick = 0.0, 0, 0.0, expected / 37.3
    while not trace.complete(epoch):
        used, progress, epoch = trace.advance(progress, epoch, tick)
        total += used
    assert math.isclose(total, expected, rel_tol=1e-9)


def test_a_trace_job_outside_gpuq_runs_its_application_to_the_end(tmp_path: Path) -> None:
    result = subprocess.run(
        [*trace_command(WorkloadJob("n", 0.0, "ncf", 1, 32768), ReplaySettings(speedup=1e5))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("trace job ncf done: 46 simulated seconds")


def job_record(
    job_id: int, submit: float, start: float, end: float, **extra: Any
) -> dict[str, Any]:
    return {
        "id": job_id,
        "name": f"j{job_id}",
        "state": "succeeded",
        "reason": "",
        "submit_time": submit,
        "first_start_time": start,
        "end_time": end,
        "run_time": end - start,
        "attempts": 1,
        **extra,
    }


def test_live_records_are_measured_in_simulated_seconds() -> None:
    workload = [
        WorkloadJob("a", 0.0, "cifar10", 1, 128),
        WorkloadJob("b", 60.0, "cifar10", 2, 256),
    ]
    jobs = [
        job_record(1, 100.0, 100.0, 110.0),
        job_record(2, 101.0, 110.0, 116.0, attempts=3, run_time=5.0),
    ]
    result = measure("fifo", 2, workload, jobs, 100.0, ReplaySettings(speedup=400))
    a, b = result.jobs
    assert (a.submit, a.start, a.finish, a.jct) == (0.0, 0.0, 4000.0, 4000.0)
    assert (b.submit, b.start, b.jct) == (400.0, 4000.0, 6000.0)
    assert (b.restarts, b.gpu_time) == (2, 5.0 * 400 * 2)
    assert (result.policy, result.total_gpus, result.reallocations) == ("fifo", 2, 2)
    assert result.makespan == 6400.0


class FakeDaemon:
    """A client whose jobs end a fixed time after submission, on a fake clock."""

    def __init__(self, runs: float, fail: str | None = None) -> None:
        self.now = 1000.0
        self.runs = runs
        self.fail = fail
        self.jobs: dict[int, dict[str, Any]] = {}

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        if method == "submit":
            job_id = len(self.jobs) + 1
            spec = params["spec"]
            self.jobs[job_id] = job_record(job_id, self.now, self.now, self.now + self.runs)
            self.jobs[job_id]["name"] = spec["name"]
            self.jobs[job_id]["command"] = spec["command"]
            return {"ids": [job_id]}
        if method == "list":
            listed = []
            for job_id in params["ids"]:
                job = dict(self.jobs[job_id])
                if job["end_time"] > self.now:
                    job["state"] = "running"
                elif self.fail == job["name"]:
                    job.update(state="failed", reason="exited with code 1")
                listed.append(job)
            return {"jobs": listed}
        assert method == "status"
        return {"policy": "fifo", "gpus": 4}

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_jobs_are_submitted_at_their_arrival_times_compressed_by_the_speedup() -> None:
    daemon = FakeDaemon(runs=2.0)
    workload = [
        WorkloadJob("late", 120.0, "cifar10", 1, 128),
        WorkloadJob("first", 0.0, "cifar10", 2, 256),
    ]
    result = replay(
        daemon, workload, ReplaySettings(speedup=60), clock=lambda: daemon.now, sleep=daemon.sleep
    )
    first, late = daemon.jobs[1], daemon.jobs[2]
    assert (first["name"], late["name"]) == ("first", "late")
    assert late["submit_time"] - first["submit_time"] == pytest.approx(2.0)
    assert "--replicas" in first["command"] and first["command"][-7] == "2"
    assert [job.name for job in result.jobs] == ["first", "late"]
    assert [job.jct for job in result.jobs] == pytest.approx([120.0, 120.0])


def test_a_failed_job_stops_the_replay_with_its_reason() -> None:
    daemon = FakeDaemon(runs=1.0, fail="b")
    workload = [WorkloadJob("a", 0.0, "cifar10", 1, 128), WorkloadJob("b", 0.0, "ncf", 1, 32768)]
    with pytest.raises(GpuqError, match=r"replayed job 2 \(b\) failed: exited with code 1"):
        replay(daemon, workload, ReplaySettings(), clock=lambda: daemon.now, sleep=daemon.sleep)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ReplaySettings(speedup=0), "--speedup must be positive"),
        (ReplaySettings(restart_penalty=-1), "--restart-penalty must be >= 0"),
    ],
)
def test_impossible_settings_are_refused_before_anything_is_submitted(
    settings: ReplaySettings, message: str
) -> None:
    daemon = FakeDaemon(runs=1.0)
    with pytest.raises(UsageError, match=message):
        replay(daemon, [WorkloadJob("a", 0.0, "cifar10", 1, 128)], settings)
    assert daemon.jobs == {}


WORKLOAD = """name,time,application,num_replicas,batch_size
a,0,cifar10,1,128
b,60,cifar10,2,256
c,120,cifar10,1,128
"""


def test_a_live_replay_under_fifo_matches_the_simulator(tmp_path: Path) -> None:
    # Two fake GPUs, fifo: a runs at once; b (2 GPUs) waits; c backfills beside a;
    # b runs once both have ended. Each job lasts 10-20 s of real time.
    csv = tmp_path / "three.csv"
    csv.write_text(WORKLOAD)
    fifo = '[scheduler]\npolicy = "fifo"\n'
    with running_daemon(tmp_path / "d", extra_toml=fifo) as daemon:
        result = daemon.cli("replay", str(csv), "--speedup", "200", "--json", timeout=300)
    assert result.returncode == 0, result.stderr
    live = json.loads(result.stdout)["results"]["fifo (live)"]

    from gpuq.sim.run import resolve_workload

    simulated = Simulator(
        get_policy("fifo"), resolve_workload(str(csv), 2, 2), nodes=1, gpus_per_node=2
    ).run()
    assert live["jobs"] == 3 and live["reallocations"] == 0
    # Start-up and exit of the real processes add a little; waiting, backfill and
    # the order of the jobs are the policy's, as simulated.
    assert live["avg_jct"] == pytest.approx(simulated.avg_jct, rel=0.15)
    assert live["makespan"] == pytest.approx(simulated.makespan, rel=0.15)
