"""A trace job: one of the simulator's applications, run live with time compressed.

    python -m gpuq.replay.tracejob --app cifar10 --batch-size 128 --speedup 60 [--adaptive]

It trains nothing: it is the simulator's own job (`gpuq.sim.jobs.SimJob`)
driven by the wall clock. On the GPUs it holds (`GPUQ_GPU_UUIDS`, else
`--replicas`) each simulated second takes 1 / `--speedup` real seconds, and
the job advances as the simulator advances it alone on those GPUs: step
times from the Pollux tables for its per-GPU batch, progress by the
statistical gain of its total batch, completion when the simulator's job
would complete (all epochs of the application). It advances in slices of
`SLICE` real seconds and groups them so that each `gq.step()` is `--tick`
real seconds of computing alone on its GPUs (a step is a fixed amount of
work, so the steps' count measures progress: on a shared fake GPU a step
takes longer, and steps made up after a late wake-up come at once), or
ends the slice in which the daemon asked for a suspend: a job at real
speed reaches its next iteration boundary in a fraction of a second, so it
leaves its GPUs about when the simulator's job does. Sleeps aim at absolute deadlines,
so time does not drift and a late wake-up (a busy machine) is made up,
except after a park or a stop (`Pauses`), where the schedule moves by the
time lost. On fake GPUs shared with other jobs computing at once, each
slice takes the fake GPU's sharing slowdown times longer
(`gpuq.gpus.fakeload`), as packed jobs would on a real GPU.

With `--tables sia` the job has Sia's tables for each GPU type it knows
(T4, RTX2080Ti, A100, RTX6000) and runs on those of its GPUs' type
(`GPUQ_GPU_TYPE`; another type runs as a T4), as the simulator's job on a
cluster of several types: it knows its single-GPU step times on every type
from its first start (Sia's profile), fits a model per type, and reports
the model of the type it runs on.

With `--adaptive` it runs as the simulator runs a job under a policy with
adaptive jobs (`Capabilities.adaptive_jobs`; an application with a fixed
batch size, NCF, still runs at it): it profiles every configuration it
runs (exact table values), fits `PerfParams` to them, and picks its per-GPU
batch and accumulation by goodput at each (re)start, epoch and refit, with
the simulator's 5% hysteresis. It refits once per `REFIT_SECONDS` of
simulated time since the attempt started, as the simulator does once per
tick. Whatever the policy, it reports what a `gpuq.runner` job's goodput
tuner reports, through the runner's metrics: the batch configuration, the
fitted model (`perf_params`), this epoch's gradient statistics (`grad_sqr`,
and `grad_var` as tr(Sigma), M0 times the model's) and the batch limits,
so that a live policy sees the model the simulated one sees.

Every attempt pays the simulator's restart penalty (`--restart-penalty`,
simulated seconds: the simulator charges one at every (re)start) before it
progresses. Its schedule starts when the process did: the real time spent
starting (Python, torch, the runner) counts towards the penalty, and
start-up slower than the compressed penalty is made up by running ahead of
the schedule until the job is back on it. Start-up costs are an artefact of
compressing time (at real speed they are a few seconds of a 30 s penalty),
so a replay charges exactly the simulator's penalty. What the job has done
(progress, epoch, profile, configuration) is kept in the runner's `State`,
so a checkpoint suspend and restart continues where it stopped, with the
configuration it had, and a park keeps the job's place.

A restart is a whole: the previous attempt saves its checkpoint and exits,
the daemon starts the next one, which starts up. The simulator charges it
all as the restart penalty, and a real restart spends a fraction of a
second of it on the daemon's part; compressed 60 times, that fraction is a
good part of the penalty. So when an attempt starts within the penalty of
its checkpoint (a resize or a move), its penalty counts from the moment the
checkpoint was saved, not from its own start (`schedule_start`); one that
started later (it was suspended and waited for GPUs) pays the whole
penalty from its start, as the simulator's job resumed after a wait does.

Importing torch (the runner's `State` and `step` need it) takes seconds of
CPU, more than a short job lasts at 60x (NCF: 76 simulated seconds, about
a second). A first attempt, with no checkpoint to read, therefore starts
its schedule at once and imports them in a background thread (scipy's
solver first: its first fit waits for it, and no longer); it reaches
its first iteration boundary, and from then on reports and can be
suspended, once they are loaded (until then the runner refuses a suspend
and the daemon asks again). A job that completes before that ends without
waiting for the import. A restart loads them first: it needs the checkpoint.
A replay avoids all this with a fork server (`gpuq.replay.forkserver`):
the job is forked from a process that has imported everything, and its
schedule starts when its launcher did (`--started`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuq.env import gpu_type, gpu_uuids
from gpuq.gpus.fakeload import JobDevices
from gpuq.sim.apps import GPU_TYPES, Application, BatchConfig, ProfileSample, get_application
from gpuq.sim.jobs import SimJob
from gpuq.sim.workload import WorkloadJob

if TYPE_CHECKING:
    from types import FrameType

    from gpuq.runner.job import Job
    from gpuq.runner.metrics import MetricsRecorder

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
REFIT_SECONDS = 60.0
"""Simulated seconds between refits of the model: the simulator's tick."""
SLICE = 0.02
"""Real seconds the job advances between two looks at a suspend request."""


def process_age(pid: int | None = None) -> float:
    """Real seconds since process `pid` (this one by default) started (/proc; 0 if unknown)."""
    try:
        with open(f"/proc/{pid or 'self'}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as uptime:
            since_boot = float(uptime.read().split()[0])
    except (OSError, IndexError, ValueError):
        return 0.0
    started = int(fields[19]) / CLOCK_TICKS  # field 22 of stat: start time after boot
    return max(0.0, since_boot - started)


def replicas_held(default: int) -> int:
    """GPUs this attempt holds (`gpuq.env.gpu_uuids`), else `default` outside gpuq."""
    return len(gpu_uuids()) or default


class Trace:
    """The simulator's job for one application, advanced in simulated seconds.

    `adaptive` is whether the policy runs adaptive jobs (`SimJob` decides
    whether this application adapts). `state()` and `load()` carry what the
    job has done across attempts, as plain values a checkpoint holds.
    """

    def __init__(
        self,
        app: Application,
        batch_size: int,
        adaptive: bool,
        restart_penalty: float,
        apps: Mapping[str, Application] | None = None,
    ) -> None:
        spec = WorkloadJob(app.name, 0.0, app.name, 1, batch_size)
        self.job = SimJob(0, spec, app, adaptive, restart_penalty, apps=apps)
        self.simulated = 0.0
        """Simulated seconds this job has held GPUs, over all attempts."""
        self._attempt_start = 0.0
        self._refits = 0

    @property
    def complete(self) -> bool:
        """True once every epoch of the application has run."""
        return self.job.finish_time is not None or self.job.epoch >= self.job.app.max_epochs

    def start(self, replicas: int, gpu_type: str = "") -> None:
        """Begin an attempt on `replicas` GPUs: the restart penalty, then a configuration.

        `gpu_type` is the type of those GPUs, for a job with tables per type.
        """
        typed = self.job.typed and gpu_type in self.job.apps
        self.job.reallocate((replicas,), [gpu_type] if typed else None)
        self._attempt_start = self.simulated
        self._refits = 0

    def advance(self, seconds: float, refit: bool = True) -> float:
        """Train for up to `seconds` (simulated): the seconds used.

        Fewer seconds are used only when training completes within them. A
        configuration seen for the first time is fitted at the end of the
        call that ends a `REFIT_SECONDS` period of the attempt, or the first
        call after it with `refit` (False while the solver is not loaded).
        """
        before = self.simulated
        period = math.floor((before + seconds - self._attempt_start) / REFIT_SECONDS)
        due = refit and period > self._refits
        if due:
            self._refits = period
        self.job.advance(before, seconds, 1.0, 1.0, refit=due)
        finish = self.job.finish_time
        used = seconds if finish is None else max(0.0, finish - before)
        self.simulated = before + used
        return used

    def state(self) -> dict[str, Any]:
        """What the job has done, as plain values for the runner's `State`."""
        job = self.job
        return {
            "progress": job.progress,
            "epoch": job.epoch,
            "simulated": self.simulated,
            "profiles": {
                kind: [list(sample) for sample in samples.values()]
                for kind, samples in job.profiles.items()
            },
            "gpu_type": job.gpu_type,
            "config": [] if job.config is None else list(job.config),
        }

    def load(self, saved: dict[str, Any]) -> None:
        """Continue from what `state()` returned (an earlier attempt's checkpoint)."""
        job = self.job
        job.progress, job.epoch = float(saved["progress"]), int(saved["epoch"])
        self.simulated = float(saved["simulated"])
        profiles = {}
        for kind, rows in saved["profiles"].items():
            samples = [
                ProfileSample(int(n), int(k), int(m), float(compute), float(step))
                for n, k, m, compute, step in rows
            ]
            profiles[kind] = {(s.num_nodes, s.num_replicas, s.local_bsz): s for s in samples}
        if saved.get("gpu_type") in job.apps:
            job.gpu_type = saved["gpu_type"]
            job.app = job.apps[job.gpu_type]
        job.load_profiles(profiles)
        config = saved["config"]
        job.config = BatchConfig(int(config[0]), int(config[1])) if config else None

    def report(self, metrics: MetricsRecorder) -> None:
        """Tell the daemon what a goodput tuner would: configuration, model, statistics."""
        job, app = self.job, self.job.app
        config = job.config
        if config is None or not job.replicas:
            return
        metrics.update_batch(
            local_batch_size=config.atomic_bsz,
            accumulation_steps=config.accum_steps + 1,
            replicas=job.replicas,
        )
        goodput = job.goodput_on(job.gpu_type) if job.typed else job.goodput()
        if goodput is None:
            return
        low, high = app.local_bsz_bounds
        metrics.update_goodput(
            grad_sqr=goodput.grad.sqr,
            grad_var=goodput.grad.var * app.init_batch_size,  # tr(Sigma), the runner's unit
            gain=app.gain(job.epoch, config.total(job.replicas)),
            perf_params=dataclasses.astuple(goodput.perf),
            batch_limits=(app.init_batch_size, app.max_batch_size, low, high),
        )


class Pauses:
    """Tells whether the job was paused since the last look: parked, or stopped and continued.

    A park shows in the runner's suspend reports; a stop (SIGSTOP) in the
    SIGCONT that ends it, which this catches (the runner's own handler
    replaces it only during a park). Any other delay (a busy machine, the
    import in the background) is not a pause: the job catches up on it.
    """

    def __init__(self, job: Job) -> None:
        self.job = job
        self.parks = 0
        self.continued = False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGCONT, self._on_continue)

    def _on_continue(self, signum: int, frame: FrameType | None) -> None:
        self.continued = True

    def paused(self) -> bool:
        """True if the job was parked or stopped since the previous call."""
        parks = sum(1 for report in self.job.suspends if report.mode == "park")
        paused = parks != self.parks or self.continued
        self.parks, self.continued = parks, False
        return paused


def schedule_start(started: float, saved_at: float | None, penalty: float) -> float:
    """Where an attempt's schedule starts, on the monotonic clock (module docstring).

    `started`: when the attempt started (monotonic); `saved_at`: the wall
    time its checkpoint was saved (None on a first attempt); `penalty`: the
    restart penalty in real seconds. From the checkpoint when the attempt
    started within the penalty of it, else from its own start.
    """
    if saved_at is None:
        return started
    gap = time.time() - (time.monotonic() - started) - saved_at
    return started - gap if 0.0 <= gap < penalty else started


def table_type(held: str, apps: Mapping[str, Application]) -> str:
    """The tables' type for GPUs of type `held` (any case); the first type if they have none."""
    for kind in apps:
        if kind.lower() == held.lower():
            return kind
    return next(iter(apps))


def has_checkpoint(directory: Path | None) -> bool:
    """True if an earlier attempt left a checkpoint (`ckpt-*.pt`) in `directory`."""
    return directory is not None and any(directory.glob("ckpt-*.pt"))


class Loader:
    """Imports the solver of the model's fit, then the runner's torch-using parts, in a thread."""

    def __init__(self) -> None:
        self.solver = threading.Event()
        self.thread = threading.Thread(target=self._load, name="gpuq-trace-import", daemon=True)
        self.thread.start()

    def _load(self) -> None:
        importlib.import_module("scipy.optimize")  # what `fit_perf_params` needs
        self.solver.set()
        importlib.import_module("gpuq.runner.state")
        importlib.import_module("gpuq.runner.loop")

    @property
    def done(self) -> bool:
        """True once everything is imported."""
        return not self.thread.is_alive()


def main(argv: Sequence[str] | None = None) -> None:
    """Run the trace job (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m gpuq.replay.tracejob", description=__doc__)
    parser.add_argument("--app", required=True, help="a simulator application (cifar10, ...)")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--adaptive", action="store_true", help="the policy runs adaptive jobs")
    parser.add_argument("--replicas", type=int, default=1, help="GPUs, outside gpuq")
    parser.add_argument("--speedup", type=float, default=60.0)
    parser.add_argument("--restart-penalty", type=float, default=30.0)
    parser.add_argument(
        "--tick", type=float, default=0.1, help="real seconds of solo computing per gq.step()"
    )
    parser.add_argument(
        "--tables",
        choices=sorted(GPU_TYPES),
        default="pollux",
        help="the measured tables: pollux (one type), sia (T4, RTX2080Ti, A100, RTX6000: the "
        "type of the job's GPUs, GPUQ_GPU_TYPE, decides its speed)",
    )
    parser.add_argument("--started", type=float, help=argparse.SUPPRESS)  # the fork server's
    args = parser.parse_args(argv)
    positive = (args.speedup, args.tick, args.batch_size)
    if not (all(0 < x < math.inf for x in positive) and 0 <= args.restart_penalty < math.inf):
        parser.error("--speedup, --tick, --batch-size must be positive, the penalty not negative")

    import gpuq.runner as gq

    job = gq.init()
    loader = Loader()
    apps = {kind: get_application(args.app, kind, args.tables) for kind in GPU_TYPES[args.tables]}
    kind = table_type(gpu_type() or "", apps)
    trace = Trace(apps[kind], args.batch_size, args.adaptive, args.restart_penalty, apps)
    saved: dict[str, Any] = {**trace.state(), "saved_at": None}
    state = None
    if has_checkpoint(job.checkpoint_dir):  # a restart: continue from the checkpoint
        loader.thread.join()
        state = gq.State(trace=saved)
        if state.restore():
            trace.load(saved)
    trace.start(replicas_held(args.replicas), kind)
    started = time.monotonic() - process_age() if args.started is None else args.started
    penalty = args.restart_penalty / args.speedup
    tick_start = schedule_start(started, saved["saved_at"], penalty)
    pauses = Pauses(job)
    computed = stepped = 0.0  # real seconds of solo-speed progress, in all and up to the last step
    devices = JobDevices.from_env()
    slowdown, slowdown_read = 1.0, -math.inf
    while not trace.complete:
        used = trace.advance(SLICE * args.speedup, refit=loader.solver.is_set())
        computed += used / args.speedup
        if devices is not None and time.monotonic() - slowdown_read >= args.tick:
            slowdown, slowdown_read = devices.slowdown(), time.monotonic()
        tick_end = tick_start + used * slowdown / args.speedup
        before = time.monotonic()
        if tick_end > before:
            time.sleep(tick_end - before)
        if state is None and loader.done:
            state = gq.State(trace=saved)  # a first attempt: nothing to restore
        boundary = computed - stepped >= args.tick - 1e-9 or job.suspend_requested
        if state is not None and boundary:
            if job.metrics is not None:
                trace.report(job.metrics)
            saved.update(trace.state(), saved_at=time.time())
            job.epoch = trace.job.epoch
            stepped += args.tick  # steps count progress, even those made up after a delay
            gq.step()
        # Time lost to a park or a stop moves the schedule; other delays are made up.
        lost = time.monotonic() - max(before, tick_end)
        tick_start = tick_end + (lost if pauses.paused() else 0.0)
    print(
        f"trace job {args.app} done: {trace.simulated:.0f} simulated seconds at step {job.step}",
        flush=True,
    )
    job.close()
    if not loader.done:  # done before torch was: do not wait for it at exit
        os._exit(0)


if __name__ == "__main__":
    main()
