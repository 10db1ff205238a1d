"""A job's checkpoints arriving from another server: a temporary name, checked, then renamed.

`prepare` makes an empty ``checkpoints.incoming`` beside the job's
``checkpoints`` for rsync to fill; `commit` checks that the checkpoint the
job said it saved (``suspended.json``) arrived, and every checkpoint file
against its own header (`gpuq.ckptfile`: its SHA-256, or with `checked`,
where the sender checked it at the source while rsync copied it, its
header and length), and only then puts the
directory in place of ``checkpoints``, whose previous content (an
earlier stay of the job on this server) goes. A copy cut off midway, or
damaged, never replaces anything. A safety copy (`gpuq.daemon.safety`)
arrives the same way under a name of its own (``checkpoints.safety``), so
it never mixes with a migration's copy.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from gpuq import ckptfile
from gpuq.control import ACK_FILE
from gpuq.daemon import jobfiles
from gpuq.errors import StateError

INCOMING = f"{jobfiles.CHECKPOINTS}.incoming"
SAFETY = f"{jobfiles.CHECKPOINTS}.safety"
_OLD = f"{jobfiles.CHECKPOINTS}.old"


def prepare(job_dir: Path, arrived: str = INCOMING) -> Path:
    """An empty directory for the job's arriving checkpoints (named `arrived`); its path."""
    incoming = job_dir / arrived
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir(parents=True, mode=0o700)
    return incoming


def commit(job_dir: Path, checked: bool = False, arrived: str = INCOMING) -> dict[str, Any]:
    """Check what arrived and put it in place; StateError (nothing replaced) if it is unsound."""
    incoming = job_dir / arrived
    if not incoming.is_dir():
        raise StateError("no checkpoints arrived", "the copy did not run, or it was cut off")
    problems = ckptfile.verify_dir(incoming, digest=not checked) + _missing(incoming)
    if problems:
        shutil.rmtree(incoming, ignore_errors=True)
        raise StateError(
            f"the copied checkpoints are unsound: {'; '.join(problems)}",
            "the copy is discarded; the job stays where its checkpoint is sound",
        )
    files = [p for p in incoming.iterdir() if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    current, old = job_dir / jobfiles.CHECKPOINTS, job_dir / _OLD
    shutil.rmtree(old, ignore_errors=True)
    if current.exists():
        current.rename(old)
    incoming.rename(current)
    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # the rename survives a crash
    finally:
        os.close(fd)
    shutil.rmtree(old, ignore_errors=True)
    checkpoints = sum(1 for p in files if ckptfile.NAME.match(p.name))
    return {"files": len(files), "checkpoints": checkpoints, "bytes": size}


def _missing(incoming: Path) -> list[str]:
    """What the copy lacks: the acknowledgement of the job's checkpoint, or that checkpoint.

    The job said which step it saved when it suspended (``suspended.json``);
    a copy without that checkpoint file (an empty one above all: rsync
    writing somewhere else) must not pass for it.
    """
    ack = jobfiles.read_json(incoming / ACK_FILE)
    step = None if ack is None else ack.get("step")
    if not isinstance(step, int) or isinstance(step, bool):
        return [f"no {ACK_FILE} naming the checkpoint the job saved"]
    if not (incoming / f"ckpt-{step}.pt").is_file():
        return [f"ckpt-{step}.pt, the checkpoint the job saved, did not arrive"]
    return []


def safety_copy(job_dir: Path) -> dict[str, Any] | None:
    """The record of the safety copy in the job's checkpoints here, if they are one.

    `gpuq.daemon.safety` writes it (``suspended.json`` with mode ``copy``:
    the step, the server and attempt it came from, when); None when the
    checkpoints here are not such a copy, or its checkpoint file is gone.
    """
    checkpoints = job_dir / jobfiles.CHECKPOINTS
    record = jobfiles.read_json(checkpoints / ACK_FILE)
    if record is None or record.get("mode") != "copy":
        return None
    step = record.get("step")
    if not isinstance(step, int) or not (checkpoints / f"ckpt-{step}.pt").is_file():
        return None
    return record
