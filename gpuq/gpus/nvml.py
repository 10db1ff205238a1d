"""The NVML backend: a small layer over nvidia-ml-py (imported as `pynvml`).

Why a layer: NVML fails in many small ways, and the daemon should see only
three outcomes.

- NVML cannot start at all (no library, no driver, a driver upgraded without
  a reboot, a foreign `pynvml` shadowing NVIDIA's): one `GpuUnavailable`
  with a hint, raised by `open()` or by the first read.
- A metric a device does not have (NotSupported, NotFound, NoData, N/A):
  None for that metric, silently; that is normal on MIG and consumer GPUs.
- Anything else per metric (a function the driver or binding lacks, missing
  permissions, a lost GPU): None for that metric, and a one-line message
  appended once to `warnings`. A device whose UUID or memory cannot be read
  is left out of the sample.

NVML is initialised lazily (at `open()` or the first read), once, under a
lock, and shut down by `close()` or at interpreter exit. pynvml is imported
only then, so importing this module stays cheap.

Topology (`GpuInfo.link_group`) is read once per set of devices: two GPUs
are linked when their closest common PCIe ancestor is a switch (NVML's
SINGLE or MULTIPLE level: `nvidia-smi topo -m` shows PIX or PXB) or when
NVLink joins them (P2P status over NVLink OK), and each group of GPUs
linked directly or through others gets one label (`link0`, `link1`, ...,
numbered by their first GPU). A query the driver does not support leaves
that pair unlinked; a GPU no query could be asked of, and every MIG
instance, gets an empty group (unknown). Where NVLink joins every GPU
(NVSwitch) they all form one group, which is what they are.

Memory is reported as NVML's v2 structure sees it where the driver has it:
`memory_total` is the memory jobs can use (`used + free`, i.e. without the
driver-reserved part) and `memory_used` is NVML's `used`, so that
`memory_total - memory_used` is exactly NVML's `free`. Older drivers fall
back to the v1 structure (`total`, `used`).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Mapping
from typing import Any

from gpuq.errors import GpuUnavailable
from gpuq.gpus import DeviceFilter, DeviceId, JobHolding
from gpuq.models import GpuInfo, GpuProcess

_DEFAULT_HINT = "check that `nvidia-smi` works for this user"
_INIT_HINTS = {
    "NVMLError_LibraryNotFound": (
        "no NVIDIA driver library (libnvidia-ml.so.1) was found: install the NVIDIA "
        'driver, or set backend = "fake" in the [gpus] settings to run without GPUs'
    ),
    "NVMLError_DriverNotLoaded": (
        "the NVIDIA kernel driver is not loaded: load it (`sudo modprobe nvidia`) "
        "or reboot, then check `nvidia-smi`"
    ),
    "NVMLError_LibRmVersionMismatch": (
        "the NVIDIA driver was upgraded but the old kernel module is still loaded: reboot"
    ),
    "NVMLError_NoPermission": "this user may not open /dev/nvidia*: check its groups",
}
_IMPORT_HINT = "install NVIDIA's bindings: `pip install nvidia-ml-py`"
_SHADOW_HINT = (
    "another package provides a `pynvml` module: "
    "`pip uninstall pynvml` then `pip install --force-reinstall nvidia-ml-py`"
)

# How per-metric NVML errors are treated (see the module docstring).
_ABSENT = ("NVMLError_NotSupported", "NVMLError_NotFound", "NVMLError_NoData")
_FATAL = (
    "NVMLError_Uninitialized",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibraryNotFound",
    "NVMLError_LibRmVersionMismatch",
)
_V2_UNAVAILABLE = ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch")
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long
_MIG_ENABLED = 1  # NVML_DEVICE_MIG_ENABLE
_TOPOLOGY_MULTIPLE = 20  # NVML_TOPOLOGY_MULTIPLE: PCIe switches only, no host bridge between
_P2P_CAPS_INDEX_NVLINK = 2  # NVML_P2P_CAPS_INDEX_NVLINK
_P2P_STATUS_OK = 0  # NVML_P2P_STATUS_OK


def load_nvml() -> Any:
    """Import pynvml and call `nvmlInit`, or raise one GpuUnavailable with a hint."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuUnavailable(f"cannot import pynvml: {exc}", hint=_IMPORT_HINT) from exc
    error_class = getattr(pynvml, "NVMLError", None)
    if not (isinstance(error_class, type) and issubclass(error_class, Exception)):
        raise GpuUnavailable("the installed pynvml has no NVMLError", hint=_SHADOW_HINT)
    try:
        pynvml.nvmlInit()
    except AttributeError as exc:
        raise GpuUnavailable(
            f"the installed pynvml is not nvidia-ml-py: {exc}", hint=_SHADOW_HINT
        ) from exc
    except error_class as exc:
        hint = _INIT_HINTS.get(type(exc).__name__, _DEFAULT_HINT)
        raise GpuUnavailable(f"NVML failed to start: {exc}", hint=hint) from exc
    return pynvml


def _is(lib: Any, exc: BaseException, names: tuple[str, ...]) -> bool:
    """True if `exc` is one of pynvml's error classes called `names`."""
    classes = [getattr(lib, name, None) for name in names]
    return any(isinstance(cls, type) and isinstance(exc, cls) for cls in classes)


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None if value is None else str(value)


class NvmlBackend:
    """Real GPUs through NVML, keyed by UUID, MIG instances as devices.

    Reads may run in a worker thread. `warnings` collects one-line problems;
    each is appended once, and the caller may clear the list after logging it.
    """

    kind: str = "nvml"

    def __init__(self, *, node: str = "", device_filter: DeviceFilter | None = None) -> None:
        self.node = node
        self.device_filter = device_filter or DeviceFilter()
        self.warnings: list[str] = []
        self._reported: set[str] = set()
        self._lock = threading.Lock()
        self._lib: Any = None
        self._memory_v2 = True
        self._last_seen_us: dict[str, int] = {}
        self._link_groups: dict[tuple[str, ...], dict[str, str]] = {}

    def open(self) -> None:
        """Start NVML now rather than at the first read; raises GpuUnavailable."""
        self._nvml()

    def close(self) -> None:
        """Shut NVML down (it restarts at the next read); also runs at exit."""
        with self._lock:
            lib, self._lib = self._lib, None
            if lib is None:
                return
            atexit.unregister(self.close)
            self._last_seen_us.clear()
            self._link_groups.clear()
        try:
            lib.nvmlShutdown()
        except lib.NVMLError as exc:
            self._warn(f"nvmlShutdown failed: {exc}")

    def observe(self, holdings: Mapping[int, JobHolding]) -> None:
        """Nothing to learn: NVML reports every process on the GPUs itself."""

    def driver_version(self) -> str | None:
        """The driver version NVML reports, e.g. "550.54.15"."""
        lib = self._nvml()
        return _text(self._query(lib, "nvmlSystemGetDriverVersion"))

    def known_devices(self) -> list[DeviceId]:
        """Every schedulable device, before `include`/`exclude` filtering."""
        return [device for device, _ in self._enumerate(self._nvml())]

    def devices(self) -> list[GpuInfo]:
        """One sample of the schedulable devices that pass the filter."""
        lib = self._nvml()
        kept = [(d, handle) for d, handle in self._enumerate(lib) if self.device_filter.keeps(d)]
        groups = self._topology(lib, kept)
        infos = []
        for device, handle in kept:
            info = self._sample(lib, device, handle, groups.get(device.uuid, ""))
            if info is not None:
                infos.append(info)
        return infos

    def _topology(self, lib: Any, devices: list[tuple[DeviceId, Any]]) -> dict[str, str]:
        """Each physical GPU's link group (module docstring), read once per set of devices."""
        physical = [(d.uuid, handle) for d, handle in devices if d.parent_uuid is None]
        key = tuple(uuid for uuid, _ in physical)
        cached = self._link_groups.get(key)
        if cached is not None:
            return cached
        parent = list(range(len(physical)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        answered: set[int] = set()
        for i, (_, first) in enumerate(physical):
            for j in range(i + 1, len(physical)):
                second = physical[j][1]
                level = self._query(lib, "nvmlDeviceGetTopologyCommonAncestor", first, second)
                nvlink = self._query(
                    lib, "nvmlDeviceGetP2PStatus", first, second, _P2P_CAPS_INDEX_NVLINK
                )
                if level is not None or nvlink is not None:
                    answered.update((i, j))
                close = level is not None and int(level) <= _TOPOLOGY_MULTIPLE
                if close or (nvlink is not None and int(nvlink) == _P2P_STATUS_OK):
                    parent[root(j)] = root(i)
        labels: dict[int, str] = {}
        groups: dict[str, str] = {}
        for i, (uuid, _) in enumerate(physical):
            if i in answered:
                groups[uuid] = labels.setdefault(root(i), f"link{len(labels)}")
        self._link_groups = {key: groups}
        return groups

    def per_process_utilization(self, uuid: str) -> dict[int, float]:
        """SM utilisation (percent) per pid on device `uuid` since the last call.

        Several samples of one pid are averaged. The first call covers the
        last second; later calls continue from the newest sample seen, so
        values do not lag. Empty when no process ran, and on MIG devices,
        which have no per-process utilisation.
        """
        lib = self._nvml()
        handle = self._query(lib, "nvmlDeviceGetHandleByUUID", uuid)
        if handle is None:
            self._warn(f"no GPU {uuid} for per-process utilisation")
            return {}
        since_us = self._last_seen_us.get(uuid, time.time_ns() // 1000 - 1_000_000)
        samples = self._query(lib, "nvmlDeviceGetProcessUtilization", handle, since_us)
        fresh = [s for s in samples or () if int(s.timeStamp) > since_us]
        if not fresh:
            return {}
        self._last_seen_us[uuid] = max(int(s.timeStamp) for s in fresh)
        per_pid: dict[int, list[float]] = {}
        for sample in fresh:
            per_pid.setdefault(int(sample.pid), []).append(float(sample.smUtil))
        return {pid: min(100.0, sum(v) / len(v)) for pid, v in per_pid.items()}

    def _nvml(self) -> Any:
        with self._lock:
            if self._lib is None:
                self._lib = load_nvml()
                atexit.register(self.close)
            return self._lib

    def _warn(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            self.warnings.append(message)

    def _query(self, lib: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call `pynvml.<name>`; None (reported once if unexpected) on failure."""
        function = getattr(lib, name, None)
        if function is None:
            self._warn(f"pynvml has no {name}; upgrade nvidia-ml-py")
            return None
        try:
            return function(*args, **kwargs)
        except AttributeError as exc:
            self._warn(f"{name} is unusable in this pynvml: {exc}")
            return None
        except lib.NVMLError as exc:
            if _is(lib, exc, _FATAL):
                hint = _INIT_HINTS.get(type(exc).__name__, _DEFAULT_HINT)
                raise GpuUnavailable(f"NVML stopped working: {exc}", hint=hint) from exc
            if not _is(lib, exc, _ABSENT):
                self._warn(f"{name} failed: {exc} ({type(exc).__name__})")
            return None

    def _enumerate(self, lib: Any) -> list[tuple[DeviceId, Any]]:
        """Identify every device by UUID, replacing MIG-enabled GPUs by their instances."""
        count = self._query(lib, "nvmlDeviceGetCount")
        if count is None:
            raise GpuUnavailable("NVML cannot count the GPUs", hint=_DEFAULT_HINT)
        found: list[tuple[DeviceId, Any]] = []
        for index in range(int(count)):
            handle = self._query(lib, "nvmlDeviceGetHandleByIndex", index)
            uuid = None if handle is None else _text(self._query(lib, "nvmlDeviceGetUUID", handle))
            if uuid is None:
                self._warn(f"GPU index {index} skipped: it cannot be identified")
                continue
            mode = self._query(lib, "nvmlDeviceGetMigMode", handle)
            if mode is None or mode[0] != getattr(lib, "NVML_DEVICE_MIG_ENABLE", _MIG_ENABLED):
                found.append((DeviceId(uuid, index, None), handle))
                continue
            slots = self._query(lib, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
            for slot in range(int(slots)):
                child = self._query(lib, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
                if child is None:  # an empty slot
                    continue
                child_uuid = _text(self._query(lib, "nvmlDeviceGetUUID", child))
                if child_uuid is None:
                    self._warn(f"a MIG instance of {uuid} skipped: it cannot be identified")
                    continue
                found.append((DeviceId(child_uuid, index, uuid), child))
        return found

    def _sample(
        self, lib: Any, device: DeviceId, handle: Any, link_group: str = ""
    ) -> GpuInfo | None:
        memory = self._memory(lib, handle)
        if memory is None:
            self._warn(f"GPU {device.uuid} skipped: its memory cannot be read")
            return None
        rates = self._query(lib, "nvmlDeviceGetUtilizationRates", handle)
        return GpuInfo(
            uuid=device.uuid,
            index=device.index,
            name=_text(self._query(lib, "nvmlDeviceGetName", handle)) or "unknown GPU",
            memory_total=memory[0],
            memory_used=memory[1],
            utilization=None if rates is None else float(rates.gpu),
            processes=self._processes(lib, handle),
            node=self.node,
            parent_uuid=device.parent_uuid,
            link_group=link_group,
        )

    def _memory(self, lib: Any, handle: Any) -> tuple[int, int] | None:
        """(usable total, used) in bytes, from the v2 structure when the driver has it."""
        version = getattr(lib, "nvmlMemory_v2", None)
        if self._memory_v2 and version is not None:
            try:
                info = lib.nvmlDeviceGetMemoryInfo(handle, version=version)
            except (TypeError, AttributeError):  # a binding without `version=`
                self._memory_v2 = False
            except lib.NVMLError as exc:
                if _is(lib, exc, _FATAL):
                    hint = _INIT_HINTS.get(type(exc).__name__, _DEFAULT_HINT)
                    raise GpuUnavailable(f"NVML stopped working: {exc}", hint=hint) from exc
                if _is(lib, exc, _V2_UNAVAILABLE):
                    self._memory_v2 = False
            else:
                return int(info.used) + int(info.free), int(info.used)
        info = self._query(lib, "nvmlDeviceGetMemoryInfo", handle)
        return None if info is None else (int(info.total), int(info.used))

    def _processes(self, lib: Any, handle: Any) -> tuple[GpuProcess, ...]:
        """Compute processes with their memory (None where NVML says N/A), one per pid."""
        running = self._query(lib, "nvmlDeviceGetComputeRunningProcesses", handle) or ()
        memory_by_pid: dict[int, int | None] = {}
        for process in running:
            used = getattr(process, "usedGpuMemory", None)
            memory_by_pid[int(process.pid)] = (
                None if used is None or used == _NOT_AVAILABLE else int(used)
            )
        return tuple(GpuProcess(pid, used) for pid, used in memory_by_pid.items())
