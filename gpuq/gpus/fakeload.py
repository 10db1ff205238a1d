"""The load of fake GPUs as jobs see it: how crowded each device is, and how slow.

A fake GPU does no work, so a job that emulates a GPU's work (a trace job,
a test's training loop) must learn from the device how long that work takes
and how much memory is left for it. The fake backend publishes one small
JSON file per device into a directory (`publish`), whenever what it shows
changes; the daemon names that directory in each job's environment
(``GPUQ_FAKE_GPU_DIR``, `gpuq.env.fake_gpu_dir`), and the job reads it back
(`DeviceLoad.read`, `JobDevices`)::

    {"memory_total": 42949672960, "memory_used": 12884901888,
     "computing": 2, "slowdown": 2.8}

`computing` counts the gpuq jobs computing on the device now (not those
parked or stopped for another's turn), and `slowdown` is how much longer
each of their steps takes than alone (the declaration's `share_slowdown`,
see `gpuq.gpus.FakeGpuDecl`). Stdlib only: a job imports it without the
daemon.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuq import env


@dataclass(frozen=True, slots=True)
class DeviceLoad:
    """What one fake device shows its jobs (module docstring)."""

    memory_total: int
    memory_used: int
    computing: int = 0
    slowdown: float = 1.0

    @staticmethod
    def read(path: Path) -> DeviceLoad | None:
        """The load published at `path`, or None if there is none (or it is damaged)."""
        try:
            data = json.loads(path.read_bytes())
            return DeviceLoad(
                int(data["memory_total"]),
                int(data["memory_used"]),
                int(data["computing"]),
                float(data["slowdown"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def slowdown(computing: int, share_slowdown: float) -> float:
    """How much longer each step takes with `computing` jobs on one device than alone."""
    return 1.0 + max(0, computing - 1) * (share_slowdown - 1.0)


def publish(directory: Path, loads: Mapping[str, DeviceLoad]) -> None:
    """Write each device's load as `directory/UUID.json`, atomically (tmp file, rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    for uuid, load in loads.items():
        temporary = directory / f".{uuid}.json.tmp"
        temporary.write_text(json.dumps(asdict(load)))
        os.replace(temporary, directory / f"{uuid}.json")


class JobDevices:
    """The fake GPUs of the job this process belongs to, as it emulates work on them."""

    def __init__(self, directory: Path, uuids: tuple[str, ...], reserved: int = 0) -> None:
        self.directory = directory
        self.uuids = uuids
        self.reserved = reserved
        """Bytes the daemon shows this job holding on each of its GPUs (its reservation)."""

    @staticmethod
    def from_env(environ: Mapping[str, str] | None = None) -> JobDevices | None:
        """The job's fake GPUs, or None outside gpuq, on real GPUs or without GPUs."""
        directory = env.fake_gpu_dir(environ)
        uuids = env.gpu_uuids(environ)
        if directory is None or not uuids:
            return None
        return JobDevices(Path(directory), uuids, env.gpu_mem(environ) or 0)

    def loads(self, after: float = 0.0) -> list[DeviceLoad]:
        """The load of each of the job's GPUs published (last) after Unix time `after`."""
        found = []
        for uuid in self.uuids:
            path = self.directory / f"{uuid}.json"
            try:
                fresh = path.stat().st_mtime >= after
            except OSError:
                continue
            load = DeviceLoad.read(path) if fresh else None
            if load is not None:
                found.append(load)
        return found

    def slowdown(self) -> float:
        """How much longer a step takes now than alone: the most crowded GPU's (1.0 unknown)."""
        return max((load.slowdown for load in self.loads()), default=1.0)

    def room(self, after: float = 0.0) -> int | None:
        """Bytes this job may use on its tightest GPU beside what others hold.

        None while some GPU's load was not published after `after` (a job
        that just began computing waits for a load that shows it: the daemon
        publishes at its next sample).
        """
        loads = self.loads(after)
        if len(loads) < len(self.uuids):
            return None
        return min(load.memory_total - max(0, load.memory_used - self.reserved) for load in loads)
