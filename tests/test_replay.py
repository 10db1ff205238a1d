"""`gpuq replay`: trace jobs that behave like the simulator's applications, run by a live daemon.

See the docstrings of gpuq/replay/tracejob.py, gpuq/replay/run.py and
gpuq/cli/replay.py for the rules tested here.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuq.control import sample_to_dict
from gpuq.daemon.scheduler.view import measurements
from gpuq.errors import GpuqError, UsageError
from gpuq.policies.interface import JobView
from gpuq.policies.registry import get_policy
from gpuq.replay.run import (
    ReplayInterrupted,
    ReplayProgress,
    ReplaySettings,
    Submission,
    measure,
    policy_runs_adaptive,
    replay,
    started_on,
    submission,
    submit_spec,
    trace_command,
)
from gpuq.replay.timescale import live_policy, live_settings
from gpuq.replay.tracejob import Trace
from gpuq.runner.job import StepInfo
from gpuq.runner.metrics import MetricsRecorder
from gpuq.sim.apps import get_application
from gpuq.sim.engine import Simulator
from gpuq.sim.jobs import SimJob
from gpuq.sim.metrics import solo_run_time
from gpuq.sim.workload import WorkloadJob
from tests.daemon_harness import running_daemon, wait_for

pytestmark = [pytest.mark.torch]


@pytest.mark.parametrize(
    ("app", "replicas", "batch"),
    [("cifar10", 1, 128), ("cifar10", 2, 256), ("ncf", 1, 32768), ("bert", 1, 12)],
)
def test_a_trace_trains_exactly_as_long_as_the_simulators_job_alone(
    app: str, replicas: int, batch: int
) -> None:
    application = get_application(app)
    trace = Trace(application, batch, adaptive=False, restart_penalty=0.0)
    trace.start(replicas)
    expected = solo_run_time(application, replicas, batch, replicas)
    assert math.isclose(trace.advance(10 * expected), expected, rel_tol=1e-9)
    assert trace.complete
    # In ticks, the same: only the last tick is cut short.
    trace = Trace(application, batch, adaptive=False, restart_penalty=0.0)
    trace.start(replicas)
    total, tick = 0.0, expected / 37.3
    while not trace.complete:
        total += trace.advance(tick)
    assert math.isclose(total, expected, rel_tol=1e-9)


def simulated_alone(
    app: str, replicas: int, batch: int, restart_at: float | None = None, then: int = 0
) -> SimJob:
    """The simulator's adaptive job alone on `replicas` GPUs, in 60 s ticks, maybe moved once."""
    job = SimJob(0, WorkloadJob("x", 0.0, app, replicas, batch), get_application(app), True, 30.0)
    job.reallocate((replicas,))
    now = 0.0
    while job.finish_time is None:
        if restart_at is not None and now == restart_at:
            job.reallocate((then,))
        job.advance(now, 60.0, 1.0, 1.0)
        now += 60.0
    return job


@pytest.mark.parametrize(
    ("app", "replicas", "batch"),
    [("cifar10", 2, 256), ("cifar10", 8, 2048), ("bert", 4, 384), ("yolov3", 4, 64)],
)
def test_an_adaptive_trace_profiles_fits_and_chooses_as_the_simulators_job(
    app: str, replicas: int, batch: int
) -> None:
    trace = Trace(get_application(app), batch, adaptive=True, restart_penalty=30.0)
    trace.start(replicas)
    while not trace.complete:
        trace.advance(6.0)  # a tenth of the simulator's tick: a trace job's at 60x
    simulated = simulated_alone(app, replicas, batch)
    assert len(trace.job.profile) > 1  # it explored configurations and fitted a model
    assert trace.job.config == simulated.config
    assert trace.job.perf == simulated.perf
    assert trace.simulated == pytest.approx(simulated.finish_time, rel=1e-9)


def test_a_trace_restarted_from_its_state_continues_as_the_simulators_job_moved() -> None:
    app = get_application("cifar10")
    first = Trace(app, 256, adaptive=True, restart_penalty=30.0)
    first.start(1)
    while first.simulated < 1200.0:
        first.advance(6.0)
    saved = json.loads(json.dumps(first.state()))  # plain values, as a checkpoint keeps them
    second = Trace(app, 256, adaptive=True, restart_penalty=30.0)
    second.load(saved)
    assert (second.job.progress, second.job.epoch) == (first.job.progress, first.job.epoch)
    second.start(4)
    while not second.complete:
        second.advance(6.0)
    moved = simulated_alone("cifar10", 1, 256, restart_at=1200.0, then=4)
    assert moved.num_restarts == 1
    assert second.job.config == moved.config
    assert second.simulated == pytest.approx(moved.finish_time, rel=1e-9)


def test_the_report_gives_the_live_policy_the_model_the_simulated_one_sees() -> None:
    trace = Trace(get_application("bert"), 384, adaptive=True, restart_penalty=30.0)
    trace.start(2)
    while trace.simulated < 900.0:
        trace.advance(6.0)
    recorder = MetricsRecorder()
    trace.report(recorder)
    recorder.on_step(StepInfo(1, trace.job.epoch, None, None, None, None))
    sample = recorder.sample()
    assert sample is not None
    stored = json.loads(json.dumps(sample_to_dict(sample)))  # over the channel, into the store
    view = JobView(id=1, submit_time=0.0, **measurements(stored))
    expected = trace.job.goodput()
    assert expected is not None and view.goodput is not None
    assert view.goodput.perf == expected.perf
    assert view.goodput.grad.sqr == expected.grad.sqr
    assert view.goodput.grad.var == pytest.approx(expected.grad.var, rel=1e-12)
    assert (view.init_batch_size, view.max_batch_size) == (12, 384)
    assert view.local_bsz_bounds == trace.job.app.local_bsz_bounds
    assert view.epoch == trace.job.epoch
    config = trace.job.config
    assert config is not None and view.batch_size == config.total(2)


@pytest.mark.parametrize(
    ("policy", "job", "expected"),
    [
        ("pollux", WorkloadJob("c", 0.0, "cifar10", 2, 256), Submission(1, 8, True)),
        ("gpuq", WorkloadJob("b", 0.0, "bert", 4, 384), Submission(1, 8, True)),
        ("pollux", WorkloadJob("n", 0.0, "ncf", 1, 32768), Submission(1, None, True)),
        ("fifo", WorkloadJob("c", 0.0, "cifar10", 12, 256), Submission(8, None, False)),
        ("gandiva", WorkloadJob("y", 0.0, "yolov3", 4, 64), Submission(4, None, False)),
    ],
)
def test_jobs_are_submitted_on_the_simulators_terms_for_the_policy(
    policy: str, job: WorkloadJob, expected: Submission
) -> None:
    terms = submission(job, policy_runs_adaptive(policy), 8)
    assert terms == expected
    spec = submit_spec(job, ReplaySettings(), terms)
    assert (spec["gpus"], spec.get("gpus_max")) == (expected.gpus, expected.gpus_max)
    assert ("--adaptive" in spec["command"]) is expected.policy_adaptive


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
    # 46 s of training after the 30 s restart penalty every (re)start pays
    assert result.stdout.startswith("trace job ncf done: 76 simulated seconds")


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

    def __init__(self, runs: float, fail: str | None = None, policy: str = "fifo") -> None:
        self.now = 1000.0
        self.runs = runs
        self.fail = fail
        self.policy = policy
        self.jobs: dict[int, dict[str, Any]] = {}

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        if method == "submit":
            job_id = len(self.jobs) + 1
            spec = params["spec"]
            self.jobs[job_id] = job_record(job_id, self.now, self.now, self.now + self.runs)
            self.jobs[job_id]["name"] = spec["name"]
            self.jobs[job_id]["command"] = spec["command"]
            self.jobs[job_id]["spec"] = spec
            return {"ids": [job_id]}
        if method == "show":  # one attempt on the GPUs asked for, the first one's to start
            job = self.jobs[params["id"]]
            gpus = ", ".join(f"g{i}" for i in range(job["spec"]["gpus"]))
            events = [{"state": "queued", "reason": "submitted"}]
            events.append({"state": "starting", "reason": f"starting on {gpus}"})
            return {"job": job, "events": events, "attempts": [{"run_time": job["run_time"]}]}
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
        return {"policy": self.policy, "gpus": 4}

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
    assert [job.gpu_time for job in result.jobs] == pytest.approx([2 * 120.0, 120.0])


def test_under_pollux_adaptive_jobs_ask_for_a_range_and_their_gpu_time_is_what_they_held() -> None:
    daemon = FakeDaemon(runs=2.0, policy="pollux")
    workload = [WorkloadJob("c", 0.0, "cifar10", 2, 256), WorkloadJob("n", 0.0, "ncf", 1, 32768)]
    result = replay(
        daemon, workload, ReplaySettings(speedup=60), clock=lambda: daemon.now, sleep=daemon.sleep
    )
    adaptive, rigid = daemon.jobs[1]["spec"], daemon.jobs[2]["spec"]
    assert (adaptive["gpus"], adaptive["gpus_max"]) == (1, 4)  # on the daemon's 4 GPUs
    assert "--adaptive" in adaptive["command"]
    assert (rigid["gpus"], "gpus_max" in rigid) == (1, False)  # NCF's batch is fixed
    assert [job.gpu_time for job in result.jobs] == pytest.approx([120.0, 120.0])


@pytest.mark.parametrize(
    ("reason", "gpus"),
    [
        ("starting on GPU-a", 1),
        ("starting on GPU-a, GPU-b", 2),
        ("starting on GPU-a, GPU-b: speedup 0.50 over a fair share, say", 2),
        ("starting on GPU-a (moved: frees GPU 0, GPU 1)", 1),
        ("starting on GPU-a, GPU-b; its checkpoint is copied from gpu2 first", 2),
        ("starting on CPU", 0),
        ("starting on CPU: next in the queue, at priority 0", 0),
        ("submitted", 0),
    ],
)
def test_a_starts_gpus_are_read_up_to_what_the_policy_said(reason: str, gpus: int) -> None:
    assert started_on(reason) == gpus


def test_a_failed_job_stops_the_replay_with_its_reason() -> None:
    daemon = FakeDaemon(runs=1.0, fail="b")
    workload = [WorkloadJob("a", 0.0, "cifar10", 1, 128), WorkloadJob("b", 0.0, "ncf", 1, 32768)]
    with pytest.raises(GpuqError, match=r"replayed job 2 \(b\) failed: exited with code 1"):
        replay(daemon, workload, ReplaySettings(), clock=lambda: daemon.now, sleep=daemon.sleep)


def test_an_interrupted_replay_names_the_jobs_it_submitted_and_reports_each_submission() -> None:
    daemon = FakeDaemon(runs=10.0)
    workload = [WorkloadJob(name, 0.0, "cifar10", 1, 128) for name in ("a", "b")]
    workload.append(WorkloadJob("late", 3600.0, "cifar10", 1, 128))
    reports: list[ReplayProgress] = []

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(ReplayInterrupted) as stopped:
        replay(daemon, workload, ReplaySettings(), reports.append, lambda: daemon.now, interrupt)
    assert stopped.value.ids == (1, 2)
    assert [p.submitted for p in reports] == [1, 2, 2]  # each submission, then the poll


def test_gpuq_replay_interrupted_names_its_jobs_and_the_cancel_that_ends_them(
    tmp_path: Path,
) -> None:
    csv = tmp_path / "two.csv"
    csv.write_text("name,time,application,num_replicas,batch_size\na,0,cifar10,1,128\n"
                   "late,36000,cifar10,1,128\n")  # fmt: skip
    errors = tmp_path / "stderr"
    with running_daemon(tmp_path / "d") as daemon, errors.open("w") as stderr:
        command = [sys.executable, "-m", "gpuq.cli.entry", "replay", str(csv), "--speedup", "1"]
        run = subprocess.Popen(command, env=daemon.env, cwd=daemon.root, stderr=stderr)
        try:
            # stderr is no terminal: a line each time a job is submitted or ends
            wait_for(lambda: errors.read_text(), timeout=120, what="a progress line")
            run.send_signal(signal.SIGINT)
            run.wait(timeout=60)
        finally:
            run.kill()
            run.wait()
        [job] = daemon.call("list", ids=[], include_done=True)["jobs"]
        daemon.cli("cancel", str(job["id"]))
    assert run.returncode == 130
    assert errors.read_text() == (
        "replay: 1 of 2 jobs submitted, 0 done\n"
        f"gpuq: replay interrupted: job {job['id']} keeps running\n"
        f"hint: gpuq cancel {job['id']} ends them\n"
    )


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ReplaySettings(speedup=0), "--speedup must be a positive number"),
        (ReplaySettings(speedup=math.nan), "--speedup must be a positive number, got nan"),
        (ReplaySettings(speedup=math.inf), "--speedup must be a positive number, got inf"),
        (ReplaySettings(restart_penalty=-1), "--restart-penalty must be a number of seconds"),
        (ReplaySettings(restart_penalty=math.nan), "0 or more, got nan"),
    ],
    ids=["zero speedup", "NaN speedup", "infinite speedup", "negative penalty", "NaN penalty"],
)
def test_impossible_settings_are_refused_before_anything_is_submitted(
    settings: ReplaySettings, message: str
) -> None:
    daemon = FakeDaemon(runs=1.0)
    with pytest.raises(UsageError, match=message):
        replay(daemon, [WorkloadJob("a", 0.0, "cifar10", 1, 128)], settings)
    assert daemon.jobs == {}


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        ("no-such-file.csv", "no workload file or bundled workload"),
        ("lab:-1", "the seed must be 0 or more"),
        ("lab:1:nan", "the load must be in (0, 100], got nan"),
    ],
)
def test_a_bad_workload_is_refused_before_a_daemon_is_reached(
    tmp_path: Path, workload: str, message: str
) -> None:
    # No daemon runs with this state directory; reaching one would start it there.
    env = {
        **os.environ,
        "GPUQ_STATE_DIR": str(tmp_path / "state"),
        "GPUQ_RUNTIME_DIR": str(tmp_path / "run"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", "replay", workload, "--json"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert message in json.loads(result.stderr)["error"]["message"]
    assert not (tmp_path / "state").exists() and not (tmp_path / "run").exists()


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


@pytest.mark.parametrize(
    ("spec", "policy"),
    [
        ("fifo", "fifo"),
        ("pollux", "pollux:restart_penalty=0.5"),
        ("gpuq:starts=free", "gpuq:starts=free:restart_penalty=0.5"),
        ("pollux:restart_penalty=1", "pollux:restart_penalty=1"),  # given: kept
        ("gandiva", "gandiva:quantum=5"),
        ("tiresias", "tiresias:thresholds_gpu_hours=0.266667"),
    ],
)
def test_a_replays_daemon_runs_the_simulators_time_constants_compressed(
    spec: str, policy: str
) -> None:
    assert live_policy(spec, 60) == policy
    assert live_settings(spec, 60) == f'[scheduler]\npolicy = "{policy}"\ninterval = 1\n'
    get_policy(policy)  # a spec the registry builds
