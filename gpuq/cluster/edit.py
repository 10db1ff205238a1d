"""Add a server to the config file: a `[[cluster.servers]]` table appended, checked, atomic.

The file is the user's own, with their comments and layout: it is never
rewritten from parsed data, only extended by one table at its end. The
result is loaded again before it replaces the old file (temporary file,
fsync, rename), so a file that would not load is never left behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from gpuq.config import ServerDecl, load_config
from gpuq.errors import ConfigError, ConflictError


def server_table(server: ServerDecl) -> str:
    """The TOML text of `server` (strings written as JSON strings, valid TOML basic strings)."""
    lines = ["[[cluster.servers]]", f"host = {json.dumps(server.host)}"]
    if server.gpus:
        lines.append(f"gpus = [{', '.join(json.dumps(g) for g in server.gpus)}]")
    if server.labels:
        lines.append(f"labels = [{', '.join(json.dumps(label) for label in server.labels)}]")
    if server.command != ServerDecl(server.host).command:
        lines.append(f"command = {json.dumps(server.command)}")
    return "\n".join(lines) + "\n"


def append_server(path: Path, server: ServerDecl) -> None:
    """Append `server` to the config file at `path` (created if absent); refuse a duplicate host."""
    try:
        old = path.read_text()
    except FileNotFoundError:
        old = ""
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    if old:
        current = load_config(str(path), environ={})
        if any(s.host == server.host for s in current.cluster.servers):
            raise ConflictError(
                f"{server.host} is already a server of {path}",
                "edit its [[cluster.servers]] table there to change it",
            )
    separator = "" if not old or old.endswith("\n\n") else ("\n" if old.endswith("\n") else "\n\n")
    text = old + separator + server_table(server)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o777)
        load_config(temporary, environ={})  # the new file must load before it replaces the old
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
