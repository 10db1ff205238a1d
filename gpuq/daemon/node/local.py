"""`LocalNode`: this machine, as the daemon's `Node`.

It puts together what runs jobs here: the executor (shims started through
the spawner, signals to a job's whole tree, exit records, leftovers after a
crash), the job directories, the GPU backend (NVML or fake GPUs) and the
per-job control sockets. GPU samples are taken in a worker thread: NVML
calls block.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpuq.daemon import jobfiles
from gpuq.daemon.control import ControlHub
from gpuq.daemon.executor import Executor, LaunchSpec, OnSpawned, Outcome
from gpuq.gpus import GpuBackend, JobHolding
from gpuq.models import GpuInfo


class LocalNode:
    """This machine's jobs, GPUs and control channels (module docstring)."""

    def __init__(
        self,
        name: str,
        executor: Executor,
        backend: GpuBackend,
        control: ControlHub,
        device_env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.executor = executor
        self.backend = backend
        self.control = control
        self._device_env = dict(device_env or {})

    def device_env(self) -> dict[str, str]:
        """What jobs learn of their devices beyond the GPU UUIDs (fake GPUs: their load)."""
        return dict(self._device_env)

    @property
    def gpu_backend(self) -> str:
        """The kind of GPU backend: "nvml" or "fake"."""
        return self.backend.kind

    def job_dir(self, job_id: int) -> Path:
        """The job's directory (created on first use)."""
        return self.executor.job_dir(job_id)

    def launch(self, job_id: int, spec: LaunchSpec, on_spawned: OnSpawned) -> None:
        """Start an attempt through the spawner; raises OSError if its files cannot be written."""
        self.executor.launch(job_id, spec, on_spawned)

    def watch(
        self,
        job_id: int,
        pid: int,
        on_exit: Callable[[int, Outcome], None],
        pidfd: int | None = None,
    ) -> None:
        """Call `on_exit(job_id, outcome)` when the shim ends (through its pidfd)."""
        self.executor.watch(asyncio.get_running_loop(), job_id, pid, on_exit, pidfd)

    def unwatch_all(self) -> None:
        """Stop watching every shim (daemon shutdown; the jobs run on)."""
        self.executor.unwatch_all(asyncio.get_running_loop())

    def signal(self, job_id: int, signum: int) -> bool:
        """Signal the job's process group and every descendant of its shim."""
        return self.executor.signal(job_id, signum)

    def outcome(self, job_id: int) -> Outcome:
        """How the attempt ended, from its shim's exit record."""
        return self.executor.outcome(job_id)

    def live_shim(self, job_id: int, settle: float = 10.0) -> int | None:
        """The pid of the job's shim if it still runs (start time and boot id checked)."""
        return self.executor.live_shim(job_id, settle)

    def has_exit_record(self, job_id: int) -> bool:
        """True once the shim has recorded how the attempt ended."""
        return self.executor.has_exit_record(job_id)

    def has_shim_record(self, job_id: int) -> bool:
        """True once the shim has recorded itself."""
        return self.executor.has_shim_record(job_id)

    def kill_leftovers(self, job_id: int, timeout: float = 10.0) -> list[int]:
        """Kill what is left of an attempt whose shim is gone; the pids that survived."""
        return self.executor.kill_leftovers(job_id, timeout)

    def read_record(self, job_id: int, name: str) -> dict[str, Any] | None:
        """A JSON record in the job's directory (`gpuq.daemon.jobfiles`), or None."""
        return jobfiles.read_json(self.executor.jobs_dir / str(job_id) / name)

    def remove_job_files(self, job_id: int) -> None:
        """Delete the job's directory, whatever is in it."""
        shutil.rmtree(self.executor.jobs_dir / str(job_id), ignore_errors=True)

    async def sample_gpus(self, holdings: Mapping[int, JobHolding]) -> list[GpuInfo]:
        """Tell the backend who holds what, then read every GPU in a worker thread."""
        self.backend.observe(holdings)
        return await asyncio.to_thread(self.backend.devices)

    def close(self) -> None:
        """Close the control sockets and the GPU backend."""
        self.control.close_all()
        self.backend.close()
