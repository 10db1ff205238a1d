"""Add or remove a server in the config file: one `[[cluster.servers]]` table, checked, atomic.

The file is the user's own, with their comments and layout: it is never
rewritten from parsed data. Adding appends one table at its end; removing
deletes the lines of the one table whose host it names (from its header to
the next table's), and nothing else. The result is loaded again, and must
hold exactly the servers expected, before it replaces the old file
(temporary file, fsync, rename), so a file that would not load is never
left behind.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path

from gpuq.config import ServerDecl, load_config
from gpuq.errors import ConfigError, ConflictError, NotFoundError


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


def already_listed(host: str, path: Path) -> ConflictError:
    """The error for adding a server the config file at `path` already has."""
    return ConflictError(
        f"{host} is already a server of {path}",
        f"edit its [[cluster.servers]] table there, or gpuq cluster remove {host} first",
    )


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
            raise already_listed(server.host, path)
    separator = "" if not old or old.endswith("\n\n") else ("\n" if old.endswith("\n") else "\n\n")
    _replace(path, old + separator + server_table(server), lambda hosts: server.host in hosts)


def remove_server(path: Path, host: str) -> None:
    """Delete the `[[cluster.servers]]` table of `host` from the config file at `path`."""
    config = load_config(str(path), environ={})
    if not any(s.host == host for s in config.cluster.servers):
        known = ", ".join(s.host for s in config.cluster.servers) or "none"
        raise NotFoundError(f"{host} is not a server of {path}", f"its servers: {known}")
    lines = path.read_text().splitlines(keepends=True)
    start = end = None
    for i, line in enumerate(lines):
        header = _HEADER.match(line)
        if header and start is not None and end is None:
            end = i
        if header and header.group(1) == "[cluster.servers]" and start is None:
            block_end = next(
                (j for j in range(i + 1, len(lines)) if _HEADER.match(lines[j])), len(lines)
            )
            if any(_host_line(lines[j]) == host for j in range(i + 1, block_end)):
                start = i
    if start is None:
        raise ConfigError(
            f"cannot find the [[cluster.servers]] table of {host} in {path}",
            'remove it by hand (gpuq only edits tables written one per server, host = "...")',
        )
    end = len(lines) if end is None else end
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].lstrip()[:1] == "#"):
        end -= 1  # comments and blank lines just above the next table belong to it
    while start > 0 and lines[start - 1].lstrip().startswith("#"):
        start -= 1  # and so do the comments just above this one
    while start > 0 and not lines[start - 1].strip():  # the blank line that set it apart
        start -= 1
    text = "".join(lines[:start] + lines[end:])
    _replace(
        path,
        text,
        lambda hosts: host not in hosts and len(hosts) == len(config.cluster.servers) - 1,
    )


_HEADER = re.compile(r"\s*\[(\[?[^\]]+\]?)\]")


def _host_line(line: str) -> str | None:
    """The host of a `host = "..."` line, or None."""
    key, sep, value = line.partition("=")
    if not sep or key.strip() != "host":
        return None
    try:
        return str(tomllib.loads(f"host = {value.strip()}")["host"])
    except (tomllib.TOMLDecodeError, KeyError):
        return None


def _replace(path: Path, text: str, expected: Callable[[list[str]], bool]) -> None:
    """Write `text` over the file at `path` if it loads and its hosts pass `expected`."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            os.chmod(temporary, path.stat().st_mode & 0o777)
        _check(temporary, path, expected)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _check(temporary: str, path: Path, expected: Callable[[list[str]], bool]) -> None:
    """The edited file must load, and hold the servers `expected` accepts."""
    edited = load_config(temporary, environ={})
    if not expected([s.host for s in edited.cluster.servers]):
        raise ConfigError(
            f"editing {path} would not give the servers expected",
            "edit its [[cluster.servers]] tables by hand",
        )
