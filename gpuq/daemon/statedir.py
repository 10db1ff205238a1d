"""The state directory's identity, and the job id high-water mark kept outside it.

A state directory deleted (or replaced) under a running daemon must not go
unnoticed: the daemon would keep writing to an unlinked database and, after
a restart, hand out ids from 1 again. `StateDirWatch` remembers the device
and inode of the directory and of the database at startup and tells when
either changed; the daemon then stops accepting work.

Ids are never reused: the highest id handed out is also written beside the
daemon's lock in the runtime directory (`last-id`), and every job directory
is named after its id, so a database made afresh starts above both
(`id_floor`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

LAST_ID: Final = "last-id"


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


class StateDirWatch:
    """Tells whether the state directory and database are still the ones opened."""

    def __init__(self, state_dir: Path, database: Path) -> None:
        self.state_dir = state_dir
        self.database = database
        self._expected = (_identity(state_dir), _identity(database))

    def problem(self) -> str | None:
        """None while both are in place, else what happened to them."""
        if (_identity(self.state_dir), _identity(self.database)) == self._expected:
            return None
        if not self.state_dir.exists():
            what = "was deleted"
        elif not self.database.exists():
            what = f"lost its database {self.database.name}"
        else:
            what = "was replaced"
        return (
            f"the state directory {self.state_dir} {what} while the daemon ran; "
            "it no longer records anything, so it accepts no new work"
        )


def id_floor(runtime_dir: Path, jobs_dir: Path) -> int:
    """The highest id known outside the database: `last-id` and the job directories."""
    highest = 0
    with contextlib.suppress(OSError, ValueError):
        highest = int((runtime_dir / LAST_ID).read_text().strip() or 0)
    with contextlib.suppress(OSError):
        with os.scandir(jobs_dir) as entries:
            for entry in entries:
                if entry.name.isdigit():
                    highest = max(highest, int(entry.name))
    return highest


def remember_last_id(runtime_dir: Path, last_id: int) -> None:
    """Write `last_id` beside the lock; raises OSError if it cannot.

    One fixed-width record written in place: a single small write is all or
    nothing to a reader, and costs no rename (this runs on every submit).
    """
    fd = os.open(
        runtime_dir / LAST_ID, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        os.pwrite(fd, f"{last_id:>20}\n".encode(), 0)
    finally:
        os.close(fd)
