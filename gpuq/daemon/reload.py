"""Reloading the configuration: what changes live, what waits for a restart.

`gpuq daemon reload` (the `reload` request) and SIGHUP read the daemon's
config file again. A file that does not validate changes nothing. Keys that
change live: everything under `[scheduler]` (the policy included),
`[logs]`, `[defaults]`, `[client]` and `[cluster]`, `daemon.kill_grace` and
`daemon.labels` (placement reads them at each scheduling pass). Keys that
need `gpuq daemon restart`: the rest of `[daemon]` (directories, socket
mode, node name) and `[gpus]`; a reload reports them and `gpuq ls`/`doctor`
keep warning until the restart.

`ConfigWatch` notices when the file on disk no longer matches what the
daemon runs (by size and modification time, then by content), so users hear
about an edit they forgot to apply.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

from gpuq.config import Config, config_to_dict, load_config

LIVE_SECTIONS = ("scheduler", "logs", "defaults", "client", "cluster")
LIVE_DAEMON_KEYS = ("kill_grace", "labels")


def _digest(path: Path | None) -> tuple[tuple[int, int, int] | None, str | None]:
    """(inode, size, mtime) and SHA-256 of the file; (None, None) when absent."""
    if path is None:
        return None, None
    try:
        info = os.stat(path)
        data = path.read_bytes()
    except OSError:
        return None, None
    return (info.st_ino, info.st_size, info.st_mtime_ns), hashlib.sha256(data).hexdigest()


class ConfigWatch:
    """Whether the config file on disk differs from the one the daemon runs."""

    def __init__(self, source: Path | None) -> None:
        self.source = source
        self._stat, self._digest = _digest(source)
        self.restart_needed: list[str] = []

    def loaded(self, source: Path | None) -> None:
        """The daemon now runs the file as it is."""
        self.source = source
        self._stat, self._digest = _digest(source)

    def changed(self) -> bool:
        """True if the file's content differs from what was loaded (cheap when unchanged)."""
        if self.source is None:
            return False
        try:
            info = os.stat(self.source)
        except OSError:
            return self._digest is not None
        if (info.st_ino, info.st_size, info.st_mtime_ns) == self._stat:
            return False
        return _digest(self.source)[1] != self._digest

    def warnings(self) -> list[str]:
        """What to tell users about the config."""
        found = []
        if self.changed():
            found.append(
                f"the config file {self.source} changed since the daemon read it: "
                "gpuq daemon reload applies it"
            )
        if self.restart_needed:
            found.append(
                f"config keys {', '.join(self.restart_needed)} changed and take effect only "
                "after gpuq daemon restart"
            )
        return found


def _flatten(config: Config) -> dict[str, Any]:
    """Dotted key -> value of every setting (paths as strings)."""
    flat: dict[str, Any] = {}
    for section, values in config_to_dict(config).items():
        if isinstance(values, dict):
            for key, value in values.items():
                flat[f"{section}.{key}"] = value
    return flat


def _is_live(key: str) -> bool:
    section, _, name = key.partition(".")
    return section in LIVE_SECTIONS or (section == "daemon" and name in LIVE_DAEMON_KEYS)


def reload(current: Config) -> tuple[Config, list[str], list[str]]:
    """Read the config again: (config to run now, keys applied, keys needing a restart).

    Raises ConfigError, changing nothing, if the file does not validate.
    """
    source = None if current.source is None else str(current.source)
    fresh = load_config(source)
    before, after = _flatten(current), _flatten(fresh)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    applied = [k for k in changed if _is_live(k)]
    restart = [k for k in changed if not _is_live(k)]
    running = dataclasses.replace(
        current,
        scheduler=fresh.scheduler,
        logs=fresh.logs,
        defaults=fresh.defaults,
        client=fresh.client,
        cluster=fresh.cluster,
        daemon=dataclasses.replace(
            current.daemon, kill_grace=fresh.daemon.kill_grace, labels=fresh.daemon.labels
        ),
    )
    return running, applied, restart
