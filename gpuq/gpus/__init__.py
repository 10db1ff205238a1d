"""GPU backends: what the daemon knows about this server's GPUs.

The daemon samples GPUs through one small interface, `GpuBackend`, with two
implementations chosen by `make_backend`: `NvmlBackend` (real GPUs, through
nvidia-ml-py) and `FakeBackend` (declared GPUs, for tests, demos and servers
without NVIDIA hardware). Keeping the interface this small lets every daemon
test run without a GPU, and keeps pynvml out of anything that only needs the
configuration types: importing this package imports neither backend.

Devices are identified by UUID. `include`/`exclude` entries in the
configuration name a device by UUID or by index (`"0"`); a physical GPU's
UUID or index also names all of its MIG instances, which share its index.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpuq.errors import ConfigError, GpuUnavailable
from gpuq.models import GpuInfo

if TYPE_CHECKING:
    from gpuq.gpus.fake import FakeBackend
    from gpuq.gpus.nvml import NvmlBackend

BACKEND_KINDS = ("auto", "nvml", "fake")
"""Accepted values of `GpuConfig.backend`."""


@dataclass(frozen=True, slots=True)
class JobHolding:
    """What one running gpuq job holds, as the daemon knows it.

    `pid` leads the job's process group; `memory` is the bytes it holds on
    each of `gpu_uuids` (its reservation; 0 for whole GPUs); `computing` is
    False while it waits (parked or stopped for another job's turn).
    """

    pid: int
    gpu_uuids: tuple[str, ...]
    memory: int = 0
    computing: bool = True


class GpuBackend(Protocol):
    """A source of GPU samples for the daemon."""

    kind: str
    """`"nvml"` or `"fake"`."""

    def devices(self) -> list[GpuInfo]:
        """One batched sample of every schedulable device (MIG instances included).

        `memory_used` counts every process on the device; `processes` lists
        per-process memory, with None where the driver cannot tell.
        """
        ...

    def observe(self, holdings: Mapping[int, JobHolding]) -> None:
        """Learn which gpuq jobs (by id) hold which GPUs, before the next sample.

        Real GPUs report every process themselves, so NVML ignores this; fake
        GPUs report each job's process as holding its reserved memory, as a
        real GPU would show it.
        """
        ...

    def driver_version(self) -> str | None:
        """The driver version, or None when it cannot be read."""
        ...

    def close(self) -> None:
        """Release what the backend holds; later calls may reopen it."""
        ...


@dataclass(frozen=True, slots=True)
class FakeGpuDecl:
    """One declared line of fake GPUs: `count` identical devices.

    `foreign_memory` bytes are reported as held by a process gpuq did not
    start, with pid `foreign_pid` (a positive pid, never 0). `link_group`
    names the PCIe switch or NVLink group the line's GPUs share (GPUs of
    lines with the same group share it too); empty: topology unknown.
    `utilization` is the percentage one job computing on a device shows (k
    jobs: k times it, at most 100); `share_slowdown` is how much longer each
    job's steps take while two jobs compute on one device at once (k jobs:
    1 + (k - 1) x (share_slowdown - 1)), which jobs emulating a device read
    from the published load (`gpuq.gpus.fakeload`).
    """

    name: str = "Fake GPU"
    memory: int = 16 * 1024**3
    count: int = 1
    foreign_memory: int = 0
    foreign_pid: int = 999999
    utilization: float = 100.0
    share_slowdown: float = 1.0
    link_group: str = ""


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """The `[gpus]` settings: which backend, which devices, and fake GPUs.

    `backend="auto"` uses the fake GPUs when some are declared, else NVML,
    else no GPUs at all (the daemon then runs CPU-only jobs).
    `fake_state_file` is a JSON file the fake backend re-reads at each sample
    (see `gpuq.gpus.fake`).
    """

    backend: str = "auto"
    fake: tuple[FakeGpuDecl, ...] = ()
    fake_state_file: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    node: str = ""


@dataclass(frozen=True, slots=True)
class DeviceId:
    """What names a device in `include`/`exclude`: UUID, index, parent UUID."""

    uuid: str
    index: int
    parent_uuid: str | None


@dataclass(frozen=True, slots=True)
class DeviceFilter:
    """The `include`/`exclude` selection, applied by both backends."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def keeps(self, device: DeviceId) -> bool:
        """True if the device is included (or nothing is) and not excluded."""
        if self.include and not _matches_any(device, self.include):
            return False
        return not _matches_any(device, self.exclude)

    def check_known(self, known: Iterable[DeviceId]) -> None:
        """Raise ConfigError if an `include` entry names no device in `known`."""
        known_list = list(known)
        unknown = [e for e in self.include if not any(_matches(d, e) for d in known_list)]
        if not unknown:
            return
        names = ", ".join(f"{d.uuid} (index {d.index})" for d in known_list) or "none"
        raise ConfigError(
            f"unknown GPU in gpus.include: {', '.join(map(repr, unknown))}; known: {names}",
            hint="name GPUs by UUID or index, as listed by `gpuq gpus` or `nvidia-smi -L`",
        )


def _matches(device: DeviceId, entry: str) -> bool:
    return entry in (device.uuid, device.parent_uuid, str(device.index))


def _matches_any(device: DeviceId, entries: Iterable[str]) -> bool:
    return any(_matches(device, entry) for entry in entries)


def make_backend(config: GpuConfig) -> GpuBackend:
    """Build the backend `config` asks for, with `include`/`exclude` applied.

    Raises GpuUnavailable when `backend="nvml"` and NVML cannot start, and
    ConfigError for an unknown backend or an `include` entry naming no GPU.
    """
    if config.backend not in BACKEND_KINDS:
        raise ConfigError(
            f"unknown gpus.backend {config.backend!r}; known: {', '.join(BACKEND_KINDS)}"
        )
    device_filter = DeviceFilter(config.include, config.exclude)
    backend: FakeBackend | NvmlBackend
    if config.backend == "fake" or (config.backend == "auto" and config.fake):
        backend = _fake(config, device_filter)
    else:
        from gpuq.gpus.nvml import NvmlBackend

        backend = NvmlBackend(node=config.node, device_filter=device_filter)
        try:
            backend.open()
        except GpuUnavailable as exc:
            if config.backend == "nvml":
                raise
            backend = _fake(config, device_filter)
            backend.warnings.append(f"no GPUs ({exc.message}); running CPU-only jobs only")
    if device_filter.include:
        device_filter.check_known(backend.known_devices())
    return backend


def _fake(config: GpuConfig, device_filter: DeviceFilter) -> FakeBackend:
    from gpuq.gpus.fake import FakeBackend

    return FakeBackend(
        config.fake,
        node=config.node,
        state_file=config.fake_state_file,
        device_filter=device_filter,
    )


__all__ = [
    "BACKEND_KINDS",
    "DeviceFilter",
    "DeviceId",
    "FakeGpuDecl",
    "GpuBackend",
    "GpuConfig",
    "make_backend",
]
