"""The checkpoint file's header, readable without torch: enough to check a copy.

A checkpoint is ``ckpt-<step>.pt``: a 52-byte header (magic, format
version, payload length, SHA-256 of the payload), then the payload
(`gpuq.runner.checkpoint` writes and loads it). A daemon that copied
checkpoints to another server checks each file against its own header
(`verify`), with the standard library only.
"""

from __future__ import annotations

import hashlib
import re
import struct
from pathlib import Path
from typing import Final

MAGIC: Final = b"GPUQCKPT"
VERSION: Final = 1
HEADER: Final = struct.Struct(">8sIQ32s")
NAME: Final = re.compile(r"^ckpt-(\d+)\.pt$")
"""The name of a complete checkpoint file."""
_CHUNK = 4 * 1024 * 1024


def verify(path: Path) -> str | None:
    """None if the file's payload matches its header, else what is wrong with it."""
    try:
        with path.open("rb") as handle:
            head = handle.read(HEADER.size)
            if len(head) < HEADER.size:
                return f"{path.name}: shorter than its header"
            magic, version, length, digest = HEADER.unpack(head)
            if magic != MAGIC or version != VERSION:
                return f"{path.name}: not a gpuq checkpoint (version {version})"
            hasher = hashlib.sha256()
            seen = 0
            while chunk := handle.read(_CHUNK):
                hasher.update(chunk)
                seen += len(chunk)
    except OSError as exc:
        return f"{path.name}: {exc.strerror or exc}"
    if seen != length:
        return f"{path.name}: {seen} bytes of payload, its header says {length}"
    if hasher.digest() != digest:
        return f"{path.name}: its SHA-256 does not match its header"
    return None


def verify_dir(directory: Path) -> list[str]:
    """What is wrong with the checkpoint files in `directory` (empty: all sound)."""
    problems = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if NAME.match(path.name):
            problem = verify(path)
            if problem is not None:
                problems.append(problem)
    return problems
