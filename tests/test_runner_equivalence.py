"""Acceptance 1: suspending and resuming changes nothing, bit for bit.

The job is examples/runner_mlp/train.py on the CPU with deterministic ops.
Checkpoint mode: the test sends SIGUSR1 at five random steps, each time the
job saves and exits with SUSPEND_EXIT_CODE, and the test starts it again; the
final model, optimizer and scheduler state equal an uninterrupted run's.
Park mode: within one process, five parks at random steps (one at the end of
an epoch), resumed by `job.resume()` or SIGCONT, give the same equality.

Restarts are processes forked from a server that has already imported torch
(multiprocessing's forkserver), so each costs milliseconds rather than the
seconds of a fresh interpreter; the last restart is a fresh interpreter.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import runpy
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from functools import partial
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gpuq.runner as gq
from tests.daemon_harness import wait_for

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "runner_mlp" / "train.py"
ARGS = ["--deterministic", "--samples", "1024", "--epochs", "4"]  # 16 steps an epoch, 64 in all

pytestmark = [pytest.mark.torch]


def run_example(argv: list[str], environ: dict[str, str], log: str) -> None:
    """Process target: run the example as __main__ with `environ`, output appended to `log`."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.clear()
    os.environ.update(environ)
    sys.argv = [str(EXAMPLE), *argv]
    runpy.run_path(str(EXAMPLE), run_name="__main__")


def forkserver() -> ForkServerContext:
    """A multiprocessing context whose children start with torch already imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["torch", "torch._dynamo", "gpuq.runner.loop", "gpuq.runner.data", __name__]
    )
    return context


def start_example(argv: list[str], environ: dict[str, str], log: Path) -> BaseProcess:
    """Start the example in a forked child; it exits as the example does."""
    log.touch()
    process = forkserver().Process(target=run_example, args=(argv, environ, str(log)))
    process.start()
    return process


def printed(process: BaseProcess, log: Path, text: str) -> bool:
    """True once `text` is in the log, or once the process has ended (to fail fast)."""
    return text in log.read_text() or not process.is_alive()


def plain_environ(**gpuq: str) -> dict[str, str]:
    """This process's environment without GPUQ_* variables, plus `gpuq` (GPUQ_<KEY>=...)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return environ | {f"GPUQ_{key.upper()}": value for key, value in gpuq.items()}


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(item, f"{prefix}/{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from flatten(item, f"{prefix}/{index}")
    else:
        yield prefix, value


def assert_bitwise_equal(expected_file: Path, actual_file: Path) -> None:
    """Every tensor (model, optimizer state, scheduler) equal in dtype and bits."""
    expected = dict(flatten(torch.load(expected_file)))
    actual = dict(flatten(torch.load(actual_file)))
    assert expected.keys() == actual.keys()
    tensors = [k for k, v in expected.items() if isinstance(v, torch.Tensor)]
    assert len(tensors) >= 10  # parameters, moments and step counts
    different = [
        key
        for key, value in expected.items()
        if not (
            torch.equal(value, actual[key]) and value.dtype == actual[key].dtype
            if isinstance(value, torch.Tensor)
            else value == actual[key]
        )
    ]
    assert different == []


@pytest.mark.slow
def test_five_checkpoint_suspends_at_random_steps_end_bitwise_equal(tmp_path: Path) -> None:
    rng = random.Random(20240611)
    argv = [*ARGS, "--log-every", "1"]
    reference = start_example(
        [*argv, "--out", str(tmp_path / "reference.pt")],
        plain_environ(),
        tmp_path / "reference.log",
    )
    checkpoints = tmp_path / "ckpt"
    inside = plain_environ(job_id="7", checkpoint_dir=str(checkpoints))
    suspended_at = [0]
    for attempt in range(1, 6):
        log = tmp_path / f"attempt-{attempt}.log"
        target = suspended_at[-1] + rng.randint(1, 6)  # five of these fit in 64 steps
        job = start_example(argv, inside | {"GPUQ_ATTEMPT": str(attempt)}, log)
        wait_for(partial(printed, job, log, f"step {target} "), interval=0.002)
        os.kill(job.pid, signal.SIGUSR1)  # type: ignore[arg-type]
        job.join(60)
        assert job.exitcode == gq.SUSPEND_EXIT_CODE, log.read_text()
        ack = json.loads((checkpoints / "suspended.json").read_text())
        assert ack["mode"] == "checkpoint" and ack["step"] > target
        assert (ack["attempt"], ack["checkpoint"]) == (attempt, f"ckpt-{ack['step']}.pt")
        if attempt > 1:
            assert f"resumed from step {suspended_at[-1]} " in log.read_text()
        suspended_at.append(ack["step"])

    finished = subprocess.run(
        [sys.executable, str(EXAMPLE), *ARGS, "--out", str(tmp_path / "resumed.pt")],
        env=inside | {"GPUQ_ATTEMPT": "6"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    assert f"resumed from step {suspended_at[-1]} " in finished.stdout
    assert not (checkpoints / "suspended.json").exists()  # the new attempt cleared it
    reference.join(60)
    assert reference.exitcode == 0
    assert_bitwise_equal(tmp_path / "reference.pt", tmp_path / "resumed.pt")


@pytest.fixture
def in_process_example(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[str]], None]]:
    """The example's main(), with torch's global settings put back afterwards."""
    for name in [n for n in os.environ if n.startswith("GPUQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    gq.init(environ={}).close()
    yield runpy.run_path(str(EXAMPLE))["main"]
    gq.init(environ={}).close()
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)


class Resumer(threading.Thread):
    """Resumes each park, alternately by `job.resume()` and by SIGCONT, checking it is empty."""

    def __init__(self, job: gq.Job) -> None:
        super().__init__(daemon=True)
        self.job, self.parks, self.done = job, 0, threading.Event()
        self.emptied: list[bool] = []

    def run(self) -> None:
        while not self.done.is_set():
            if not self.job.is_parked:
                self.done.wait(0.001)
                continue
            assert self.job.state is not None
            model, opt = self.job.state.objects["model"], self.job.state.objects["optimizer"]
            tensors = [*model.parameters(), *(t for s in opt.state.values() for t in s.values())]
            self.emptied.append(all(t.numel() == 0 for t in tensors))
            self.parks += 1
            if self.parks % 2:
                self.job.resume()
            else:
                os.kill(os.getpid(), signal.SIGCONT)
            # A park ends with its report; the next one may follow at the very next step.
            wait_for(lambda: len(self.job.suspends) == self.parks, what="the park to end")


def test_five_parks_at_random_steps_end_bitwise_equal(
    tmp_path: Path, in_process_example: Callable[[list[str]], None]
) -> None:
    main = in_process_example
    argv = [*ARGS, "--log-every", "0"]
    main([*argv, "--out", str(tmp_path / "reference.pt")])
    gq.init(environ={}).close()

    rng = random.Random(99)
    park_at = sorted([*rng.sample([s for s in range(1, 64) if s != 32], 4), 32])
    job = gq.init(environ={})
    job.add_step_hook(lambda info: job.request_suspend("park") if info.step in park_at else None)
    resumer = Resumer(job)
    resumer.start()
    try:
        main([*argv, "--out", str(tmp_path / "parked.pt")])
    finally:
        resumer.done.set()
        resumer.join()
    assert [(r.mode, r.step) for r in job.suspends] == [("park", s) for s in park_at]
    assert resumer.emptied == [True] * 5
    assert all(r.bytes > 100_000 and r.resume_seconds is not None for r in job.suspends)
    assert_bitwise_equal(tmp_path / "reference.pt", tmp_path / "parked.pt")


@pytest.fixture
def inside_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[gq.Job]:
    """A job handle as gpuq makes it, checkpointing into tmp_path (closed afterwards)."""
    for name in [n for n in os.environ if n.startswith("GPUQ_")]:
        monkeypatch.delenv(name)
    gq.init(environ={}).close()
    job = gq.init(environ={"GPUQ_JOB_ID": "3", "GPUQ_CHECKPOINT_DIR": str(tmp_path)})
    yield job
    job.close()
    gq.init(environ={}).close()


def park_then(job: gq.Job, action: Callable[[], None]) -> tuple[dict[str, Any], int | None]:
    """Train one step, park at its boundary, run `action` while parked; the exit code."""
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    gq.State(model=model, optimizer=opt)

    def when_parked() -> None:
        wait_for(lambda: job.is_parked, what="the park")
        action()

    job.request_suspend("park")
    threading.Thread(target=when_parked, daemon=True).start()
    with pytest.raises(SystemExit) as exit_:
        gq.step()
    return before, exit_.value.code if isinstance(exit_.value.code, int) else None


def restored_model(directory: Path) -> dict[str, Any]:
    gq.init(environ={}).close()
    model = nn.Linear(64, 64)
    assert gq.State(model=model, checkpoint_dir=directory).restore()
    return model.state_dict()


def test_a_checkpoint_request_ends_a_park_with_a_checkpoint_from_host_memory(
    tmp_path: Path, inside_job: gq.Job
) -> None:
    acks: list[str] = []

    def ask_for_a_checkpoint() -> None:
        acks.append(json.loads((tmp_path / "suspended.json").read_text())["mode"])
        inside_job.request_suspend("checkpoint")

    before, code = park_then(inside_job, ask_for_a_checkpoint)
    ack = json.loads((tmp_path / "suspended.json").read_text())
    assert code == gq.SUSPEND_EXIT_CODE and acks == ["park"]
    assert (ack["mode"], ack["step"]) == ("checkpoint", 1)
    assert all(torch.equal(v, before[k]) for k, v in restored_model(tmp_path).items())


def test_a_park_asked_as_the_job_is_resumed_parks_it_at_the_next_boundary(
    inside_job: gq.Job,
) -> None:
    def when_parked(ask_again: bool) -> None:
        wait_for(lambda: inside_job.is_parked, what="the park")
        if ask_again:
            inside_job.request_suspend("park")  # the daemon's next turn, before the job woke
        inside_job.resume()

    model = nn.Linear(4, 4)
    gq.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    inside_job.request_suspend("park")
    threading.Thread(target=when_parked, args=(True,), daemon=True).start()
    gq.step()  # parks at step 1, is resumed, and computes again
    assert [(r.mode, r.step) for r in inside_job.suspends] == [("park", 1)]
    assert inside_job.suspend_requested == "park"
    threading.Thread(target=when_parked, args=(False,), daemon=True).start()
    gq.step()
    assert [(r.mode, r.step) for r in inside_job.suspends] == [("park", 1), ("park", 2)]


def test_a_park_with_no_room_to_come_back_ends_with_a_checkpoint(
    tmp_path: Path, inside_job: gq.Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    def device_full(host: Any, device: Any) -> Any:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr("gpuq.runner.loop._to_device", device_full)
    before, code = park_then(inside_job, inside_job.resume)
    assert code == gq.SUSPEND_EXIT_CODE
    assert json.loads((tmp_path / "suspended.json").read_text())["mode"] == "checkpoint"
    assert all(torch.equal(v, before[k]) for k, v in restored_model(tmp_path).items())


@pytest.mark.gpu
@pytest.mark.torch
def test_park_on_cuda_frees_the_state_and_puts_it_back_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for name in [n for n in os.environ if n.startswith("GPUQ_")]:
        monkeypatch.delenv(name)
    gq.init(environ={}).close()
    job = gq.init(environ={})
    try:
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        gq.State(model=model, optimizer=opt)
        for _ in range(3):
            model(torch.randn(256, 1024, device="cuda")).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            gq.step()
        boundary = job.last_step
        state_bytes = 3 * sum(p.numel() * p.element_size() for p in model.parameters())
        assert boundary is not None and boundary.memory_boundary_bytes is not None
        assert boundary.memory_peak_bytes is not None
        assert state_bytes <= boundary.memory_boundary_bytes < boundary.memory_peak_bytes
        before = [t.cpu() for t in [*model.parameters(), *opt.state_dict()["state"][0].values()]]
        allocated_while_parked: list[int] = []

        def resume_when_parked() -> None:
            wait_for(lambda: job.is_parked, what="the park")
            allocated_while_parked.append(torch.cuda.memory_allocated())
            job.resume()

        resumer = threading.Thread(target=resume_when_parked, daemon=True)
        resumer.start()
        job.request_suspend("park")
        gq.step()
        resumer.join()
        assert allocated_while_parked[0] < boundary.memory_boundary_bytes // 100
        assert job.suspends[0].bytes >= state_bytes
        after = [t.cpu() for t in [*model.parameters(), *opt.state_dict()["state"][0].values()]]
        assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        assert all(p.is_cuda for p in model.parameters())
    finally:
        job.close()
