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
about an edit they forgot to apply, and what would apply it: a reload for
live keys, a restart for the others; nothing for `[defaults]`, which each
`gpuq submit` reads from the file itself.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Any

from gpuq.config import Config, config_to_dict, load_config
from gpuq.errors import ConfigError

LIVE_SECTIONS = ("scheduler", "logs", "defaults", "client", "cluster")
LIVE_DAEMON_KEYS = ("kill_grace", "labels")
PER_COMMAND_SECTIONS = ("defaults",)
"""What each command reads from the file itself: an edit there needs no reload."""


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
        self._seen = self._digest
        """The file's digest when `changed` last read it."""
        self._edit: tuple[str | None, list[str]] = (self._digest, [])
        """A digest of the file, and what its edit calls for."""

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
            self._seen = None
            return self._digest is not None
        if (info.st_ino, info.st_size, info.st_mtime_ns) == self._stat:
            return False
        self._seen = _digest(self.source)[1]
        return self._seen != self._digest

    def warnings(self, running: Config) -> list[str]:
        """What to tell users about the config, which `running` is what the daemon runs."""
        found = self._edit_warnings(running) if self.changed() else []
        if self.restart_needed:
            found.append(
                f"config keys {', '.join(self.restart_needed)} changed and take effect only "
                "after gpuq daemon restart"
            )
        return found

    def _edit_warnings(self, running: Config) -> list[str]:
        """What the file's edit needs, worked out once per version `changed` read."""
        if self._seen != self._edit[0]:
            self._edit = (self._seen, edit_warnings(self.source, running, self.restart_needed))
        return self._edit[1]


def edit_warnings(source: Path | None, running: Config, known: list[str]) -> list[str]:
    """What applies an edit of `source` that `running` does not have yet, if it needs anything.

    Keys of `known` (already reported as needing a restart) are not said twice.
    """
    try:
        fresh = load_config(None if source is None else str(source))
    except ConfigError as exc:
        return [
            f"the config file {source} changed since the daemon read it and is not valid "
            f"({exc.message}); the daemon goes on with what it read"
        ]
    live, restart = _split(_changed(running, fresh))
    found = []
    if live := [k for k in live if k.partition(".")[0] not in PER_COMMAND_SECTIONS]:
        found.append(
            f"the config file {source} changed since the daemon read it: "
            f"gpuq daemon reload applies {', '.join(live)}"
        )
    if restart := [k for k in restart if k not in known]:
        found.append(
            f"the config file {source} changed since the daemon read it: "
            f"{', '.join(restart)} take effect only after gpuq daemon restart"
        )
    return found


def _changed(before: Config, after: Config) -> list[str]:
    """The dotted keys whose values differ."""
    old, new = _flatten(before), _flatten(after)
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def _split(keys: list[str]) -> tuple[list[str], list[str]]:
    """(keys a reload applies, keys that need a restart)."""
    return [k for k in keys if _is_live(k)], [k for k in keys if not _is_live(k)]


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
    applied, restart = _split(_changed(current, fresh))
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
