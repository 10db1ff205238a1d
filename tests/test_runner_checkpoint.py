"""Checkpoint files, State and the resumable data loader, one process, no subprocesses.

The file format and crash-safety rules are in `gpuq.runner.checkpoint`; what a
State saves is in `gpuq.runner.state`; the loader position in `gpuq.runner.data`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import gpuq.runner as gq
from gpuq.runner import checkpoint
from gpuq.runner.job import Job

pytestmark = [pytest.mark.torch]


@pytest.fixture
def job(monkeypatch: pytest.MonkeyPatch) -> Iterator[Job]:
    """A fresh job handle outside gpuq (closed afterwards, so tests do not share steps)."""
    for name in [n for n in os.environ if n.startswith("GPUQ_")]:
        monkeypatch.delenv(name)
    gq.init(environ={}).close()
    handle = gq.init(environ={})
    yield handle
    handle.close()


def payload(step: int, size: int = 1000) -> dict[str, Any]:
    return {"step": step, "weights": torch.arange(size, dtype=torch.float32) * step}


def header_of(path: Path) -> tuple[bytes, int, int, bytes]:
    magic, version, length, digest = checkpoint.HEADER.unpack(
        path.read_bytes()[: checkpoint.HEADER.size]
    )
    return magic, version, length, digest


# --- the file format ---------------------------------------------------------------------


def test_a_checkpoint_is_a_header_and_a_torch_payload_with_its_sha256(tmp_path: Path) -> None:
    written = checkpoint.write_checkpoint(tmp_path, 7, payload(7))
    raw = written.path.read_bytes()
    magic, version, length, digest = header_of(written.path)
    body = raw[checkpoint.HEADER.size :]
    assert (written.path.name, magic, version) == ("ckpt-7.pt", b"GPUQCKPT", 1)
    assert length == len(body) and written.bytes == len(raw)
    assert digest == hashlib.sha256(body).digest() and written.sha256 == digest.hex()
    loaded = checkpoint.read_checkpoint(written.path)
    assert loaded["step"] == 7 and torch.equal(loaded["weights"], payload(7)["weights"])


def test_writing_leaves_no_temporary_file_and_keeps_the_newest_two(tmp_path: Path) -> None:
    for step in range(1, 6):
        checkpoint.write_checkpoint(tmp_path, step, payload(step))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-4.pt", "ckpt-5.pt"]


def test_a_restart_from_an_older_checkpoint_drops_the_abandoned_newer_ones(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        checkpoint.write_checkpoint(tmp_path, step, payload(step))
    checkpoint.write_checkpoint(tmp_path, 25, payload(25))
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [25, 20]


def test_partial_writes_of_dead_processes_are_removed(tmp_path: Path) -> None:
    checkpoint.write_checkpoint(tmp_path, 1, payload(1))
    stale = tmp_path / ".ckpt-2.pt.tmp-999999999"
    stale.write_bytes(b"half a checkpoint")
    found = checkpoint.load_latest(tmp_path)
    assert found is not None and found.step == 1
    assert not stale.exists()


def truncate_to_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def truncate_inside_header(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:20])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def flip_payload_byte(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(bytes(raw))


def flip_magic(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    raw[0] ^= 0xFF
    path.write_bytes(bytes(raw))


def append_garbage(path: Path) -> None:
    with open(path, "ab") as file:
        file.write(b"\0" * 10)


def claim_another_step(path: Path) -> None:
    path.rename(path.with_name("ckpt-3.pt"))  # a valid file under the wrong name


@pytest.mark.parametrize(
    "damage",
    [
        truncate_to_half,
        truncate_inside_header,
        empty,
        flip_payload_byte,
        flip_magic,
        append_garbage,
        claim_another_step,
    ],
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    tmp_path: Path, damage: Callable[[Path], None], caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint.write_checkpoint(tmp_path, 1, payload(1))
    newest = checkpoint.write_checkpoint(tmp_path, 2, payload(2)).path
    damage(newest)
    with caplog.at_level(logging.WARNING, logger="gpuq.runner"):
        found = checkpoint.load_latest(tmp_path)
    assert found is not None and found.step == 1
    assert torch.equal(found.payload["weights"], payload(1)["weights"])
    assert "damaged newer checkpoint" in caplog.text
    assert [p.name for p in tmp_path.glob("*.corrupt")] != []  # kept aside, not deleted
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [1]


def test_only_damaged_checkpoints_is_an_error_not_a_silent_fresh_start(tmp_path: Path) -> None:
    flip_payload_byte(checkpoint.write_checkpoint(tmp_path, 1, payload(1)).path)
    with pytest.raises(checkpoint.CheckpointError, match="no valid checkpoint") as error:
        checkpoint.load_latest(tmp_path)
    assert error.value.hint is not None
    assert (tmp_path / "ckpt-1.pt").exists()


def test_no_checkpoint_directory_or_an_empty_one_means_a_fresh_start(tmp_path: Path) -> None:
    assert checkpoint.load_latest(tmp_path / "missing") is None
    assert checkpoint.load_latest(tmp_path) is None


# --- State -------------------------------------------------------------------------------


def make_training(seed: int) -> tuple[nn.Module, Any, Any, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return model, opt, sched, scaler


def train_one_step(model: nn.Module, opt: Any, sched: Any) -> None:
    loss = model(torch.randn(16, 4)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()


def test_state_restores_every_object_rng_and_progress(job: Job, tmp_path: Path) -> None:
    model, opt, sched, scaler = make_training(seed=0)
    objects = {"model": model, "optimizer": opt, "lr_scheduler": sched, "scaler": scaler}
    state = gq.State(**objects, checkpoint_dir=tmp_path)
    for _ in range(3):
        train_one_step(model, opt, sched)
        gq.step()
    job.epoch = 1
    state.save()
    saved_schedule = sched.state_dict()
    expected_draws = (random.random(), np.random.rand(), torch.rand(3))
    train_one_step(model, opt, sched)
    expected = model.state_dict()
    job.close()

    resumed = gq.init(environ={})
    model, opt, sched, scaler = make_training(seed=1)  # another init: restore must win
    objects = {"model": model, "optimizer": opt, "lr_scheduler": sched, "scaler": scaler}
    state = gq.State(**objects, checkpoint_dir=tmp_path)
    assert state.restore() and state.restored_from == tmp_path / "ckpt-3.pt"
    assert (resumed.step, resumed.epoch) == (3, 1)
    assert sched.state_dict() == saved_schedule and scaler.get_scale() == 1024.0
    draws = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[:2] == expected_draws[:2] and torch.equal(draws[2], expected_draws[2])
    train_one_step(model, opt, sched)
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())


def test_state_refuses_objects_it_cannot_checkpoint(job: Job) -> None:
    with pytest.raises(gq.RunnerError, match="best_accuracy"):
        gq.State(model=nn.Linear(2, 2), best_accuracy=0.5)


def test_outside_gpuq_restore_is_a_no_op_and_save_needs_a_place(job: Job, tmp_path: Path) -> None:
    state = gq.State(model=nn.Linear(2, 2))
    assert state.checkpoint_dir is None and state.restore() is False
    with pytest.raises(gq.RunnerError, match="no checkpoint directory"):
        state.save()
    written = state.save(tmp_path / "by-hand.pt")
    assert checkpoint.read_checkpoint(written.path)["step"] == 0


def test_a_checkpoint_missing_an_object_is_refused_with_a_hint(job: Job, tmp_path: Path) -> None:
    gq.State(model=nn.Linear(2, 2), checkpoint_dir=tmp_path).save()
    state = gq.State(model=nn.Linear(2, 2), ema=nn.Linear(2, 2), checkpoint_dir=tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match="no state for ema") as error:
        state.restore()
    assert error.value.hint is not None


# --- the data loader ---------------------------------------------------------------------


def dataset(size: int = 10) -> TensorDataset:
    return TensorDataset(torch.arange(size))


def batches(loader: Any) -> list[list[int]]:
    """One whole pass, as lists of sample ids."""
    return [batch.tolist() for (batch,) in loader]


def take(iterator: Iterator[Any], count: int) -> list[list[int]]:
    """`count` batches from a pass that stays in progress (the loop is still running)."""
    return [next(iterator)[0].tolist() for _ in range(count)]


def test_each_pass_is_a_seeded_permutation_that_differs_per_epoch(job: Job) -> None:
    loader = gq.AdaptiveDataLoader(dataset(), batch_size=3, seed=5)
    first, second = batches(loader), batches(loader)
    assert [len(b) for b in first] == [3, 3, 3, 1] and len(loader) == 4
    assert sorted(sum(first, [])) == list(range(10)) and first != second
    job.close()
    gq.init(environ={})
    again = gq.AdaptiveDataLoader(dataset(), batch_size=3, seed=5)
    assert (batches(again), batches(again)) == (first, second)


def test_a_restored_loader_continues_the_interrupted_pass_at_the_next_batch(job: Job) -> None:
    twin = gq.AdaptiveDataLoader(dataset(), batch_size=3, seed=1, name="uninterrupted")
    _, epoch_1, epoch_2 = batches(twin), batches(twin), batches(twin)
    loader = gq.AdaptiveDataLoader(dataset(), batch_size=3, seed=1)
    batches(loader)
    running = iter(loader)  # the loop of epoch 1 holds it
    assert take(running, 2) == epoch_1[:2]  # stopped after 2 of its 4 batches
    position = loader.state_dict()
    assert position == {"epoch": 1, "index": 6, "in_progress": True, "batch_size": 3}
    resumed = gq.AdaptiveDataLoader(dataset(), batch_size=3, seed=1, name="resumed")
    resumed.load_state_dict(position)
    assert batches(resumed) == epoch_1[2:]
    assert batches(resumed) == epoch_2


def test_a_pass_stopped_after_its_last_batch_resumes_as_an_empty_pass(job: Job) -> None:
    loader = gq.AdaptiveDataLoader(dataset(), batch_size=5, seed=2)
    running = iter(loader)
    take(running, 2)  # all of epoch 0, but the loop has not asked for more yet
    position = loader.state_dict()
    resumed = gq.AdaptiveDataLoader(dataset(), batch_size=5, seed=2, name="resumed")
    resumed.load_state_dict(position)
    assert batches(resumed) == [] and batches(resumed) == batches(loader)


def test_a_finished_or_abandoned_pass_is_followed_by_a_fresh_one(job: Job) -> None:
    twin = gq.AdaptiveDataLoader(dataset(), batch_size=4, seed=3, name="uninterrupted")
    _, _, epoch_2 = batches(twin), batches(twin), batches(twin)
    validation = gq.AdaptiveDataLoader(dataset(), batch_size=4, seed=3)
    batches(validation)  # a whole pass: the loop ended
    for _ in validation:
        break  # a pass abandoned by the loop
    assert validation.state_dict()["in_progress"] is False
    resumed = gq.AdaptiveDataLoader(dataset(), batch_size=4, seed=3, name="resumed")
    resumed.load_state_dict(validation.state_dict())
    assert batches(resumed) == epoch_2


def test_positions_restored_before_the_loader_exists_are_applied_when_it_is_made(
    job: Job, tmp_path: Path
) -> None:
    state = gq.State(model=nn.Linear(1, 1), checkpoint_dir=tmp_path)
    loader = gq.AdaptiveDataLoader(dataset(), batch_size=4)
    running = iter(loader)
    take(running, 1)
    state.save()
    job.close()
    gq.init(environ={})
    assert gq.State(model=nn.Linear(1, 1), checkpoint_dir=tmp_path).restore()
    later = gq.AdaptiveDataLoader(dataset(), batch_size=4)
    assert later.state_dict() == {"epoch": 0, "index": 4, "in_progress": True, "batch_size": 4}
    assert len(batches(later)) == 2  # the rest of epoch 0


def test_the_loader_draws_nothing_from_the_global_generator(job: Job) -> None:
    loader = gq.AdaptiveDataLoader(dataset(), batch_size=4)
    before = torch.get_rng_state()
    batches(loader)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"batch_size": 0}, "the batch size must be a whole number, 1 or more"),
        ({"batch_size": 3.5}, "the batch size must be a whole number"),
        ({"batch_size": float("nan")}, "the batch size must be a whole number"),
        ({"batch_size": True}, "the batch size must be a whole number"),
        ({"batch_size": 8, "max_batch_size": 4}, "the maximum must be a whole number, batch_size"),
        ({"batch_size": 8, "max_batch_size": 16.0}, "the maximum must be a whole number"),
        ({"batch_size": 2, "sampler": []}, r"AdaptiveDataLoader sets \['sampler'\]"),
    ],
)
def test_the_loader_rejects_settings_it_cannot_honour(
    job: Job, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(gq.RunnerError, match=message):
        gq.AdaptiveDataLoader(dataset(), **arguments)


def test_the_loader_takes_numpy_integers_as_batch_sizes(job: Job) -> None:
    sizes: dict[str, Any] = {"batch_size": np.int64(4), "max_batch_size": np.int32(8)}
    loader = gq.AdaptiveDataLoader(dataset(), **sizes)
    assert (type(loader.init_batch_size), type(loader.max_batch_size)) == (int, int)


@pytest.mark.parametrize("total", [-1, 2.0, float("nan"), "3"])
def test_epochs_takes_a_whole_number_of_epochs(job: Job, total: Any) -> None:
    with pytest.raises(gq.RunnerError, match="the number of epochs must be a whole number"):
        next(iter(gq.epochs(total)))


def test_the_loader_needs_a_dataset_with_a_length(job: Job) -> None:
    with pytest.raises(gq.RunnerError, match="map-style"):
        gq.AdaptiveDataLoader(torch.utils.data.DataLoader(dataset()), batch_size=2)
