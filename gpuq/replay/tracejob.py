"""A trace job: one of the simulator's applications, run live with time compressed.

    python -m gpuq.replay.tracejob --app cifar10 --batch-size 128 --speedup 60

It trains nothing. Each iteration takes the step time the Pollux tables give
for its batch size on the GPUs it holds (`GPUQ_GPU_UUIDS`, else `--replicas`),
divided by `--speedup`, and advances its progress by the application's
statistical gain, exactly as `gpuq.sim.jobs.SimJob.advance` does for a job
alone on its GPUs; it ends when the simulator's job would (all epochs of
the application). Iterations are grouped so that each `gq.step()` lasts
about `--tick` seconds of real time; sleeps aim at absolute deadlines, so
time does not drift, except after a park or a stop (more than a tick lost),
where the schedule moves by the time lost. On fake GPUs shared with other
jobs computing at once, each tick takes the fake GPU's sharing slowdown
times longer (`gpuq.gpus.fakeload`), as packed jobs would on a real GPU.

Every attempt pays the simulator's restart penalty (`--restart-penalty`,
simulated seconds), as the simulator charges one at every (re)start. Its
schedule starts one penalty after the process did; the real time spent
starting (Python, torch, the runner) counts towards it, and start-up slower
than the compressed penalty is made up by running ahead of the schedule
until the job is back on it. Start-up costs are an artefact of compressing
time (at real speed they are a few seconds of a 30 s penalty), so a replay
charges exactly the simulator's penalty. The progress is kept in the
runner's `State`, so a checkpoint suspend and restart continues where it
stopped, and a park keeps the job's place.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

from gpuq.env import gpu_uuids
from gpuq.gpus.fakeload import JobDevices
from gpuq.sim.apps import Application, get_application

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_age() -> float:
    """Real seconds since this process started (from /proc; 0 where unknown)."""
    try:
        with open("/proc/self/stat", "rb") as stat:
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
    """The simulated training of one application at a fixed batch size on `replicas` GPUs."""

    def __init__(self, app: Application, batch_size: int, replicas: int) -> None:
        self.app = app
        self.replicas = replicas
        self.config = app.fixed_batch_config(replicas, batch_size)
        self.batch = self.config.total(replicas)
        step, sync = app.step_time((replicas,), self.config.atomic_bsz)
        self.iteration_seconds = step + self.config.accum_steps * (step - sync)

    def advance(self, progress: float, epoch: int, seconds: float) -> tuple[float, float, int]:
        """Train for up to `seconds` (simulated): the seconds used, progress and epoch after.

        Fewer seconds are used only when training completes within them.
        """
        bounds = self.app.epoch_progress
        left = seconds
        while left > 0 and epoch < self.app.max_epochs:
            rate = self.app.gain(epoch, self.batch) / self.iteration_seconds
            needed = (bounds[epoch + 1] - progress) / rate
            if needed > left:
                return seconds, progress + rate * left, epoch
            progress, epoch, left = float(bounds[epoch + 1]), epoch + 1, left - needed
        return seconds - left, progress, epoch

    def complete(self, epoch: int) -> bool:
        """True once every epoch of the application has run."""
        return epoch >= self.app.max_epochs


def main(argv: Sequence[str] | None = None) -> None:
    """Run the trace job (module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m gpuq.replay.tracejob", description=__doc__)
    parser.add_argument("--app", required=True, help="a simulator application (cifar10, ...)")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--replicas", type=int, default=1, help="GPUs, outside gpuq")
    parser.add_argument("--speedup", type=float, default=60.0)
    parser.add_argument("--restart-penalty", type=float, default=30.0)
    parser.add_argument("--tick", type=float, default=0.1, help="real seconds per gq.step()")
    args = parser.parse_args(argv)
    if args.speedup <= 0 or args.tick <= 0 or args.batch_size <= 0:
        parser.error("--speedup, --tick and --batch-size must be positive")

    import gpuq.runner as gq

    job = gq.init()
    trace = Trace(get_application(args.app), args.batch_size, replicas_held(args.replicas))
    progress = {"progress": 0.0, "epoch": 0, "simulated": 0.0}
    state = gq.State(progress=progress)
    state.restore()
    # The schedule starts one restart penalty after the process did: start-up
    # time up to the penalty is the penalty, and more is made up by running
    # ahead of the schedule (no sleeps) until the job is back on it.
    tick_start = time.monotonic() - process_age() + args.restart_penalty / args.speedup
    devices = JobDevices.from_env()
    while not trace.complete(int(progress["epoch"])):
        used, value, epoch = trace.advance(
            float(progress["progress"]), int(progress["epoch"]), args.tick * args.speedup
        )
        slowdown = 1.0 if devices is None else devices.slowdown()
        tick_end = tick_start + used * slowdown / args.speedup
        before = time.monotonic()
        if tick_end > before:
            time.sleep(tick_end - before)
        progress.update(progress=value, epoch=epoch, simulated=progress["simulated"] + used)
        gq.step()
        # Time lost beyond a tick was a park or a stop: the schedule moves by it.
        lost = time.monotonic() - max(before, tick_end)
        tick_start = tick_end + (lost if lost > args.tick else 0.0)
    print(
        f"trace job {args.app} done: {progress['simulated']:.0f} simulated seconds "
        f"at step {job.step}",
        flush=True,
    )


if __name__ == "__main__":
    main()
