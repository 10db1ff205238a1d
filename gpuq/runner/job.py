"""The job handle: whether this process runs under gpuq, and its suspend flag.

`init()` reads the GPUQ_* contract (`gpuq.env`). Outside gpuq (no
``GPUQ_JOB_ID``) it returns a handle that does nothing: no signal handlers,
no files, no threads. Inside gpuq it installs handlers for SIGUSR1 and SIGTERM
that only set a flag asking for a checkpoint-mode suspend; the flag is
honoured at the next iteration boundary (`gpuq.runner.step`), never inside the
handler. Inside gpuq it also creates `job.metrics` (a `MetricsRecorder` fed
by every boundary) and, when ``GPUQ_CONTROL_SOCKET`` is set, starts the
control-channel thread (`gpuq.runner.control`; rank 0 only under torchrun),
through which the daemon asks for suspends and receives metrics. The signal
handlers replace the script's own for the two signals until `job.close()`,
which also runs at exit, puts the previous ones back and stops the thread.
Repeated signals are idempotent: the job still suspends once. A job that
never reaches a boundary again (stuck, or past its loop) is killed by the
daemon after its grace period, as any job is.

This module imports neither torch nor anything else heavy.
"""

from __future__ import annotations

import atexit
import json
import operator
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal, SupportsIndex, get_args

from gpuq import env
from gpuq.control import ACK_FILE as ACK_FILE  # re-exported: one definition, in gpuq.control
from gpuq.control import SUSPEND_EXIT_CODE, Ack
from gpuq.errors import GpuqError, UsageError

if TYPE_CHECKING:
    from gpuq.runner.control import ControlClient
    from gpuq.runner.metrics import MetricsRecorder
    from gpuq.runner.oom import OomHook
    from gpuq.runner.state import State

SuspendMode = Literal["checkpoint", "park"]
SUSPEND_MODES: tuple[str, ...] = get_args(SuspendMode)
SUSPEND_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
"""Signals that ask a job inside gpuq for a checkpoint-mode suspend."""


class RunnerError(UsageError):
    """The training script asked the runner for something it cannot do."""


def whole_number(value: object) -> int | None:
    """`value` as an int if it is a whole number (int or NumPy integer, not bool); else None."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        return None
    return operator.index(value)


@dataclass(frozen=True)
class StepInfo:
    """What one iteration boundary measured; passed to step hooks."""

    step: int
    epoch: int
    seconds: float | None
    """Wall time since the previous boundary (None at the first one)."""
    memory_boundary_bytes: int | None
    """`torch.cuda.memory_allocated()` at the boundary; None without CUDA."""
    memory_peak_bytes: int | None
    """Peak `torch.cuda.max_memory_allocated()` during the iteration; None without CUDA."""
    loss: Any
    """The `loss` given to `step()`, detached; never synchronised by the runner."""


@dataclass(frozen=True)
class SuspendReport:
    """One suspend: how much state moved and how long it took."""

    mode: SuspendMode
    step: int
    bytes: int
    """Checkpoint mode: size of the checkpoint file; park mode: bytes copied to host."""
    seconds: float
    """Time from the boundary until the state was saved (or parked)."""
    resume_seconds: float | None = None
    """Park mode: time to copy the state back to the device."""
    paused_seconds: float | None = None
    """Park mode: time spent waiting for the resume."""


class Job:
    """A handle on the gpuq job this process belongs to (or on none at all)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.job_id: int | None = env.job_id(environ)
        self.attempt: int = env.attempt(environ)
        directory = env.checkpoint_dir(environ) if self.job_id is not None else None
        self.checkpoint_dir: Path | None = Path(directory) if directory else None
        self.step = 0
        """Iterations completed so far, across restarts."""
        self.epoch = 0
        """The epoch `gpuq.runner.epochs()` is in (or will start)."""
        self.last_step: StepInfo | None = None
        self.boundary_time: float | None = None
        """`time.perf_counter()` when the last boundary finished (suspends excluded)."""
        self.suspends: list[SuspendReport] = []
        self.closed = False
        self.state: State | None = None
        """The `State` the boundary saves or parks; set by `State(...)`."""
        self.loaders: dict[str, Any] = {}
        """Resumable data loaders by name; their positions go into checkpoints."""
        self.pending_loader_states: dict[str, dict[str, Any]] = {}
        """Positions restored before their loader was created, by loader name."""
        self._suspend: SuspendMode | None = None
        self._continue = False
        self._resume_event = threading.Event()
        self._parked = False
        self._hooks: list[Callable[[StepInfo], None]] = []
        self._previous_handlers: dict[int, Any] = {}
        self._checkpoint_requested = False
        self._daemon_request = False
        self._park_armed = False
        self._continue_handler: tuple[Any] | None = None
        """The SIGCONT handler found when a park began, while ours is installed."""
        self.metrics: MetricsRecorder | None = None
        """What the boundaries measured, for the daemon; created by `init()` inside gpuq."""
        self.channel: ControlClient | None = None
        """The control-channel thread to the daemon, if `init()` started one."""
        self.oom_hook: OomHook | None = None
        """Records a death by CUDA out-of-memory for the daemon (`gpuq.runner.oom`)."""

    def __repr__(self) -> str:
        where = f"job {self.job_id} attempt {self.attempt}" if self.inside_gpuq else "outside gpuq"
        return f"<gpuq.runner.Job {where}, step {self.step}>"

    @property
    def inside_gpuq(self) -> bool:
        """True when gpuq started this process (GPUQ_JOB_ID is set)."""
        return self.job_id is not None

    @property
    def suspend_requested(self) -> SuspendMode | None:
        """The suspend mode waiting for the next boundary, if any."""
        return self._suspend

    @property
    def is_parked(self) -> bool:
        """True while the job waits in park mode for `resume()`."""
        return self._parked

    @property
    def resume_pending(self) -> bool:
        """True once a park was told to end (`resume()` or SIGCONT) and has not ended yet."""
        return self._resume_event.is_set() or self._continue

    def request_suspend(self, mode: SuspendMode = "checkpoint") -> None:
        """Ask for a suspend at the next iteration boundary; safe from any thread.

        A checkpoint request wins over a park request, and also ends a park in
        progress (the job then saves and exits instead of waiting).
        """
        if mode not in SUSPEND_MODES:
            raise RunnerError(f"unknown suspend mode {mode!r}", hint=f"use one of {SUSPEND_MODES}")
        from gpuq.runner.distributed import check_suspend_mode  # no park under torchrun

        check_suspend_mode(mode)
        if self._suspend != "checkpoint":
            self._suspend, self._daemon_request = mode, False

    def resume(self) -> None:
        """End the park in progress; safe from any thread (not from a signal handler)."""
        self._resume_event.set()

    def request_suspend_for_daemon(self, mode: SuspendMode) -> None:
        """`request_suspend` on the daemon's behalf, which `withdraw_daemon_request` may undo."""
        pending = self._suspend
        self.request_suspend(mode)
        if self._suspend != pending:
            self._daemon_request = True

    def withdraw_daemon_request(self) -> None:
        """Drop the daemon's pending request; one from a signal or the script stays."""
        if self._daemon_request:
            self._suspend, self._daemon_request = None, False

    def request_checkpoint(self) -> None:
        """Ask for a checkpoint at the next boundary, after which training goes on."""
        self._checkpoint_requested = True

    def add_step_hook(self, hook: Callable[[StepInfo], None]) -> None:
        """Call `hook` at every iteration boundary, before a suspend is honoured."""
        self._hooks.append(hook)

    def close(self) -> None:
        """Restore the signal handlers found at `init()`; the next `init()` starts afresh."""
        global _current
        if self.closed:
            return
        self.closed = True
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()
        self._restore_continue_handler()
        if self.oom_hook is not None:
            self.oom_hook.restore()
        if self.channel is not None:
            self.channel.stop()
        atexit.unregister(self.close)
        if _current is self:
            _current = None

    # The methods below are for gpuq.runner's own modules.

    def record_step(self, info: StepInfo) -> None:
        """Keep the measurements of a boundary and pass them to the hooks."""
        self.last_step = info
        for hook in self._hooks:
            hook(info)

    def honour_checkpoint_request(self) -> None:
        """Save the checkpoint the daemon asked for, if it did, and acknowledge it."""
        if not self._checkpoint_requested:
            return
        self._checkpoint_requested = False
        if self.state is None or self.state.checkpoint_dir is None:
            self.send_ack("checkpoint", ok=False, error="the script has no gpuq.runner.State")
            return
        start = time.perf_counter()
        try:
            written = self.state.save()
        except (OSError, GpuqError) as exc:
            self.send_ack("checkpoint", ok=False, error=str(exc))
            return
        seconds = round(time.perf_counter() - start, 6)
        self.send_ack("checkpoint", step=self.step, bytes=written.bytes, seconds=seconds)

    def report_suspend(self, report: SuspendReport) -> None:
        """Tell the daemon a suspend happened (called by the boundary once state is safe).

        For a park, a resume from now on ends it, `resume()` or SIGCONT: one
        that arrives between the acknowledgement and the wait is not lost.
        """
        if report.mode == "park":
            self._arm_park()
            self._parked = True
        seconds = round(report.seconds, 6)
        self.send_ack(
            "suspend", mode=report.mode, step=report.step, bytes=report.bytes, seconds=seconds
        )

    def report_resume(self, report: SuspendReport) -> None:
        """Tell the daemon a park ended and the state is back on the device."""
        paused = None if report.paused_seconds is None else round(report.paused_seconds, 6)
        seconds = None if report.resume_seconds is None else round(report.resume_seconds, 6)
        self.send_ack(
            "resume", step=report.step, bytes=report.bytes, seconds=seconds, paused_seconds=paused
        )

    def send_ack(self, request: str, ok: bool = True, **detail: Any) -> None:
        """Acknowledge a request over the control channel, if there is one; never raises."""
        if self.channel is not None:
            self.channel.send(Ack(request, ok, detail))

    def take_suspend_request(self) -> SuspendMode | None:
        """Return and clear the pending request (called at a boundary)."""
        mode, self._suspend, self._daemon_request = self._suspend, None, False
        return mode

    def wait_while_parked(self, poll_seconds: float = 0.02) -> None:
        """Block until `resume()`, SIGCONT or a checkpoint request.

        A resume that arrived before the park began (before `report_suspend`)
        does not end it.
        """
        if not self._park_armed:
            self._arm_park()
        self._park_armed = False
        self._parked = True
        try:
            while not (self._resume_event.is_set() or self._continue):
                if self._suspend == "checkpoint":
                    return
                self._resume_event.wait(poll_seconds)
        finally:
            self._parked = False
            self._resume_event.clear()
            self._continue = False
            self._restore_continue_handler()

    def _restore_continue_handler(self) -> None:
        """Put back the SIGCONT handler a park replaced, if it replaced one."""
        if self._continue_handler is not None:
            previous = self._continue_handler[0]
            signal.signal(signal.SIGCONT, signal.SIG_DFL if previous is None else previous)
            self._continue_handler = None

    def _arm_park(self) -> None:
        """Forget earlier resumes and catch SIGCONT from now until the park ends."""
        self._resume_event.clear()
        self._continue = False
        if self._continue_handler is None and _in_main_thread():
            self._continue_handler = (signal.signal(signal.SIGCONT, self._on_continue),)
        self._park_armed = True

    def install_signal_handlers(self) -> None:
        """Make SIGUSR1 and SIGTERM request a checkpoint-mode suspend."""
        if not _in_main_thread():
            warnings.warn(
                "gpuq.runner.init() was called outside the main thread: SIGUSR1/SIGTERM "
                "will not suspend this job at an iteration boundary",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        for signum in SUSPEND_SIGNALS:
            self._previous_handlers[signum] = signal.signal(signum, self._on_suspend_signal)

    def _on_suspend_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the boundary does the work (a handler may interrupt anything).
        self._suspend, self._daemon_request = "checkpoint", False

    def _on_continue(self, signum: int, frame: FrameType | None) -> None:
        self._continue = True


_current: Job | None = None


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def init(environ: Mapping[str, str] | None = None) -> Job:
    """Return this process's job handle, creating it on the first call.

    Outside gpuq the handle does nothing. Inside gpuq the first call installs
    the SIGUSR1/SIGTERM handlers and the out-of-memory hook
    (`gpuq.runner.oom`), removes the previous attempt's acknowledgement
    file, creates `job.metrics` and starts the control channel. Later calls
    return the same handle until it is closed.
    """
    global _current
    if _current is not None and not _current.closed:
        return _current
    job = Job(environ)
    if job.inside_gpuq:
        job.install_signal_handlers()
        atexit.register(job.close)
        if job.checkpoint_dir is not None:
            (job.checkpoint_dir / ACK_FILE).unlink(missing_ok=True)
        from gpuq.runner.oom import OomHook

        job.oom_hook = OomHook(job)
        job.oom_hook.install()
        _start_reporting(job, environ)
    _current = job
    return job


def _start_reporting(job: Job, environ: Mapping[str, str] | None) -> None:
    """Create the metrics recorder and, on the coordinating rank, the control channel."""
    from gpuq.runner import distributed
    from gpuq.runner.control import ControlClient
    from gpuq.runner.metrics import MetricsRecorder

    job.metrics = MetricsRecorder()
    job.add_step_hook(job.metrics.on_step)
    path = env.control_socket(environ)
    if path is None or not distributed.is_coordinator(environ):
        return
    features = ["checkpoint", "metrics", "resize"]
    if distributed.world_size(environ) == 1:
        features.insert(1, "park")
    job.channel = ControlClient(job, path, tuple(features))
    job.channel.start()


def current_job() -> Job:
    """The open job handle; `init()` is called for scripts that did not call it."""
    return _current if _current is not None and not _current.closed else init()


def write_acknowledgement(
    directory: Path, job: Job, report: SuspendReport, extra: Mapping[str, Any]
) -> None:
    """Write ``suspended.json`` atomically: what was suspended, at what step and cost.

    The daemon reads it when the job exits with `SUSPEND_EXIT_CODE`; it names
    the job and attempt, so a stale file from an earlier attempt never counts.
    """
    record = {
        "mode": report.mode,
        "step": report.step,
        "epoch": job.epoch,
        "bytes": report.bytes,
        "seconds": round(report.seconds, 6),
        "job_id": job.job_id,
        "attempt": job.attempt,
        "exit_code": SUSPEND_EXIT_CODE if report.mode == "checkpoint" else None,
        **extra,
    }
    directory.mkdir(parents=True, exist_ok=True)
    temporary = directory / f".{ACK_FILE}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(record, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, directory / ACK_FILE)
