"""A fake GPU backend: declared GPUs that behave enough like NVML to schedule on.

Used by tests, demos and servers without NVIDIA GPUs. The devices come from
`FakeGpuDecl` lines in the configuration; their UUIDs are derived from the
node name and the device's position, so they stay the same across daemon
restarts with the same configuration.

What the fake reports:

- `memory_used` is the declared foreign memory, plus foreign processes from
  the state file, plus the memory of job processes the daemon `attach`-ed;
  it is capped at `memory_total`, as a real device cannot exceed it.
- `utilization` is 0.0 while no attached job process computes and the
  declared `utilization` (default 100.0) per computing one, at most 100.0,
  unless the state file sets it. A job the daemon says waits for its turn
  (`JobHolding.computing` False) holds memory but does not compute.
- With `publish_to(directory)`, each sample also publishes every device's
  load (memory, jobs computing on it, their `share_slowdown`) for jobs that
  emulate a GPU's work (`gpuq.gpus.fakeload`), when it changed.
- `link_group` is the declared line's `link_group`: the topology that NVML
  reads from PCIe switches and NVLinks on a real server.

The optional state file lets a test change the world at run time. It is
re-read at every `devices()` call and has this shape::

    {"GPU-...": {"foreign": [{"pid": 4242, "memory": 1073741824}],
                 "utilization": 37.5}}

Its foreign processes add to the declared ones. A missing file means no
changes; a malformed one is ignored as a whole and reported once in
`warnings` (until the file is read cleanly again). The backend starts no
threads and does no other I/O than these two files.
"""

from __future__ import annotations

import json
import uuid as uuid_lib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from gpuq.errors import ConfigError
from gpuq.gpus import DeviceFilter, DeviceId, FakeGpuDecl, JobHolding
from gpuq.gpus.fakeload import DeviceLoad, publish, slowdown
from gpuq.models import GpuInfo, GpuProcess

_UUID_NAMESPACE = uuid_lib.UUID("6f1d4a52-7c1e-4d0b-9a55-3a0f6b2c8e10")


def fake_uuid(node: str, index: int) -> str:
    """The stable UUID of fake device `index` on `node` (NVML's `GPU-…` form)."""
    return f"GPU-{uuid_lib.uuid5(_UUID_NAMESPACE, f'gpuq-fake/{node}/{index}')}"


@dataclass(frozen=True, slots=True)
class _FakeDevice:
    uuid: str
    index: int
    name: str
    memory_total: int
    foreign: tuple[GpuProcess, ...]
    utilization: float = 100.0
    share_slowdown: float = 1.0
    link_group: str = ""


@dataclass(frozen=True, slots=True)
class _Overlay:
    """What the state file adds to one device."""

    foreign: tuple[GpuProcess, ...] = ()
    utilization: float | None = None


class _StateFileError(ValueError):
    """The fake state file does not have the documented shape."""


class FakeBackend:
    """GPUs declared in the configuration, with job processes the daemon attaches.

    `warnings` collects one-line problems (a malformed state file); each is
    appended once, and the caller may clear the list after logging it.
    """

    kind: str = "fake"

    def __init__(
        self,
        decls: Iterable[FakeGpuDecl] = (),
        *,
        node: str = "",
        state_file: str | None = None,
        device_filter: DeviceFilter | None = None,
    ) -> None:
        self.node = node
        self.state_file = state_file
        self.device_filter = device_filter or DeviceFilter()
        self.warnings: list[str] = []
        self._reported: set[str] = set()
        self._devices = _declare(decls, node)
        self._by_uuid = {device.uuid: device for device in self._devices}
        # (uuid, pid) -> bytes, in attach order.
        self._attached: dict[tuple[str, int], int] = {}
        # job id -> the pid `observe` attached for it.
        self._observed: dict[int, int] = {}
        # pids of observed jobs that wait for their turn (hold memory, compute nothing).
        self._waiting: set[int] = set()
        self._publish_dir: Path | None = None
        self._published: dict[str, DeviceLoad] = {}

    def publish_to(self, directory: Path) -> None:
        """Publish every device's load into `directory` at each sample (module docstring)."""
        self._publish_dir = directory
        self._published = {}

    def known_devices(self) -> list[DeviceId]:
        """Every declared device, before `include`/`exclude` filtering."""
        return [DeviceId(d.uuid, d.index, None) for d in self._devices]

    def devices(self) -> list[GpuInfo]:
        """One sample of the declared devices that pass the filter."""
        overlays = self._read_state_file()
        infos = []
        loads: dict[str, DeviceLoad] = {}
        for device in self._devices:
            if not self.device_filter.keeps(DeviceId(device.uuid, device.index, None)):
                continue
            overlay = overlays.get(device.uuid, _Overlay())
            jobs = tuple(
                GpuProcess(pid, memory)
                for (uuid, pid), memory in self._attached.items()
                if uuid == device.uuid
            )
            processes = device.foreign + overlay.foreign + jobs
            used = sum(p.used_memory or 0 for p in processes)
            computing = sum(1 for job in jobs if job.pid not in self._waiting)
            utilization = overlay.utilization
            if utilization is None:
                utilization = min(100.0, device.utilization * computing)
            loads[device.uuid] = DeviceLoad(
                device.memory_total,
                min(used, device.memory_total),
                computing,
                slowdown(computing, device.share_slowdown),
            )
            infos.append(
                GpuInfo(
                    uuid=device.uuid,
                    index=device.index,
                    name=device.name,
                    memory_total=device.memory_total,
                    memory_used=min(used, device.memory_total),
                    utilization=utilization,
                    processes=processes,
                    node=self.node,
                    link_group=device.link_group,
                )
            )
        self._publish(loads)
        return infos

    def _publish(self, loads: dict[str, DeviceLoad]) -> None:
        """Write the loads that changed since the last sample, if publishing (`publish_to`)."""
        if self._publish_dir is None:
            return
        changed = {uuid: load for uuid, load in loads.items() if self._published.get(uuid) != load}
        if not changed:
            return
        try:
            publish(self._publish_dir, changed)
        except OSError as exc:
            self._warn(f"fake GPU load not published in {self._publish_dir}: {exc}")
            return
        self._published.update(changed)

    def attach(self, uuid: str, pid: int, memory: int) -> None:
        """Report process `pid` as holding `memory` bytes on device `uuid`.

        The daemon calls this when it launches a job on fake GPUs, so that the
        job shows up in `processes` as it would under NVML. Attaching the same
        pid to the same device again replaces its memory.
        """
        if uuid not in self._by_uuid:
            raise ValueError(f"no fake GPU {uuid}; known: {', '.join(self._by_uuid) or 'none'}")
        if pid <= 0 or memory < 0:
            raise ValueError(f"need a positive pid and memory >= 0, got {pid=} {memory=}")
        self._attached[(uuid, pid)] = memory

    def detach(self, pid: int) -> None:
        """Forget process `pid` on every device (a no-op if it is not attached)."""
        for key in [key for key in self._attached if key[1] == pid]:
            del self._attached[key]

    def observe(self, holdings: Mapping[int, JobHolding]) -> None:
        """Show each running job's process holding the memory it holds, as NVML would.

        A job that is no longer held is detached, so its memory goes with its
        process, as a real GPU's would: a job whose process ended shows none,
        not foreign memory. A job whose memory changed (parked) is attached
        again with its new size.
        """
        for job_id in [job_id for job_id in self._observed if job_id not in holdings]:
            self.detach(self._observed.pop(job_id))
        self._waiting = {h.pid for h in holdings.values() if not h.computing}
        for job_id, holding in holdings.items():
            pid = self._observed.get(job_id)
            if pid == holding.pid and all(
                self._attached.get((uuid, pid)) == holding.memory
                for uuid in holding.gpu_uuids
                if uuid in self._by_uuid
            ):
                continue
            if pid is not None:
                self.detach(pid)
            for uuid in holding.gpu_uuids:
                if uuid in self._by_uuid:
                    self.attach(uuid, holding.pid, holding.memory)
            self._observed[job_id] = holding.pid

    def driver_version(self) -> str | None:
        """Always `"fake"`, so displays make the backend obvious."""
        return "fake"

    def close(self) -> None:
        """Nothing to release; attached processes are kept."""

    def _read_state_file(self) -> dict[str, _Overlay]:
        if self.state_file is None:
            return {}
        path = Path(self.state_file)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._warn(f"fake GPU state file {path} unreadable, ignored: {exc}")
            return {}
        try:
            overlays = _parse_state(json.loads(raw), known=self._by_uuid)
        except ValueError as exc:  # bad encoding, bad JSON or a bad shape
            self._warn(f"fake GPU state file {path} is malformed, ignored: {exc}")
            return {}
        self._reported.clear()
        return overlays

    def _warn(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            self.warnings.append(message)


def _parse_state(data: object, *, known: Iterable[str]) -> dict[str, _Overlay]:
    """Validate decoded state-file JSON; raises _StateFileError on any problem."""
    known_uuids = set(known)
    if not isinstance(data, dict):
        raise _StateFileError("expected an object keyed by GPU UUID")
    overlays = {}
    for uuid, entry in data.items():
        if uuid not in known_uuids:
            raise _StateFileError(f"unknown GPU {uuid!r}")
        if not isinstance(entry, dict) or set(entry) - {"foreign", "utilization"}:
            raise _StateFileError(f"{uuid}: expected keys 'foreign' and/or 'utilization'")
        foreign = entry.get("foreign", [])
        if not isinstance(foreign, list):
            raise _StateFileError(f"{uuid}: 'foreign' must be a list")
        utilization = entry.get("utilization")
        if utilization is not None and not (
            _is_number(utilization) and 0.0 <= utilization <= 100.0
        ):
            raise _StateFileError(f"{uuid}: 'utilization' must be a number in [0, 100]")
        overlays[uuid] = _Overlay(
            foreign=tuple(_parse_process(uuid, item) for item in foreign),
            utilization=None if utilization is None else float(utilization),
        )
    return overlays


def _parse_process(uuid: str, item: object) -> GpuProcess:
    if isinstance(item, dict):
        pid, memory = item.get("pid"), item.get("memory")
        if _is_int(pid) and _is_int(memory) and pid > 0 and memory >= 0:
            return GpuProcess(pid, memory)
    raise _StateFileError(f"{uuid}: foreign entries need an int pid > 0 and memory >= 0")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _declare(decls: Iterable[FakeGpuDecl], node: str) -> list[_FakeDevice]:
    devices: list[_FakeDevice] = []
    for decl in decls:
        _check_decl(decl)
        foreign = (GpuProcess(decl.foreign_pid, decl.foreign_memory),)
        for _ in range(decl.count):
            index = len(devices)
            devices.append(
                _FakeDevice(
                    uuid=fake_uuid(node, index),
                    index=index,
                    name=decl.name,
                    memory_total=decl.memory,
                    foreign=foreign if decl.foreign_memory else (),
                    utilization=decl.utilization,
                    share_slowdown=decl.share_slowdown,
                    link_group=decl.link_group,
                )
            )
    return devices


def _check_decl(decl: FakeGpuDecl) -> None:
    problems = []
    if decl.count < 0:
        problems.append(f"count must be >= 0, got {decl.count}")
    if decl.memory <= 0:
        problems.append(f"memory must be positive, got {decl.memory}")
    if not 0 <= decl.foreign_memory <= decl.memory:
        problems.append(f"foreign_memory must be in [0, memory], got {decl.foreign_memory}")
    if decl.foreign_pid <= 0:
        problems.append(f"foreign_pid must be a positive pid, got {decl.foreign_pid}")
    if not 0.0 <= decl.utilization <= 100.0:
        problems.append(f"utilization must be in [0, 100], got {decl.utilization}")
    if decl.share_slowdown < 1.0:
        problems.append(f"share_slowdown must be at least 1, got {decl.share_slowdown}")
    if problems:
        raise ConfigError(f"fake GPU {decl.name!r}: " + "; ".join(problems))
