"""Tests of the fake GPU backend and of the backend factory's filtering."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuq.errors import ConfigError
from gpuq.gpus import FakeGpuDecl, GpuConfig, JobHolding, make_backend
from gpuq.gpus.fake import FakeBackend, fake_uuid
from gpuq.gpus.fakeload import DeviceLoad, JobDevices, slowdown
from gpuq.models import GpuProcess

GIB = 1024**3
UUID_RE = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


TWO_KINDS = GpuConfig(
    backend="fake",
    node="lab1",
    fake=(
        FakeGpuDecl(name="Fake 24G", memory=24 * GIB, count=2),
        FakeGpuDecl(name="Fake 80G", memory=80 * GIB, foreign_memory=GIB, foreign_pid=4242),
    ),
)
"""Two 24 GiB GPUs, then an 80 GiB one with 1 GiB held by a foreign process."""


def two_kinds(**overrides: Any) -> GpuConfig:
    return dataclasses.replace(TWO_KINDS, **overrides)


def fake_backend(config: GpuConfig) -> FakeBackend:
    backend = make_backend(config)
    assert isinstance(backend, FakeBackend)
    return backend


def test_declared_gpus_appear_in_order_with_their_sizes() -> None:
    devices = fake_backend(two_kinds()).devices()
    assert [(d.index, d.name, d.memory_total) for d in devices] == [
        (0, "Fake 24G", 24 * GIB),
        (1, "Fake 24G", 24 * GIB),
        (2, "Fake 80G", 80 * GIB),
    ]
    assert all(d.node == "lab1" and d.parent_uuid is None for d in devices)
    assert all(UUID_RE.match(d.uuid) for d in devices)
    assert len({d.uuid for d in devices}) == 3


def test_uuids_are_stable_across_backends_and_depend_on_node() -> None:
    first = [d.uuid for d in fake_backend(two_kinds()).devices()]
    again = [d.uuid for d in fake_backend(two_kinds()).devices()]
    other_node = [d.uuid for d in fake_backend(two_kinds(node="lab2")).devices()]
    assert first == again == [fake_uuid("lab1", i) for i in range(3)]
    assert not set(first) & set(other_node)


def test_uuids_are_stable_across_processes() -> None:
    code = "from gpuq.gpus.fake import fake_uuid; print(fake_uuid('lab1', 2))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == fake_uuid("lab1", 2)


def test_idle_gpus_report_only_foreign_memory() -> None:
    devices = fake_backend(two_kinds()).devices()
    assert [d.memory_used for d in devices] == [0, 0, GIB]
    assert [d.processes for d in devices] == [(), (), (GpuProcess(4242, GIB),)]
    assert [d.utilization for d in devices] == [0.0, 0.0, 0.0]


def test_attach_and_detach_change_memory_processes_and_utilization() -> None:
    backend = fake_backend(two_kinds())
    first, _, big = (d.uuid for d in backend.devices())
    backend.attach(first, 100, 3 * GIB)
    backend.attach(big, 100, 2 * GIB)
    backend.attach(big, 101, GIB)
    devices = {d.uuid: d for d in backend.devices()}
    assert devices[first].memory_used == 3 * GIB
    assert devices[first].processes == (GpuProcess(100, 3 * GIB),)
    assert devices[first].utilization == 100.0
    assert devices[big].memory_used == GIB + 2 * GIB + GIB
    assert {p.pid for p in devices[big].processes} == {4242, 100, 101}

    backend.detach(100)
    backend.detach(100)  # reaping twice is harmless
    devices = {d.uuid: d for d in backend.devices()}
    assert devices[first].memory_used == 0
    assert devices[first].processes == ()
    assert devices[first].utilization == 0.0
    assert devices[big].processes == (GpuProcess(4242, GIB), GpuProcess(101, GIB))


def test_observed_jobs_show_as_their_processes_until_they_are_no_longer_held() -> None:
    backend = fake_backend(two_kinds())
    first, second, _ = (d.uuid for d in backend.devices())
    backend.observe({1: JobHolding(100, (first, second), 3 * GIB), 2: JobHolding(200, (second,))})
    devices = {d.uuid: d for d in backend.devices()}
    assert devices[first].processes == (GpuProcess(100, 3 * GIB),)
    assert devices[second].processes == (GpuProcess(100, 3 * GIB), GpuProcess(200, 0))

    # Job 1 ended, job 2 was restarted under another process: the GPUs follow.
    backend.observe({2: JobHolding(201, (second,))})
    devices = {d.uuid: d for d in backend.devices()}
    assert devices[first].processes == ()
    assert devices[second].processes == (GpuProcess(201, 0),)
    backend.observe({})
    devices = {d.uuid: d for d in backend.devices()}
    assert devices[first].processes == devices[second].processes == ()


def test_nvml_learns_nothing_from_observed_jobs() -> None:
    from gpuq.gpus.nvml import NvmlBackend

    NvmlBackend().observe({1: JobHolding(100, ("GPU-x",))})  # no NVML call, no error


def test_attaching_a_pid_again_replaces_its_memory() -> None:
    backend = fake_backend(two_kinds())
    uuid = backend.devices()[0].uuid
    backend.attach(uuid, 7, GIB)
    backend.attach(uuid, 7, 5 * GIB)
    assert backend.devices()[0].processes == (GpuProcess(7, 5 * GIB),)


def test_memory_used_never_exceeds_the_device() -> None:
    backend = fake_backend(two_kinds())
    uuid = backend.devices()[0].uuid
    backend.attach(uuid, 7, 20 * GIB)
    backend.attach(uuid, 8, 20 * GIB)
    assert backend.devices()[0].memory_used == 24 * GIB


def test_attach_rejects_unknown_devices_and_bad_values() -> None:
    backend = fake_backend(two_kinds())
    with pytest.raises(ValueError, match="no fake GPU GPU-nope; known: GPU-"):
        backend.attach("GPU-nope", 1, GIB)
    with pytest.raises(ValueError, match="positive pid"):
        backend.attach(backend.devices()[0].uuid, 0, GIB)


@pytest.mark.parametrize(
    ("decl", "problem"),
    [
        (FakeGpuDecl(count=-1), "count"),
        (FakeGpuDecl(memory=0), "memory must be positive"),
        (FakeGpuDecl(memory=GIB, foreign_memory=2 * GIB), "foreign_memory"),
        (FakeGpuDecl(foreign_memory=GIB, foreign_pid=0), "foreign_pid"),
        (FakeGpuDecl(utilization=101.0), "utilization"),
        (FakeGpuDecl(share_slowdown=0.9), "share_slowdown"),
    ],
)
def test_bad_declarations_are_config_errors(decl: FakeGpuDecl, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        make_backend(GpuConfig(backend="fake", fake=(decl,)))


def test_state_file_adds_foreign_process_and_utilization_at_run_time(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = fake_backend(two_kinds(fake_state_file=str(state)))
    uuid = backend.devices()[1].uuid
    assert backend.devices()[1].memory_used == 0  # no file yet: nothing changes

    state.write_text(
        json.dumps({uuid: {"foreign": [{"pid": 555, "memory": 2 * GIB}], "utilization": 40}})
    )
    device = backend.devices()[1]
    assert device.processes == (GpuProcess(555, 2 * GIB),)
    assert device.memory_used == 2 * GIB
    assert device.utilization == 40.0

    state.write_text("{}")
    assert backend.devices()[1].processes == ()
    assert backend.warnings == []


def test_state_file_foreign_processes_add_to_declared_ones(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = fake_backend(two_kinds(fake_state_file=str(state)))
    uuid = backend.devices()[2].uuid
    state.write_text(json.dumps({uuid: {"foreign": [{"pid": 555, "memory": GIB}]}}))
    device = backend.devices()[2]
    assert device.processes == (GpuProcess(4242, GIB), GpuProcess(555, GIB))
    assert device.memory_used == 2 * GIB


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"GPU-unknown": {}}',
        '{"@": {"foreign": [{"pid": 0, "memory": 1}]}}',
        '{"@": {"foreign": [{"pid": 5, "memory": "1G"}]}}',
        '{"@": {"foreign": {"pid": 5}}}',
        '{"@": {"utilization": 150}}',
        '{"@": {"utilization": true}}',
        '{"@": {"colour": "blue"}}',
        b"\xff\xfe\x00",
    ],
)
def test_malformed_state_file_is_ignored_with_one_warning(
    tmp_path: Path, content: str | bytes
) -> None:
    state = tmp_path / "state.json"
    backend = fake_backend(two_kinds(fake_state_file=str(state)))
    uuid = backend.devices()[0].uuid
    if isinstance(content, bytes):
        state.write_bytes(content)
    else:
        state.write_text(content.replace("@", uuid))
    first = backend.devices()
    second = backend.devices()
    assert first == second == fake_backend(two_kinds()).devices()
    assert len(backend.warnings) == 1
    assert backend.warnings[0].startswith(f"fake GPU state file {state} is malformed, ignored")


def test_state_file_warning_comes_back_after_a_clean_read(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    backend = fake_backend(two_kinds(fake_state_file=str(state)))
    state.write_text("oops")
    backend.devices()
    state.write_text("{}")
    backend.devices()
    state.write_text("oops")
    backend.devices()
    assert len(backend.warnings) == 2


@pytest.mark.parametrize(
    ("include", "exclude", "kept"),
    [
        ((), (), [0, 1, 2]),
        (("1",), (), [1]),
        (("@2", "0"), (), [0, 2]),
        ((), ("1",), [0, 2]),
        ((), ("@0", "2"), [1]),
        (("0", "1"), ("@1",), [0]),
    ],
)
def test_include_and_exclude_by_uuid_or_index(
    include: tuple[str, ...], exclude: tuple[str, ...], kept: list[int]
) -> None:
    def resolve(entries: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(fake_uuid("lab1", int(e[1:])) if e.startswith("@") else e for e in entries)

    backend = make_backend(two_kinds(include=resolve(include), exclude=resolve(exclude)))
    assert [d.index for d in backend.devices()] == kept


def test_unknown_include_is_a_config_error_listing_known_uuids() -> None:
    with pytest.raises(ConfigError, match="unknown GPU in gpus.include: 'GPU-x', '7'") as info:
        make_backend(two_kinds(include=("0", "GPU-x", "7")))
    for index in range(3):
        assert fake_uuid("lab1", index) in info.value.message
    assert info.value.hint


def test_unknown_exclude_is_harmless() -> None:
    assert len(make_backend(two_kinds(exclude=("GPU-gone", "9"))).devices()) == 3


def test_auto_with_fake_gpus_declared_gives_the_fake_backend() -> None:
    backend = make_backend(two_kinds(backend="auto"))
    assert isinstance(backend, FakeBackend)
    assert backend.kind == "fake"
    assert len(backend.devices()) == 3


def test_unknown_backend_kind_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match="known: auto, nvml, fake"):
        make_backend(GpuConfig(backend="cuda"))


def test_fake_without_declarations_has_no_devices() -> None:
    backend = make_backend(GpuConfig(backend="fake"))
    assert backend.devices() == []
    assert backend.driver_version() == "fake"
    backend.close()


# Sharing: utilization per computing job, and the load jobs emulating a GPU read.

SHARED = GpuConfig(
    backend="fake",
    fake=(FakeGpuDecl(name="Fake 40G", memory=40 * GIB, utilization=30.0, share_slowdown=2.8),),
)


def test_each_computing_job_adds_its_utilization_and_a_waiting_one_none() -> None:
    backend = fake_backend(SHARED)
    uuid = backend.devices()[0].uuid
    backend.observe({1: JobHolding(100, (uuid,), 12 * GIB)})
    assert backend.devices()[0].utilization == 30.0
    backend.observe({1: JobHolding(100, (uuid,), 12 * GIB), 2: JobHolding(200, (uuid,), GIB)})
    assert backend.devices()[0].utilization == 60.0
    parked = JobHolding(200, (uuid,), 512 * 1024**2, computing=False)
    backend.observe({1: JobHolding(100, (uuid,), 12 * GIB), 2: parked})
    device = backend.devices()[0]
    assert device.utilization == 30.0
    assert device.processes == (GpuProcess(100, 12 * GIB), GpuProcess(200, 512 * 1024**2))


def test_the_published_load_tells_jobs_their_slowdown_and_their_room(tmp_path: Path) -> None:
    backend = fake_backend(SHARED)
    backend.publish_to(tmp_path / "load")
    uuid = backend.devices()[0].uuid
    mine = JobDevices(tmp_path / "load", (uuid,), reserved=12 * GIB)
    assert mine.slowdown() == 1.0 and mine.room() == 40 * GIB

    backend.observe({1: JobHolding(100, (uuid,), 12 * GIB)})
    backend.devices()
    assert mine.slowdown() == 1.0, "alone"
    backend.observe({1: JobHolding(100, (uuid,), 12 * GIB), 2: JobHolding(200, (uuid,), 12 * GIB)})
    backend.devices()
    assert mine.slowdown() == pytest.approx(2.8)
    assert mine.room() == 28 * GIB, "40G less what the other job holds"
    load = DeviceLoad.read(tmp_path / "load" / f"{uuid}.json")
    assert load is not None
    assert (load.memory_total, load.memory_used, load.computing) == (40 * GIB, 24 * GIB, 2)


def test_a_load_older_than_the_jobs_turn_is_not_trusted(tmp_path: Path) -> None:
    backend = fake_backend(SHARED)
    backend.publish_to(tmp_path)
    uuid = backend.devices()[0].uuid
    mine = JobDevices(tmp_path, (uuid,))
    assert mine.room(after=time.time() + 60) is None
    assert JobDevices.from_env({}) is None, "outside gpuq, or on real GPUs"


@pytest.mark.parametrize(
    ("computing", "share_slowdown", "expected"),
    [(0, 2.8, 1.0), (1, 2.8, 1.0), (2, 2.8, 2.8), (3, 1.5, 2.0)],
)
def test_the_slowdown_grows_with_each_job_computing_at_once(
    computing: int, share_slowdown: float, expected: float
) -> None:
    assert slowdown(computing, share_slowdown) == pytest.approx(expected)


def test_declared_link_groups_are_reported_per_gpu(tmp_path: Path) -> None:
    config = tmp_path / "gpuq.toml"
    config.write_text(
        '[[gpus.fake]]\ncount = 2\nlink_group = "switch0"\n'
        "[[gpus.fake]]\ncount = 1\n"
        '[[gpus.fake]]\ncount = 1\nlink_group = "switch0"\n'
    )
    from gpuq.config import load_config

    backend = fake_backend(load_config(str(config)).gpus)
    assert [d.link_group for d in backend.devices()] == ["switch0", "switch0", "", "switch0"]
    assert backend.devices()[0].to_dict()["link_group"] == "switch0"
