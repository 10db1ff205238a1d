"""Checkpoint files: atomic writes, a verified format, the newest two kept.

A checkpoint is ``ckpt-<step>.pt`` in the checkpoint directory: a 52-byte
header, then a `torch.save` payload (a dict with at least ``"step"``):

    magic     8 bytes   b"GPUQCKPT"
    version   uint32    big-endian, currently 1
    length    uint64    big-endian, bytes of payload that follow
    sha256    32 bytes  digest of the payload

A file counts only when the magic, the version, the file size and the digest
all agree, and the payload's step matches the file name.

Writing goes to a temporary file in the same directory, which is fsynced,
renamed into place with `os.replace` and followed by an fsync of the
directory. Only then are older checkpoints pruned, so at every instant the
previous complete checkpoint is on disk: a SIGKILL at any point leaves the old
set or the new one, plus perhaps a temporary file that the next save or load
deletes. Loading takes the newest valid file. A newer file that is damaged
(truncated, flipped bytes) is renamed to ``*.corrupt``, logged, and the next
older one is used.

Payloads are loaded with ``torch.load(weights_only=True)``: what a `State`
saves must be tensors, numbers, strings, None and lists, tuples or dicts of
these (true of every state_dict that PyTorch's own modules, optimizers, LR
schedulers and AMP scalers produce). The payload is held in memory once while
loading.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch

from gpuq import ckptfile
from gpuq.errors import StateError

log = logging.getLogger("gpuq.runner")

MAGIC = ckptfile.MAGIC
VERSION = ckptfile.VERSION
HEADER = ckptfile.HEADER
KEEP = 2
"""Complete checkpoints kept: the newest and the one before it."""

_NAME = ckptfile.NAME
_TEMPORARY = re.compile(r"^\.ckpt-\d+\.pt\.tmp-(\d+)$")


class CheckpointError(StateError):
    """No checkpoint can be written, or none of the existing ones can be read."""


class CorruptCheckpoint(CheckpointError):
    """One checkpoint file is incomplete or damaged."""


@dataclass(frozen=True)
class WrittenCheckpoint:
    """A checkpoint now complete on disk."""

    path: Path
    step: int
    bytes: int
    """Size of the file, header included."""
    sha256: str
    seconds: float
    """Time to serialise, write, fsync and rename."""


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint and its payload (tensors on the CPU)."""

    path: Path
    step: int
    payload: dict[str, Any]


def checkpoint_path(directory: Path, step: int) -> Path:
    """Where the checkpoint taken after `step` completed iterations lives."""
    return directory / f"ckpt-{step}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """The checkpoint files in `directory` as (step, path), newest first."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


class _HashingWriter:
    """A write-only file object that also hashes and counts what passes through."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.digest = hashlib.sha256()
        self.length = 0

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        self.length += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def write_checkpoint(directory: Path, step: int, payload: Mapping[str, Any]) -> WrittenCheckpoint:
    """Write `payload` atomically as the checkpoint for `step`, then prune old ones."""
    directory.mkdir(parents=True, exist_ok=True)
    remove_temporaries(directory)
    written = write_file(checkpoint_path(directory, step), step, payload)
    _prune(directory, step)
    return written


def write_file(path: Path, step: int, payload: Mapping[str, Any]) -> WrittenCheckpoint:
    """Write `payload` to `path` atomically: temporary file, fsync, rename, fsync of the dir."""
    start = time.perf_counter()
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as file:
            file.write(bytes(HEADER.size))  # zeros: invalid until the real header lands
            writer = _HashingWriter(file)
            torch.save(dict(payload), cast(IO[bytes], writer))  # it only calls write()
            file.seek(0)
            file.write(HEADER.pack(MAGIC, VERSION, writer.length, writer.digest.digest()))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        _fsync_directory(path.parent)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise CheckpointError(
            f"cannot write checkpoint {path}: {exc}",
            hint="check free space and permissions of the checkpoint directory",
        ) from exc
    return WrittenCheckpoint(
        path=path,
        step=step,
        bytes=HEADER.size + writer.length,
        sha256=writer.digest.hexdigest(),
        seconds=time.perf_counter() - start,
    )


def read_checkpoint(path: Path) -> dict[str, Any]:
    """Read and verify one checkpoint file; raise `CorruptCheckpoint` if it is damaged."""
    try:
        with open(path, "rb") as file:
            header = file.read(HEADER.size)
            if len(header) < HEADER.size:
                raise CorruptCheckpoint(f"{path}: truncated header")
            magic, version, length, digest = HEADER.unpack(header)
            if magic != MAGIC:
                raise CorruptCheckpoint(f"{path}: not a gpuq checkpoint (bad magic)")
            if version != VERSION:
                raise CorruptCheckpoint(
                    f"{path}: format version {version}, this gpuq reads {VERSION}",
                    hint="resume with the gpuq version that wrote it",
                )
            payload = file.read(length + 1)
    except OSError as exc:
        raise CorruptCheckpoint(f"{path}: cannot read: {exc}") from exc
    if len(payload) != length:
        raise CorruptCheckpoint(f"{path}: {len(payload)} payload bytes, header says {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint(f"{path}: checksum mismatch")
    try:
        loaded = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: intact, but holds objects torch.load(weights_only=True) refuses: {exc}",
            hint="keep State contents to tensors, numbers, strings and containers of these",
        ) from exc
    if not isinstance(loaded, dict):
        raise CorruptCheckpoint(f"{path}: payload is a {type(loaded).__name__}, not a dict")
    return loaded


def load_latest(directory: Path) -> LoadedCheckpoint | None:
    """The newest valid checkpoint in `directory`, or None when there is none.

    Damaged newer files are renamed to ``*.corrupt``. If files exist but none
    is valid, raise `CheckpointError` rather than silently start over.
    """
    remove_temporaries(directory)
    damaged: list[tuple[Path, str]] = []
    for step, path in list_checkpoints(directory):
        try:
            payload = _read_step(path, step)
        except CorruptCheckpoint as exc:
            damaged.append((path, str(exc)))
            continue
        for bad, reason in damaged:
            log.warning("gpuq.runner: using %s; damaged newer checkpoint: %s", path.name, reason)
            bad.replace(bad.with_name(bad.name + ".corrupt"))
        return LoadedCheckpoint(path=path, step=step, payload=payload)
    if damaged:
        raise CheckpointError(
            f"no valid checkpoint in {directory}: " + "; ".join(reason for _, reason in damaged),
            hint="move the damaged files away to start the job from scratch",
        )
    return None


def _read_step(path: Path, step: int) -> dict[str, Any]:
    payload = read_checkpoint(path)
    if payload.get("step") != step:
        raise CorruptCheckpoint(f"{path}: holds step {payload.get('step')!r}")
    return payload


def remove_temporaries(directory: Path) -> None:
    """Delete partial checkpoints left by processes killed while writing."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        match = _TEMPORARY.match(path.name)
        if match and int(match.group(1)) != os.getpid():
            path.unlink(missing_ok=True)


def _prune(directory: Path, newest: int) -> None:
    """Keep `newest` and the checkpoint before it; drop older ones and abandoned later ones.

    A checkpoint with a higher step than the one just written belongs to a
    timeline the job has left (it restarted from an older one), so it goes too.
    """
    checkpoints = list_checkpoints(directory)
    previous = [path for step, path in checkpoints if step < newest][: KEEP - 1]
    for step, path in checkpoints:
        if step != newest and path not in previous:
            path.unlink(missing_ok=True)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
