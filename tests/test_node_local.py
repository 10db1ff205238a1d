"""`LocalNode`: this machine behind the daemon's `Node` interface (gpuq/daemon/node/)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gpuq.daemon import jobfiles
from gpuq.daemon.control import ControlHub
from gpuq.daemon.executor import Executor
from gpuq.daemon.node.interface import Node
from gpuq.daemon.node.local import LocalNode
from gpuq.gpus import FakeGpuDecl, GpuConfig, JobHolding, make_backend

GIB = 1024**3


def local_node(tmp_path: Path) -> LocalNode:
    backend = make_backend(
        GpuConfig(backend="fake", node="lab1", fake=(FakeGpuDecl("Fake", 8 * GIB, count=2),))
    )
    return LocalNode("lab1", Executor(tmp_path / "jobs"), backend, ControlHub(tmp_path / "ctl"))


def test_a_local_node_is_a_node(tmp_path: Path) -> None:
    node: Node = local_node(tmp_path)  # checked by mypy: LocalNode implements the protocol
    assert (node.name, node.gpu_backend) == ("lab1", "fake")


def test_gpu_samples_show_each_job_on_the_gpus_it_holds(tmp_path: Path) -> None:
    node = local_node(tmp_path)
    first, second = asyncio.run(node.sample_gpus({}))
    holding = {7: JobHolding(pid=4321, gpu_uuids=(second.uuid,), memory=GIB)}
    first, second = asyncio.run(node.sample_gpus(holding))
    assert first.processes == ()
    assert [(p.pid, p.used_memory) for p in second.processes] == [(4321, GIB)]
    first, second = asyncio.run(node.sample_gpus({}))  # the job ended: its memory went with it
    assert second.processes == ()


def test_records_are_read_from_the_jobs_directory_and_removed_with_it(tmp_path: Path) -> None:
    node = local_node(tmp_path)
    assert node.read_record(3, jobfiles.SHIM) is None
    (node.job_dir(3) / jobfiles.SHIM).write_text(json.dumps({"pid": 12}))
    ack = node.job_dir(3) / jobfiles.CHECKPOINTS / "ack.json"
    ack.write_text(json.dumps({"step": 5}))
    assert node.read_record(3, jobfiles.SHIM) == {"pid": 12}
    assert node.read_record(3, f"{jobfiles.CHECKPOINTS}/ack.json") == {"step": 5}
    node.remove_job_files(3)
    assert not (tmp_path / "jobs" / "3").exists()
    assert node.read_record(3, jobfiles.SHIM) is None
