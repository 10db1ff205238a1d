"""Acceptance 6, and `init()` inside gpuq: the runner changes nothing until gpuq asks.

Outside gpuq (no GPUQ_JOB_ID) importing the runner and calling `init()`
installs no signal handler, starts no thread, configures no logging and
writes no file, and the example scripts give the same results with it.
Inside gpuq, `init()` makes SIGUSR1 and SIGTERM set a flag, nothing more,
and `close()` puts the previous handlers back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from torch import nn

import gpuq.runner as gq

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.torch]


@pytest.fixture
def no_gpuq(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GPUQ_* variables, and no job handle left open by another test."""
    for name in [n for n in os.environ if n.startswith("GPUQ_")]:
        monkeypatch.delenv(name)
    gq.init(environ={}).close()
    yield
    gq.init(environ={}).close()


def run_python(code: str, cwd: Path) -> dict[str, object]:
    """Run `code` in a fresh interpreter without GPUQ_* variables; it prints one JSON line."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


SIDE_EFFECTS = """
import json, logging, signal, sys, threading
{code}
print(json.dumps({{
    "torch": "torch" in sys.modules,
    "handlers": [signal.getsignal(s) is signal.SIG_DFL for s in (signal.SIGUSR1, signal.SIGTERM)],
    "threads": threading.active_count(),
    "logging": len(logging.getLogger().handlers) + len(logging.getLogger("gpuq").handlers),
}}))
"""


def test_importing_the_runner_loads_no_torch_and_touches_nothing(tmp_path: Path) -> None:
    report = run_python(SIDE_EFFECTS.format(code="import gpuq.runner"), tmp_path)
    assert report == {"torch": False, "handlers": [True, True], "threads": 1, "logging": 0}
    assert list(tmp_path.iterdir()) == []


EXAMPLES = """
import contextlib, io, json, os, runpy, signal, sys, threading

def run(name, *argv):
    path = os.path.join({root!r}, "examples", name, "train.py")
    sys.argv, out = [path, *argv], io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(path, run_name="__main__")
    return [line for line in out.getvalue().splitlines() if not line.startswith("done in")]

plain = run("mlp", "--steps", "200")
import gpuq.runner as gq
job = gq.init()
print(json.dumps({{
    "plain": plain,
    "with_runner": run("mlp", "--steps", "200"),
    "runner_example": run("runner_mlp", "--epochs", "2", "--samples", "1024"),
    "inside_gpuq": job.inside_gpuq,
    "handlers": [signal.getsignal(s) is signal.SIG_DFL for s in (signal.SIGUSR1, signal.SIGTERM)],
    "threads": threading.active_count(),
    "files": os.listdir("."),
}}))
"""


def test_the_examples_run_unchanged_outside_gpuq_with_the_runner(tmp_path: Path) -> None:
    report = run_python(EXAMPLES.format(root=str(ROOT)), tmp_path)
    assert report["with_runner"] == report["plain"] and len(report["plain"]) >= 3  # type: ignore[arg-type]
    lines = report["runner_example"]
    assert isinstance(lines, list) and lines[0] == "job -: training on cpu"
    assert [line.split(",")[0] for line in lines if line.startswith("epoch")] == [
        "epoch 0: step 16",
        "epoch 1: step 32",
    ]
    assert report["inside_gpuq"] is False and report["handlers"] == [True, True]
    assert report["threads"] == 1 and report["files"] == []


def test_outside_gpuq_init_is_a_no_op_handle(no_gpuq: None, tmp_path: Path) -> None:
    before = (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM))
    threads = threading.active_count()
    job = gq.init()
    assert job is gq.init() and not job.inside_gpuq and job.checkpoint_dir is None
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == before
    assert threading.active_count() == threads
    state = gq.State(model=nn.Linear(2, 2))
    assert state.restore() is False
    for _ in gq.epochs(2):
        gq.step()
    assert (job.step, job.epoch, job.suspends) == (2, 2, [])
    job.close()
    assert gq.init() is not job


def remember(signum: int, frame: FrameType | None) -> None:
    """A handler of the script's own, to be put back by close()."""


def test_inside_gpuq_signals_only_set_the_suspend_flag(no_gpuq: None, tmp_path: Path) -> None:
    (tmp_path / "suspended.json").write_text("{}")  # left by the previous attempt
    previous = signal.signal(signal.SIGUSR1, remember)
    try:
        job = gq.init(environ={"GPUQ_JOB_ID": "5", "GPUQ_CHECKPOINT_DIR": str(tmp_path)})
        assert job.inside_gpuq and job.checkpoint_dir == tmp_path
        assert not (tmp_path / "suspended.json").exists()
        for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGUSR1):
            os.kill(os.getpid(), signum)
            assert job.suspend_requested == "checkpoint"
        assert list(tmp_path.iterdir()) == []  # the handler saved nothing
        job.close()
        assert signal.getsignal(signal.SIGUSR1) is remember
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_suspend_without_a_state_is_an_error_with_a_hint(no_gpuq: None, tmp_path: Path) -> None:
    job = gq.init(environ={"GPUQ_JOB_ID": "5", "GPUQ_CHECKPOINT_DIR": str(tmp_path)})
    job.request_suspend("checkpoint")
    with pytest.raises(gq.RunnerError, match="no gpuq.runner.State") as error:
        gq.step()
    assert error.value.hint is not None
    with pytest.raises(gq.RunnerError, match="unknown suspend mode"):
        job.request_suspend("hibernate")  # type: ignore[arg-type]


def test_init_outside_the_main_thread_warns_that_signals_will_not_suspend(
    no_gpuq: None, tmp_path: Path
) -> None:
    caught: list[BaseException] = []

    def start() -> None:
        try:
            with pytest.warns(RuntimeWarning, match="main thread"):
                gq.init(environ={"GPUQ_JOB_ID": "5", "GPUQ_CHECKPOINT_DIR": str(tmp_path)})
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread below
            caught.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert caught == []
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


def test_a_sigcont_sent_as_soon_as_a_park_is_reported_ends_it(
    no_gpuq: None, tmp_path: Path
) -> None:
    # The daemon may resume a park the moment it reads the report, before the
    # job has begun to wait: that SIGCONT must not be lost.
    job = gq.init(environ={"GPUQ_JOB_ID": "5", "GPUQ_CHECKPOINT_DIR": str(tmp_path)})
    rescued = threading.Event()

    def rescue() -> None:
        rescued.set()
        job.resume()

    watchdog = threading.Timer(30.0, rescue)
    try:
        job.report_suspend(gq.SuspendReport("park", 3, 0, 0.0))
        os.kill(os.getpid(), signal.SIGCONT)
        watchdog.start()
        job.wait_while_parked()
        assert not rescued.is_set(), "the SIGCONT was lost: only the watchdog ended the park"
        assert signal.getsignal(signal.SIGCONT) is signal.SIG_DFL  # put back after the park
    finally:
        watchdog.cancel()
        job.close()
