"""Suspend and resume latency of gpuq.runner jobs, in checkpoint and park mode.

`python -m bench.bench_suspend [--device cpu|cuda|auto] [--json] [--quick]`

For each model (a ResNet-50-shaped CNN with bottleneck blocks, and a
transformer encoder, in plain torch.nn: bench/suspend_models.py) and each
mode, it measures with the real runner (`gq.State`, `gq.epochs`, `gq.step`):

- request -> suspended: from the request (``job.request_suspend("park")``
  from another thread; SIGUSR1 to the job process for a checkpoint, as the
  daemon sends it) until the job has parked (``job.is_parked``) or written
  its acknowledgement file (``suspended.json``, after the checkpoint). It
  includes finishing the iteration under way: suspends happen at iteration
  boundaries, the memory minimum, and requests arrive at a random point of
  an iteration. "save" is the runner's own part, boundary to state saved.
- resume -> first step: park, from ``job.resume()`` to the end of the next
  iteration; checkpoint, from launching a fresh process (as the daemon does
  on resume) to the end of its first iteration after ``state.restore()``.
  "restore" is the runner's part: copying the state back, or restore();
  "start" is the rest of a fresh process's way to restore(): interpreter,
  imports, model built on the device.
- bytes moved (copied to host, or the checkpoint file) and, on CUDA, the
  memory at iteration boundaries (minimum) and the per-iteration peak, whose
  ratio says how much a boundary suspend saves over one at a random point.

Checkpoint mode exits the process (status 75), so each checkpoint trial runs
in a subprocess of this module (``--worker``) with GPUQ_JOB_ID and
GPUQ_CHECKPOINT_DIR set; N trials chain N + 1 processes, each resuming the
previous one's checkpoint. On CPU the models are small (the whole run takes
well under a minute on a quiet machine); on CUDA (``--device auto`` when a GPU
is there, or ``cuda``) they are full-sized: ResNet-50 at 224x224, batch 64,
and a 6-layer, 512-wide encoder over a 32,000-token vocabulary. Without a GPU
the CUDA part is skipped with a message. On CUDA the loop synchronises before
each ``gq.step()``, as a loop that logs its loss does, so boundaries are real.
Gandiva reports suspend/resume under 100 ms for image models and up to 1 s
for translation models, with a 77x peak/minimum memory ratio for ResNet-50.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import gpuq.runner as gq
from bench.suspend_models import MODELS, SIZES, build

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600.0
_random = random.Random(0)


def into_iteration(step_seconds: float | None) -> None:
    """Wait a random part of an iteration, so that requests arrive anywhere within one."""
    time.sleep(_random.uniform(0.0, step_seconds or 0.0))


def wait_until(condition: Callable[[], Any], what: str, alive: Callable[[], bool]) -> None:
    """Poll `condition` every half millisecond; fail if `alive()` turns false or time runs out."""
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        if not alive() or time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what}")
        time.sleep(0.0005)


def fresh_job() -> gq.Job:
    """A new job handle outside gpuq (the park trials run in this process)."""
    gq.init(environ={}).close()
    return gq.init(environ={})


def measure_park(name: str, size: str, device: torch.device, trials: int, warmup: int) -> Row:
    """Park and resume `trials` times within one training loop."""
    job = fresh_job()
    work = build(name, size, device)
    boundaries: list[tuple[float, gq.StepInfo]] = []
    job.add_step_hook(lambda info: boundaries.append((time.monotonic(), info)))
    stop, failed, trained = threading.Event(), threading.Event(), threading.Event()
    trial_times: list[tuple[float, float]] = []
    left_on_device: list[int] = []

    def training() -> bool:
        return not trained.is_set()

    def reached(count: int) -> Callable[[], bool]:
        return lambda: len(boundaries) >= count

    def control() -> None:
        try:
            for _ in range(trials):
                start = len(boundaries)
                wait_until(reached(start + warmup), "steps", training)
                into_iteration(boundaries[-1][1].seconds)
                requested = time.monotonic()
                job.request_suspend("park")
                wait_until(lambda: job.is_parked, "the park", training)
                parked = time.monotonic()
                if device.type == "cuda":
                    left_on_device.append(torch.cuda.memory_allocated(device))
                count = len(boundaries)
                resumed = time.monotonic()
                job.resume()
                wait_until(reached(count + 1), "a step", training)
                trial_times.append((parked - requested, boundaries[count][0] - resumed))
        except BaseException:
            failed.set()
            raise
        finally:
            stop.set()

    with tempfile.TemporaryDirectory(prefix="gq-bench-") as directory:
        gq.State(model=work.model, optimizer=work.optimizer, checkpoint_dir=directory)
        controller = threading.Thread(target=control, name="bench-control")
        controller.start()
        try:
            for _ in gq.epochs(1):
                while not stop.is_set():
                    gq.step(loss=work.iteration())
        finally:
            trained.set()
            controller.join()
    job.close()
    if failed.is_set() or len(job.suspends) != trials:
        raise RuntimeError(f"park trials of {name} failed")
    infos = [info for _, info in boundaries]
    row = Row.of(name, size, device, "park", work.parameters, infos)
    row.request_to_suspended_ms = median_ms(t[0] for t in trial_times)
    row.save_ms = median_ms(report.seconds for report in job.suspends)
    row.resume_to_first_step_ms = median_ms(t[1] for t in trial_times)
    row.restore_ms = median_ms(report.resume_seconds or 0.0 for report in job.suspends)
    row.bytes_moved = job.suspends[-1].bytes
    row.left_on_device_bytes = min(left_on_device) if left_on_device else None
    return row


def measure_checkpoint(name: str, size: str, device: str, trials: int, warmup: int) -> Row:
    """Suspend `trials` times, each in its own process, each resumed by a fresh process."""
    suspends: list[tuple[float, float, dict[str, Any]]] = []  # to ack, to exit, the ack
    resumes: list[tuple[float, float, float]] = []  # to first step, restore, process start
    steps: list[dict[str, Any]] = []
    parameters = 0
    with tempfile.TemporaryDirectory(prefix="gq-bench-") as directory:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
        environ |= {"GPUQ_JOB_ID": "1", "GPUQ_CHECKPOINT_DIR": directory, "OMP_NUM_THREADS": "1"}
        ack = Path(directory) / "suspended.json"
        for run in range(trials + 1):
            final = run == trials
            ack.unlink(missing_ok=True)
            worker = [sys.executable, "-m", "bench.bench_suspend", "--worker", name]
            worker += ["--size", size, "--device", device, "--run-steps", "2" if final else "0"]
            with open(Path(directory) / f"worker-{run}.err", "w+") as errors:
                launched = time.monotonic()
                process = subprocess.Popen(
                    worker, stdout=subprocess.PIPE, stderr=errors, text=True, env=environ, cwd=ROOT
                )
                assert process.stdout is not None
                ready = read_event(process, errors)
                parameters = ready["parameters"]
                first = read_event(process, errors)
                steps.append(first)
                if run > 0:
                    restore = ready["restore_seconds"]
                    resumes.append(
                        (first["t"] - launched, restore, ready["t"] - launched - restore)
                    )
                if final:
                    steps += [json.loads(line) for line in process.stdout]
                    if process.wait(TIMEOUT) != 0:
                        raise RuntimeError(f"worker failed: {tail(errors)}")
                    break
                for _ in range(warmup):
                    steps.append(read_event(process, errors))
                into_iteration(steps[-1]["seconds"])
                requested = time.monotonic()
                process.send_signal(signal.SIGUSR1)
                wait_until(ack.exists, "suspended.json", running(process))
                acknowledged = time.monotonic()
                steps += [json.loads(line) for line in process.stdout]
                if process.wait(TIMEOUT) != gq.SUSPEND_EXIT_CODE:
                    raise RuntimeError(f"worker did not suspend: {tail(errors)}")
                exited = time.monotonic()
                record = json.loads(ack.read_text())
                suspends.append((acknowledged - requested, exited - requested, record))
    infos = [
        gq.StepInfo(s["step"], 0, s["seconds"], s["boundary"], s["peak"], None)
        for s in steps
        if "step" in s
    ]
    row = Row.of(name, size, torch.device(device), "checkpoint", parameters, infos)
    row.request_to_suspended_ms = median_ms(s[0] for s in suspends)
    row.exit_ms = median_ms(s[1] for s in suspends)
    row.save_ms = median_ms(s[2]["seconds"] for s in suspends)
    row.resume_to_first_step_ms = median_ms(r[0] for r in resumes)
    row.restore_ms = median_ms(r[1] for r in resumes)
    row.start_ms = median_ms(r[2] for r in resumes)
    row.bytes_moved = int(suspends[-1][2]["bytes"])
    return row


def running(process: subprocess.Popen[str]) -> Callable[[], bool]:
    """A test of whether `process` still runs."""
    return lambda: process.poll() is None


def read_event(process: subprocess.Popen[str], errors: Any) -> dict[str, Any]:
    """The next JSON line the worker prints; fails with its stderr if it ended instead."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.wait(TIMEOUT)
        raise RuntimeError(f"worker exited with {process.returncode}: {tail(errors)}")
    event: dict[str, Any] = json.loads(line)
    return event


def tail(errors: Any) -> str:
    """The last lines of a worker's stderr file."""
    errors.flush()
    errors.seek(0)
    return "".join(errors.readlines()[-15:])


def worker(name: str, size: str, device_name: str, run_steps: int) -> None:
    """Train `name` under the runner, one JSON line per boundary, until suspended (or N steps)."""
    device = torch.device(device_name)
    torch.set_num_threads(1)
    job = gq.init()  # inside gpuq: GPUQ_JOB_ID is set by the parent
    work = build(name, size, device)
    state = gq.State(model=work.model, optimizer=work.optimizer)
    started = time.monotonic()
    state.restore()
    restore_seconds = time.monotonic() - started
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    ready = {"parameters": work.parameters, "restore_seconds": restore_seconds}
    print(json.dumps({"ready": job.step, "t": time.monotonic(), **ready}), flush=True)

    def report(info: gq.StepInfo) -> None:
        fields = {"step": info.step, "seconds": info.seconds, "t": time.monotonic()}
        fields |= {"boundary": info.memory_boundary_bytes, "peak": info.memory_peak_bytes}
        print(json.dumps(fields), flush=True)

    job.add_step_hook(report)
    ran = 0
    for _ in gq.epochs(1):
        while run_steps == 0 or ran < run_steps:
            gq.step(loss=work.iteration())
            ran += 1


@dataclass
class Row:
    """One model and mode: medians over the trials."""

    model: str
    size: str
    device: str
    mode: str
    parameters: int
    step_ms: float | None
    memory_min_bytes: int | None
    memory_peak_bytes: int | None
    request_to_suspended_ms: float | None = None
    save_ms: float | None = None
    exit_ms: float | None = None
    resume_to_first_step_ms: float | None = None
    restore_ms: float | None = None
    start_ms: float | None = None
    """Checkpoint mode: launch to restore (interpreter, imports, model built on the device)."""
    bytes_moved: int | None = None
    left_on_device_bytes: int | None = None

    @classmethod
    def of(
        cls, name: str, size: str, device: torch.device, mode: str, params: int, infos: list[Any]
    ) -> Row:
        """A row with the step time and memory figures of these boundaries."""
        seconds = [i.seconds for i in infos if i.seconds is not None]
        floors = [i.memory_boundary_bytes for i in infos if i.memory_boundary_bytes is not None]
        peaks = [i.memory_peak_bytes for i in infos if i.memory_peak_bytes is not None]
        step_ms = median_ms(seconds) if seconds else None
        low, high = (min(floors), max(peaks)) if floors and peaks else (None, None)
        return cls(name, size, device.type, mode, params, step_ms, low, high)

    @property
    def peak_to_min(self) -> float | None:
        """How many times the iteration peak exceeds the boundary minimum."""
        if not self.memory_min_bytes or self.memory_peak_bytes is None:
            return None
        return self.memory_peak_bytes / self.memory_min_bytes


def median_ms(values: Iterable[float]) -> float:
    """The median of some durations in seconds, in milliseconds."""
    return 1000.0 * float(statistics.median(list(values)))


def mib(value: int | None) -> str:
    """Bytes as MiB for the table."""
    return "-" if value is None else f"{value / 2**20:.1f}"


def ms(value: float | None) -> str:
    """Milliseconds for the table."""
    return "-" if value is None else f"{value:.1f}"


def print_table(rows: list[Row]) -> None:
    """The results as an aligned table, then the park/checkpoint ratios per model."""
    header = ["model", "dev", "mode", "params", "step ms", "req->susp ms", "save ms"]
    header += ["resume->step ms", "start ms", "restore ms", "moved MiB", "min MiB", "peak MiB"]
    header += ["peak/min"]
    table = [header]
    for r in rows:
        ratio = "-" if r.peak_to_min is None else f"{r.peak_to_min:.1f}x"
        table.append(
            [f"{r.model} ({r.size})", r.device, r.mode, f"{r.parameters / 1e6:.2f}M"]
            + [ms(r.step_ms), ms(r.request_to_suspended_ms), ms(r.save_ms)]
            + [ms(r.resume_to_first_step_ms), ms(r.start_ms), ms(r.restore_ms)]
            + [mib(r.bytes_moved)]
            + [mib(r.memory_min_bytes), mib(r.memory_peak_bytes), ratio]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        print(
            "  ".join(
                cell.rjust(w) if i else cell.ljust(w)
                for i, (cell, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    by_key = {(r.model, r.device, r.mode): r for r in rows}
    for (model, device, mode), park in by_key.items():
        checkpoint = by_key.get((model, device, "checkpoint"))
        if mode != "park" or checkpoint is None:
            continue
        assert park.request_to_suspended_ms and park.resume_to_first_step_ms
        assert checkpoint.request_to_suspended_ms and checkpoint.resume_to_first_step_ms
        print(
            f"{model} on {device}: checkpoint/park suspend "
            f"{checkpoint.request_to_suspended_ms / park.request_to_suspended_ms:.1f}x, "
            f"resume {checkpoint.resume_to_first_step_ms / park.resume_to_first_step_ms:.1f}x"
        )


def plan(device: str, size: str | None, quick: bool) -> list[tuple[torch.device, str]]:
    """The (device, size) parts to run; CUDA parts are left out, with a message, without a GPU."""
    parts: list[tuple[torch.device, str]] = []
    if device in ("cpu", "auto"):
        parts.append((torch.device("cpu"), size or ("tiny" if quick else "small")))
    if device in ("cuda", "auto"):
        if torch.cuda.is_available():
            parts.append((torch.device("cuda"), size or ("tiny" if quick else "full")))
        else:
            print("no CUDA device: skipping the CUDA measurements", file=sys.stderr)
    return parts


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark (or, with --worker, one checkpoint-mode job process)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    parser.add_argument("--size", choices=sorted(SIZES), help="default: small on CPU, full on CUDA")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--trials", type=int, default=3, help="suspends per model and mode")
    parser.add_argument("--warmup", type=int, default=5, help="steps before each suspend")
    parser.add_argument("--quick", action="store_true", help="tiny models, 1 trial (a smoke test)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--worker", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--run-steps", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.size or "small", args.device, args.run_steps)
        return 0
    models = args.models.split(",")
    if not set(models) <= set(MODELS):
        parser.error(f"--models: choose from {', '.join(MODELS)}")
    trials, warmup = (1, 2) if args.quick else (args.trials, args.warmup)
    torch.set_num_threads(1)
    rows: list[Row] = []
    for device, size in plan(args.device, args.size, args.quick):
        for name in models:
            print(f"{name} ({size}) on {device.type}: park...", file=sys.stderr, flush=True)
            rows.append(measure_park(name, size, device, trials, warmup))
            print(f"{name} ({size}) on {device.type}: checkpoint...", file=sys.stderr, flush=True)
            rows.append(measure_checkpoint(name, size, device.type, trials, warmup))
    if args.json:
        print(json.dumps([r.__dict__ | {"peak_to_min": r.peak_to_min} for r in rows], indent=1))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
