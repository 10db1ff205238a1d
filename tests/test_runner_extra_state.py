"""State outside the model and optimizer: dicts of values in the checkpoint, and the warning.

A dict given to `gq.State` is saved with the checkpoint and restored in place
(`gpuq.runner.state`). A step counter that the script keeps itself, and that
starts from 0 again on a resume, draws a `gq.ResumeWarning` when the resumed
loop ends or suspends (`gpuq.runner.loop`). Suspends are real: each attempt
runs inside gpuq in this process, is asked to suspend at a step, and exits
with SystemExit(SUSPEND_EXIT_CODE); the next attempt restores.
"""

from __future__ import annotations

import math
import os
import re
import runpy
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import gpuq.runner as gq
from gpuq.runner.job import Job
from tests.test_runner_equivalence import assert_bitwise_equal

pytestmark = [pytest.mark.torch]

ROOT = Path(__file__).resolve().parents[1]
EPOCHS, STEPS_PER_EPOCH = 4, 8


@pytest.fixture(autouse=True)
def no_open_job(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No GPUQ_* variables and no job handle left open, before and after each test."""
    for name in [n for n in os.environ if n.startswith("GPUQ_")]:
        monkeypatch.delenv(name)
    gq.init(environ={}).close()
    yield
    gq.init(environ={}).close()


def attempt(directory: Path, number: int, suspend_at: int | None) -> Job:
    """The job handle of one attempt inside gpuq, asked to suspend at step `suspend_at`."""
    gq.init(environ={}).close()
    environ = {"GPUQ_JOB_ID": "4", "GPUQ_CHECKPOINT_DIR": str(directory)}
    job = gq.init(environ=environ | {"GPUQ_ATTEMPT": str(number)})
    job.add_step_hook(lambda info: job.request_suspend() if info.step == suspend_at else None)
    return job


def suspended(run: Callable[[], Any]) -> None:
    """Run an attempt that must end in a checkpoint suspend."""
    with pytest.raises(SystemExit) as exit_:
        run()
    assert exit_.value.code == gq.SUSPEND_EXIT_CODE


@contextmanager
def no_resume_warning() -> Iterator[None]:
    """A block in which a ResumeWarning is an error (pytest makes every warning one anyway)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", gq.ResumeWarning)
        yield


# --- the training functions: each keeps its count in its own way -------------------------


def setup(**extra: Any) -> tuple[nn.Module, torch.optim.Optimizer, gq.AdaptiveDataLoader]:
    """A tiny model, its State (with `extra`) restored if a checkpoint exists, and its data."""
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gq.State(model=model, optimizer=opt, **extra).restore()
    data = TensorDataset(torch.randn(4 * STEPS_PER_EPOCH, 2))
    return model, opt, gq.AdaptiveDataLoader(data, batch_size=4)


def learn(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def counts_before_the_boundary() -> int:
    """The common mistake: its own step counter, increased before gq.step()."""
    model, opt, loader = setup()
    global_step = 0
    for _ in gq.epochs(EPOCHS):
        for (x,) in loader:
            learn(model, opt, x)
            global_step += 1
            gq.step()
    return global_step


def counts_after_the_boundary() -> int:
    """The same mistake, the counter increased after gq.step()."""
    model, opt, loader = setup()
    global_step = 0
    for _ in gq.epochs(EPOCHS):
        for (x,) in loader:
            learn(model, opt, x)
            gq.step()
            global_step += 1
    return global_step


def counts_in_the_state() -> int:
    """The counter registered: kept in a dict the checkpoint holds."""
    progress = {"global_step": 0}
    model, opt, loader = setup(progress=progress)
    for _ in gq.epochs(EPOCHS):
        for (x,) in loader:
            learn(model, opt, x)
            progress["global_step"] += 1
            gq.step()
    return progress["global_step"]


def counts_locally_from_the_state() -> int:
    """The registered counter read into a variable after the restore, and written back."""
    progress = {"global_step": 0}
    model, opt, loader = setup(progress=progress)
    global_step = progress["global_step"]
    for _ in gq.epochs(EPOCHS):
        for (x,) in loader:
            learn(model, opt, x)
            global_step += 1
            progress["global_step"] = global_step
            gq.step()
    return global_step


def counts_with_job_step() -> int:
    """A variable that follows the runner's count (as examples/runner_transformer does)."""
    job = gq.init()
    model, opt, loader = setup()
    steps = 0
    for _ in gq.epochs(EPOCHS):
        for (x,) in loader:
            learn(model, opt, x)
            gq.step()
            steps = job.step
    return steps


def counts_batches_of_each_epoch() -> int:
    """Per-epoch batch indices, one set before the loop and reset each epoch."""
    model, opt, loader = setup()
    batch = 0
    for _ in gq.epochs(EPOCHS):
        batch = 0
        for index, (x,) in enumerate(loader):
            learn(model, opt, x)
            batch = index + 1
            gq.step()
    return batch


# --- dicts of values in the checkpoint -----------------------------------------------------


def test_a_dict_of_values_is_saved_and_restored_into_the_same_dict(tmp_path: Path) -> None:
    hidden = torch.randn(3, requires_grad=True) * 2  # part of a graph, as an RNN leaves it
    progress = {"best_loss": 0.25, "bad_epochs": 2, "history": [0.5, 0.25], "hidden": hidden}
    gq.State(model=nn.Linear(2, 1), progress=progress).save(tmp_path / "ckpt.pt")
    gq.init(environ={}).close()

    fresh: dict[str, Any] = {"best_loss": math.inf, "bad_epochs": 0, "added_later": 7}
    fresh |= {"history": [], "hidden": torch.zeros(3)}
    gq.State(model=nn.Linear(2, 1), progress=fresh).load(tmp_path / "ckpt.pt")
    assert fresh["best_loss"] == 0.25 and fresh["bad_epochs"] == 2
    assert fresh["history"] == [0.5, 0.25]
    assert torch.equal(fresh["hidden"], hidden.detach()) and not fresh["hidden"].requires_grad
    assert fresh["added_later"] == 7  # not in the checkpoint: keeps its value


def test_a_restored_tensor_goes_to_the_device_of_the_one_it_replaces(tmp_path: Path) -> None:
    gq.State(carry={"hidden": torch.ones(2), "none": torch.ones(2)}).save(tmp_path / "c.pt")
    gq.init(environ={}).close()
    carry: dict[str, Any] = {"hidden": torch.zeros(2, device="meta"), "none": None}
    gq.State(carry=carry).load(tmp_path / "c.pt")  # meta: a second device every machine has
    assert carry["hidden"].device.type == "meta" and carry["none"].device.type == "cpu"


@pytest.mark.parametrize(
    ("value", "where"),
    [
        (np.float64(0.5), "progress['best']"),
        (object(), "progress['best']"),
        ([1.0, {2.0}], "progress['best'][1]"),
        ({"inner": np.int64(3)}, "progress['best']['inner']"),
    ],
    ids=["numpy-scalar", "object", "set-in-a-list", "numpy-in-a-dict"],
)
def test_values_a_checkpoint_cannot_hold_are_refused_when_the_state_is_made(
    value: Any, where: str
) -> None:
    with pytest.raises(gq.RunnerError, match=re.escape(f"{where} is a ")) as error:
        gq.State(model=nn.Linear(2, 1), progress={"best": value})
    assert error.value.hint is not None and "float(x)" in error.value.hint


def test_a_value_that_becomes_unsaveable_is_refused_at_the_save(tmp_path: Path) -> None:
    progress: dict[str, Any] = {"best": 0.5}
    state = gq.State(model=nn.Linear(2, 1), progress=progress)
    progress["best"] = np.float64(0.25)  # e.g. the result of a NumPy computation
    with pytest.raises(gq.RunnerError, match="numpy.float64|float64"):
        state.save(tmp_path / "ckpt.pt")
    assert list(tmp_path.iterdir()) == []  # no checkpoint that could not be read back


def test_a_plain_value_outside_a_dict_is_refused_with_a_hint_to_use_one() -> None:
    with pytest.raises(gq.RunnerError, match="no state_dict") as error:
        gq.State(model=nn.Linear(2, 1), best_loss=0.5)
    assert error.value.hint is not None and "dict" in error.value.hint


def test_a_registered_counter_survives_suspends(tmp_path: Path) -> None:
    for number, step in enumerate([5, 13], start=1):
        attempt(tmp_path, number, suspend_at=step)
        suspended(counts_in_the_state)
    attempt(tmp_path, 3, suspend_at=None)
    with no_resume_warning():
        assert counts_in_the_state() == EPOCHS * STEPS_PER_EPOCH


# --- the warning about counters that restart ---------------------------------------------


@pytest.mark.parametrize("train", [counts_before_the_boundary, counts_after_the_boundary])
def test_a_resumed_run_that_keeps_its_own_counter_is_warned_when_it_ends(
    tmp_path: Path, train: Callable[[], int]
) -> None:
    attempt(tmp_path, 1, suspend_at=5)
    suspended(train)
    attempt(tmp_path, 2, suspend_at=None)
    with pytest.warns(gq.ResumeWarning) as caught:
        counted = train()
    assert counted == EPOCHS * STEPS_PER_EPOCH - 5  # what the warning is about
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"global_step in {train.__name__}() counted steps from 0" in message
    assert "resume at step 5" in message and "job.step" in message and "gq.State" in message
    assert caught[0].filename == __file__  # it points at the script's loop


@pytest.mark.parametrize("train", [counts_before_the_boundary, counts_after_the_boundary])
def test_a_resumed_run_that_keeps_its_own_counter_is_warned_when_it_suspends_again(
    tmp_path: Path, train: Callable[[], int]
) -> None:
    attempt(tmp_path, 1, suspend_at=5)
    suspended(train)
    attempt(tmp_path, 2, suspend_at=19)  # in epoch 2: epochs began at steps 8 and 16
    with pytest.warns(gq.ResumeWarning, match="resume at step 5"):
        suspended(train)
    assert (tmp_path / "ckpt-19.pt").exists()  # the suspend itself went through


def test_a_fresh_run_is_never_warned(tmp_path: Path) -> None:
    with no_resume_warning():
        assert counts_before_the_boundary() == EPOCHS * STEPS_PER_EPOCH  # outside gpuq
        gq.init(environ={}).close()
        attempt(tmp_path, 1, suspend_at=20)  # inside gpuq, a first attempt: nothing restored
        suspended(counts_before_the_boundary)


@pytest.mark.parametrize(
    "train",
    [
        counts_in_the_state,
        counts_locally_from_the_state,
        counts_with_job_step,
        counts_batches_of_each_epoch,
    ],
)
def test_counts_restored_or_restarted_each_epoch_are_not_warned(
    tmp_path: Path, train: Callable[[], int]
) -> None:
    attempt(tmp_path, 1, suspend_at=5)
    suspended(train)
    attempt(tmp_path, 2, suspend_at=None)
    with no_resume_warning():
        assert train() == (8 if train is counts_batches_of_each_epoch else 32)


@pytest.mark.parametrize(
    ("train", "first_suspend", "second_suspend"),
    [
        (counts_before_the_boundary, 5, 7),
        (counts_before_the_boundary, 2, None),
        (counts_batches_of_each_epoch, 7, 12),
    ],
    ids=[
        "the-run-stays-in-one-epoch",
        "restored-below-step-3",
        "a-batch-index-when-an-epoch-began-one-step-in",
    ],
)
def test_runs_where_a_restarted_counter_cannot_be_told_apart_are_not_warned(
    tmp_path: Path, train: Callable[[], int], first_suspend: int, second_suspend: int | None
) -> None:
    attempt(tmp_path, 1, suspend_at=first_suspend)
    suspended(train)
    attempt(tmp_path, 2, suspend_at=second_suspend)
    with no_resume_warning():
        if second_suspend is None:
            train()
        else:
            suspended(train)


# --- the example -------------------------------------------------------------------------


@pytest.fixture
def mlp_example(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[list[str]], None]]:
    """examples/runner_mlp's main(), with torch's global settings put back afterwards."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what --deterministic sets
    deterministic, threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    yield runpy.run_path(str(ROOT / "examples" / "runner_mlp" / "train.py"))["main"]
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)


def test_the_mlp_example_stops_early_at_the_same_step_after_suspends(
    tmp_path: Path, mlp_example: Callable[[list[str]], None], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--samples", "512", "--epochs", "12", "--patience", "1", "--deterministic"]
    argv += ["--log-every", "0"]
    mlp_example([*argv, "--out", str(tmp_path / "reference.pt")])
    reference = capsys.readouterr().out
    assert "stopping: no better accuracy since epoch 4" in reference  # at step 48 of 96

    checkpoints = tmp_path / "ckpt"
    for number, step in enumerate([20, 44], start=1):  # the second in the deciding epoch
        attempt(checkpoints, number, suspend_at=step)
        suspended(lambda: mlp_example(argv))
    attempt(checkpoints, 3, suspend_at=None)
    with no_resume_warning():
        mlp_example([*argv, "--out", str(tmp_path / "resumed.pt")])
    resumed = capsys.readouterr().out
    assert resumed.splitlines()[-2:] == reference.splitlines()[-2:]
    assert torch.load(tmp_path / "resumed.pt")["progress"]["best_epoch"] == 4
    assert_bitwise_equal(tmp_path / "reference.pt", tmp_path / "resumed.pt")
