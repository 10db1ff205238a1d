"""Tests of the NVML backend.

Most tests replace `pynvml` with a small scripted module (`FakeNvml`), so the
error mapping, MIG handling and memory fallbacks are checked on any machine.
Tests marked `gpu` use the real NVML and skip when it cannot start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuq.errors import ConfigError, GpuUnavailable
from gpuq.gpus import GpuConfig, make_backend
from gpuq.gpus.fake import FakeBackend
from gpuq.gpus.nvml import NvmlBackend
from gpuq.models import GpuInfo, GpuProcess

GIB = 1024**3
NOT_AVAILABLE = 2**64 - 1


class NVMLError(Exception):
    """Stands in for pynvml.NVMLError; subclasses below mirror pynvml's names."""


ERROR_NAMES = (
    "Uninitialized NotSupported NoPermission NotFound DriverNotLoaded LibraryNotFound "
    "FunctionNotFound GpuIsLost LibRmVersionMismatch NoData ArgumentVersionMismatch Unknown"
).split()
ERRORS: dict[str, type[NVMLError]] = {
    name: type(f"NVMLError_{name}", (NVMLError,), {"__str__": lambda self, name=name: name})
    for name in ERROR_NAMES
}


@dataclass
class FakeDevice:
    """One scripted device; `mig` lists MIG slots (None = empty) when MIG is on."""

    uuid: str
    name: str | bytes = b"Tesla T4"
    free: int = 10 * GIB
    used: int = 5 * GIB
    reserved: int = GIB
    utilization: int | None = 30
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    mig: list[FakeDevice | None] | None = None
    samples: list[tuple[int, int, int]] = field(default_factory=list)  # pid, time, sm
    failures: dict[str, str] = field(default_factory=dict)  # function -> error name
    switch: str | None = None  # its PCIe switch; None: topology NotSupported
    nvlinks: tuple[str, ...] | None = None  # UUIDs NVLink joins it to; None: NotSupported


class FakeNvml:
    """A scripted `pynvml` module: devices, failures and call records."""

    def __init__(self, *devices: FakeDevice) -> None:
        self.devices = list(devices)
        self.calls: list[str] = []
        self.since: list[int] = []
        self.init_error: str | None = None
        self.memory_v2 = True
        self.module = types.ModuleType("pynvml")
        constants = {"NVMLError": NVMLError, "nvmlMemory_v2": 0x02000028}
        constants |= {cls.__name__: cls for cls in ERRORS.values()}
        constants["NVML_DEVICE_MIG_ENABLE"] = 1
        for name, value in constants.items():
            setattr(self.module, name, value)
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(self.module, name, self._recorded(name, getattr(self, name)))

    def _recorded(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            handle = args[0] if args and isinstance(args[0], FakeDevice) else None
            if handle is not None and name in handle.failures:
                raise ERRORS[handle.failures[name]]()
            return function(*args, **kwargs)

        return call

    def all_devices(self) -> Iterator[FakeDevice]:
        for device in self.devices:
            yield device
            yield from (child for child in device.mig or () if child is not None)

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise ERRORS[self.init_error]()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        return self.devices[index]

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeDevice:
        for device in self.all_devices():
            if device.uuid == uuid:
                return device
        raise ERRORS["NotFound"]()

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeDevice) -> str | bytes:
        return handle.name

    def nvmlDeviceGetMigMode(self, handle: FakeDevice) -> list[int]:
        if handle.mig is None:
            raise ERRORS["NotSupported"]()
        return [1, 1]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeDevice) -> int:
        return len(handle.mig or ())

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeDevice, index: int) -> FakeDevice:
        child = (handle.mig or [])[index]
        if child is None:
            raise ERRORS["NotFound"]()
        return child

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice, version: int | None = None) -> Any:
        if version is not None:
            if not self.memory_v2:
                raise ERRORS["FunctionNotFound"]()
            total = handle.free + handle.used + handle.reserved
            return types.SimpleNamespace(
                total=total, reserved=handle.reserved, free=handle.free, used=handle.used
            )
        total = handle.free + handle.used + handle.reserved
        return types.SimpleNamespace(total=total, free=handle.free, used=total - handle.free)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> Any:
        if handle.utilization is None:
            raise ERRORS["NotSupported"]()
        return types.SimpleNamespace(gpu=handle.utilization, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in handle.processes]

    def nvmlDeviceGetTopologyCommonAncestor(self, first: FakeDevice, second: FakeDevice) -> int:
        if first.switch is None or second.switch is None:
            raise ERRORS["NotSupported"]()
        return 10 if first.switch == second.switch else 50  # SINGLE, else SYSTEM

    def nvmlDeviceGetP2PStatus(self, first: FakeDevice, second: FakeDevice, index: int) -> int:
        assert index == 2  # NVML_P2P_CAPS_INDEX_NVLINK
        if first.nvlinks is None or second.nvlinks is None:
            raise ERRORS["NotSupported"]()
        return 0 if second.uuid in first.nvlinks else 5  # OK, else NOT_SUPPORTED

    def nvmlDeviceGetProcessUtilization(self, handle: FakeDevice, since: int) -> list[Any]:
        self.since.append(since)
        fresh = [(pid, t, sm) for pid, t, sm in handle.samples if t > since]
        if not fresh:
            raise ERRORS["NotFound"]()
        return [types.SimpleNamespace(pid=p, timeStamp=t, smUtil=sm) for p, t, sm in fresh]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml(
        FakeDevice("GPU-aaaa", processes=[(100, 3 * GIB), (200, None), (300, NOT_AVAILABLE)]),
        FakeDevice("GPU-bbbb", name="NVIDIA A100", utilization=None),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


@pytest.fixture
def backend(fake_nvml: FakeNvml) -> Iterator[NvmlBackend]:
    nvml_backend = NvmlBackend(node="lab1")
    yield nvml_backend
    nvml_backend.close()


def by_uuid(devices: list[GpuInfo]) -> dict[str, GpuInfo]:
    return {device.uuid: device for device in devices}


def test_importing_the_backends_does_not_import_pynvml() -> None:
    code = "import sys, gpuq.gpus, gpuq.gpus.nvml, gpuq.gpus.fake; print('pynvml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("error", "hint_part"),
    [
        ("LibraryNotFound", "libnvidia-ml.so.1"),
        ("DriverNotLoaded", "modprobe nvidia"),
        ("LibRmVersionMismatch", "reboot"),
        ("Unknown", "nvidia-smi"),
    ],
)
def test_init_failure_is_one_gpu_unavailable_with_a_hint(
    fake_nvml: FakeNvml, error: str, hint_part: str
) -> None:
    fake_nvml.init_error = error
    with pytest.raises(GpuUnavailable, match="NVML failed to start") as info:
        make_backend(GpuConfig(backend="nvml"))
    assert info.value.hint is not None
    assert hint_part in info.value.hint


def test_missing_pynvml_is_gpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(GpuUnavailable, match="cannot import pynvml") as info:
        NvmlBackend().open()
    assert "nvidia-ml-py" in (info.value.hint or "")


def test_a_shadowing_pynvml_is_gpu_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", types.ModuleType("pynvml"))
    with pytest.raises(GpuUnavailable) as info:
        NvmlBackend().open()
    assert "pip uninstall pynvml" in (info.value.hint or "")

    fake = FakeNvml()
    del fake.module.nvmlInit
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    with pytest.raises(GpuUnavailable, match="not nvidia-ml-py"):
        NvmlBackend().open()


def test_auto_without_nvml_gives_an_empty_fake_backend_with_a_warning(
    fake_nvml: FakeNvml,
) -> None:
    fake_nvml.init_error = "LibraryNotFound"
    backend = make_backend(GpuConfig())
    assert isinstance(backend, FakeBackend)
    assert backend.devices() == []
    assert len(backend.warnings) == 1
    assert "CPU-only" in backend.warnings[0]


def test_auto_with_nvml_gives_the_nvml_backend(fake_nvml: FakeNvml) -> None:
    backend = make_backend(GpuConfig())
    try:
        assert isinstance(backend, NvmlBackend)
        assert backend.kind == "nvml"
    finally:
        backend.close()


def test_init_is_lazy_once_and_undone_by_close(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered: list[object] = []
    monkeypatch.setattr("atexit.register", registered.append)
    monkeypatch.setattr("atexit.unregister", registered.remove)
    backend = NvmlBackend()
    assert fake_nvml.calls == []
    backend.devices()
    backend.devices()
    backend.driver_version()
    assert fake_nvml.calls.count("nvmlInit") == 1
    assert registered == [backend.close]
    backend.close()
    backend.close()
    assert fake_nvml.calls.count("nvmlShutdown") == 1
    assert registered == []
    backend.devices()  # reopens
    assert fake_nvml.calls.count("nvmlInit") == 2
    backend.close()


def test_devices_report_identity_memory_and_processes(backend: NvmlBackend) -> None:
    devices = backend.devices()
    assert [d.uuid for d in devices] == ["GPU-aaaa", "GPU-bbbb"]
    first, second = devices
    assert (first.index, first.name, first.node, first.parent_uuid) == (0, "Tesla T4", "lab1", None)
    assert second.name == "NVIDIA A100"
    # v2: the reserved GiB is not usable, so total is used + free.
    assert (first.memory_total, first.memory_used) == (15 * GIB, 5 * GIB)
    assert first.utilization == 30.0
    assert first.processes == (
        GpuProcess(100, 3 * GIB),
        GpuProcess(200, None),
        GpuProcess(300, None),
    )
    assert backend.driver_version() == "550.54.15"


def test_not_supported_utilization_is_none_without_warning(backend: NvmlBackend) -> None:
    assert by_uuid(backend.devices())["GPU-bbbb"].utilization is None
    assert backend.warnings == []


def test_memory_falls_back_to_v1_once(backend: NvmlBackend, fake_nvml: FakeNvml) -> None:
    fake_nvml.memory_v2 = False
    first = backend.devices()[0]
    assert (first.memory_total, first.memory_used) == (16 * GIB, 6 * GIB)
    calls_before = fake_nvml.calls.count("nvmlDeviceGetMemoryInfo")
    backend.devices()
    # Two devices: one v1 call each, no more v2 attempts.
    assert fake_nvml.calls.count("nvmlDeviceGetMemoryInfo") == calls_before + 2
    assert backend.warnings == []


def test_binding_without_memory_v2_uses_v1(backend: NvmlBackend, fake_nvml: FakeNvml) -> None:
    del fake_nvml.module.nvmlMemory_v2
    assert backend.devices()[0].memory_total == 16 * GIB


def test_mig_instances_replace_their_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    small = FakeDevice("MIG-1111", name="A100 MIG 1g.10gb", utilization=None, free=9 * GIB)
    large = FakeDevice("MIG-2222", name="A100 MIG 3g.40gb", utilization=None, free=39 * GIB)
    parent = FakeDevice("GPU-mig0", name="NVIDIA A100", mig=[small, None, large])
    fake = FakeNvml(FakeDevice("GPU-plain"), parent)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    backend = make_backend(GpuConfig(backend="nvml"))
    try:
        devices = backend.devices()
        assert [(d.uuid, d.index, d.parent_uuid) for d in devices] == [
            ("GPU-plain", 0, None),
            ("MIG-1111", 1, "GPU-mig0"),
            ("MIG-2222", 1, "GPU-mig0"),
        ]
        assert devices[1].memory_total == 14 * GIB
        assert devices[1].utilization is None
    finally:
        backend.close()

    for entry in ("GPU-mig0", "1"):
        backend = make_backend(GpuConfig(backend="nvml", include=(entry,)))
        try:
            assert [d.uuid for d in backend.devices()] == ["MIG-1111", "MIG-2222"]
        finally:
            backend.close()


def test_missing_function_is_reported_once(backend: NvmlBackend, fake_nvml: FakeNvml) -> None:
    del fake_nvml.module.nvmlDeviceGetComputeRunningProcesses
    backend.devices()
    devices = backend.devices()
    assert all(d.processes == () for d in devices)
    assert backend.warnings == [
        "pynvml has no nvmlDeviceGetComputeRunningProcesses; upgrade nvidia-ml-py"
    ]


@pytest.mark.parametrize("error", ["FunctionNotFound", "NoPermission", "GpuIsLost"])
def test_unexpected_metric_errors_give_none_and_one_warning(
    backend: NvmlBackend, fake_nvml: FakeNvml, error: str
) -> None:
    fake_nvml.devices[0].failures["nvmlDeviceGetUtilizationRates"] = error
    backend.devices()
    assert backend.devices()[0].utilization is None
    assert len(backend.warnings) == 1
    assert backend.warnings[0] == (
        f"nvmlDeviceGetUtilizationRates failed: {error} (NVMLError_{error})"
    )


def test_device_with_unreadable_memory_is_skipped(
    backend: NvmlBackend, fake_nvml: FakeNvml
) -> None:
    fake_nvml.devices[0].failures["nvmlDeviceGetMemoryInfo"] = "GpuIsLost"
    assert [d.uuid for d in backend.devices()] == ["GPU-bbbb"]
    assert "GPU GPU-aaaa skipped: its memory cannot be read" in backend.warnings


def test_driver_failure_during_a_read_is_gpu_unavailable(
    backend: NvmlBackend, fake_nvml: FakeNvml
) -> None:
    backend.open()
    fake_nvml.devices[1].failures["nvmlDeviceGetName"] = "DriverNotLoaded"
    with pytest.raises(GpuUnavailable, match="NVML stopped working") as info:
        backend.devices()
    assert "modprobe" in (info.value.hint or "")


def test_unknown_include_lists_known_uuids(fake_nvml: FakeNvml) -> None:
    with pytest.raises(ConfigError, match=r"known: GPU-aaaa \(index 0\), GPU-bbbb \(index 1\)"):
        make_backend(GpuConfig(backend="nvml", include=("GPU-cccc",)))


def test_exclude_applies_to_nvml(fake_nvml: FakeNvml) -> None:
    backend = make_backend(GpuConfig(backend="nvml", exclude=("0",)))
    try:
        assert [d.uuid for d in backend.devices()] == ["GPU-bbbb"]
        # The excluded device is not even sampled.
        assert fake_nvml.calls.count("nvmlDeviceGetMemoryInfo") == 1
    finally:
        backend.close()


def link_groups(backend: NvmlBackend) -> dict[str, str]:
    return {device.uuid: device.link_group for device in backend.devices()}


def test_gpus_under_one_pcie_switch_share_a_link_group(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(*(FakeDevice(f"GPU-{i}", switch=f"sw{i // 2}") for i in range(4)))
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    backend = NvmlBackend()
    try:
        assert link_groups(backend) == {
            "GPU-0": "link0", "GPU-1": "link0", "GPU-2": "link1", "GPU-3": "link1",
        }  # fmt: skip
        assert backend.warnings == []
    finally:
        backend.close()


def test_nvlink_joins_gpus_of_different_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    devices = [FakeDevice(f"GPU-{i}", switch=f"sw{i}", nvlinks=()) for i in range(3)]
    devices[0].nvlinks, devices[2].nvlinks = ("GPU-2",), ("GPU-0",)
    fake = FakeNvml(*devices)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    backend = NvmlBackend()
    try:
        assert link_groups(backend) == {"GPU-0": "link0", "GPU-1": "link1", "GPU-2": "link0"}
    finally:
        backend.close()


def test_topology_is_read_once_and_unknown_where_not_supported(
    backend: NvmlBackend, fake_nvml: FakeNvml
) -> None:
    assert link_groups(backend) == {"GPU-aaaa": "", "GPU-bbbb": ""}
    backend.devices()
    assert fake_nvml.calls.count("nvmlDeviceGetTopologyCommonAncestor") == 1
    assert backend.warnings == []  # NotSupported is normal: no warning


def test_mig_instances_have_no_link_group(monkeypatch: pytest.MonkeyPatch) -> None:
    child = FakeDevice("MIG-1111", utilization=None, switch="sw0")
    fake = FakeNvml(
        FakeDevice("GPU-plain", switch="sw0"),
        FakeDevice("GPU-other", switch="sw0"),
        FakeDevice("GPU-mig0", mig=[child], switch="sw0"),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    backend = NvmlBackend()
    try:
        assert link_groups(backend) == {"GPU-plain": "link0", "GPU-other": "link0", "MIG-1111": ""}
    finally:
        backend.close()


def test_per_process_utilization_continues_from_the_last_sample(
    backend: NvmlBackend, fake_nvml: FakeNvml
) -> None:
    far = 2**62  # later than any clock-derived first timestamp
    device = fake_nvml.devices[0]
    device.samples = [(100, far + 1, 20), (100, far + 2, 40), (200, far + 2, 90)]
    assert backend.per_process_utilization("GPU-aaaa") == {100: 30.0, 200: 90.0}
    assert backend.per_process_utilization("GPU-aaaa") == {}  # NotFound: nothing new
    device.samples.append((100, far + 3, 70))
    assert backend.per_process_utilization("GPU-aaaa") == {100: 70.0}
    assert fake_nvml.since[1:] == [far + 2, far + 2]
    assert fake_nvml.since[0] < far
    assert backend.warnings == []


def test_per_process_utilization_of_unknown_gpu_is_empty_with_warning(
    backend: NvmlBackend,
) -> None:
    assert backend.per_process_utilization("GPU-zzzz") == {}
    assert backend.warnings == ["no GPU GPU-zzzz for per-process utilisation"]


# Real NVML ------------------------------------------------------------------

ALLOCATE = """
import sys, torch
if not torch.cuda.is_available():
    print("nocuda", flush=True)
    sys.exit(0)
block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def real_backend() -> Iterator[NvmlBackend]:
    try:
        backend = make_backend(GpuConfig(backend="nvml"))
    except GpuUnavailable as exc:
        pytest.skip(f"NVML unavailable: {exc.message}")
    assert isinstance(backend, NvmlBackend)
    yield backend
    backend.close()


@pytest.mark.gpu
def test_real_devices_look_sane(real_backend: NvmlBackend) -> None:
    devices = real_backend.devices()
    if not devices:
        pytest.skip("NVML works but reports no usable GPU")
    for device in devices:
        assert device.uuid.startswith(("GPU-", "MIG-"))
        assert device.memory_total > 0
        assert 0 <= device.memory_used <= device.memory_total
        assert device.utilization is None or 0.0 <= device.utilization <= 100.0
        assert isinstance(device.name, str) and device.name
    assert len({d.uuid for d in devices}) == len(devices)
    physical = [d for d in devices if d.parent_uuid is None]
    assert all(d.link_group == "" for d in devices if d.parent_uuid is not None)
    if len(physical) == 1:
        assert physical[0].link_group in ("", "link0")
    assert real_backend.driver_version()
    for device in devices:
        for value in real_backend.per_process_utilization(device.uuid).values():
            assert 0.0 <= value <= 100.0


@pytest.mark.gpu
@pytest.mark.torch
def test_real_child_allocation_shows_up_as_a_process(real_backend: NvmlBackend) -> None:
    pytest.importorskip("torch")
    devices = real_backend.devices()
    if not devices:
        pytest.skip("NVML works but reports no usable GPU")
    target = devices[0]
    before = {p.pid for p in target.processes}
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=target.uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID")
    command = [sys.executable, "-c", ALLOCATE]
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        try:
            line = child.stdout.readline().strip()
            if line == "nocuda":
                pytest.skip("torch has no CUDA")
            assert line == "ready"
            new = wait_for_new_processes(real_backend, target.uuid, before)
        finally:
            child.stdin.close()
        pids = {p.pid: p.used_memory for p in new}
        if child.pid not in pids:
            pytest.skip(
                "NVML reports PIDs of another PID namespace (a container without --pid=host)"
            )
        used = pids[child.pid]
        if used is None:
            assert target.parent_uuid is not None, "only MIG may hide per-process memory"
        else:
            assert used >= 256 * 2**20


def wait_for_new_processes(
    backend: NvmlBackend, uuid: str, before: set[int], attempts: int = 100
) -> list[GpuProcess]:
    """Sample until a process not in `before` appears on `uuid` (the driver may lag)."""
    for _ in range(attempts):
        device = by_uuid(backend.devices())[uuid]
        new = [p for p in device.processes if p.pid not in before]
        if new:
            return new
        time.sleep(0.1)
    pytest.fail(f"no new process appeared on {uuid}")
