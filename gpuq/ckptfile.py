"""The checkpoint file's header, readable without torch: enough to check a copy.

A checkpoint is ``ckpt-<step>.pt``: a 52-byte header (magic, format
version, payload length, SHA-256 of the payload), then the payload
(`gpuq.runner.checkpoint` writes and loads it). A daemon copying
checkpoints to another server checks each file against its own header
(`verify`: every byte through SHA-256) at the source while rsync sends it,
and the copy's headers and lengths at the target (`verify(path, digest=False)`:
rsync checks the transfer itself), with the standard library only.
"""

from __future__ import annotations

import hashlib
import os
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


def verify(path: Path, digest: bool = True) -> str | None:
    """None if the file's payload matches its header, else what is wrong with it.

    Without `digest`, only the header and the payload's length are checked
    (a file cut short, or not a checkpoint), not its SHA-256.
    """
    try:
        with path.open("rb") as handle:
            head = handle.read(HEADER.size)
            if len(head) < HEADER.size:
                return f"{path.name}: shorter than its header"
            magic, version, length, expected = HEADER.unpack(head)
            if magic != MAGIC or version != VERSION:
                return f"{path.name}: not a gpuq checkpoint (version {version})"
            hasher = hashlib.sha256()
            seen = 0
            if digest:
                while chunk := handle.read(_CHUNK):
                    hasher.update(chunk)
                    seen += len(chunk)
            else:
                seen = os.fstat(handle.fileno()).st_size - HEADER.size
    except OSError as exc:
        return f"{path.name}: {exc.strerror or exc}"
    if seen != length:
        return f"{path.name}: {seen} bytes of payload, its header says {length}"
    if digest and hasher.digest() != expected:
        return f"{path.name}: its SHA-256 does not match its header"
    return None


def verify_dir(directory: Path, digest: bool = True) -> list[str]:
    """What is wrong with the checkpoint files in `directory` (empty: all sound)."""
    problems = []
    for path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if NAME.match(path.name):
            problem = verify(path, digest)
            if problem is not None:
                problems.append(problem)
    return problems
