"""The `Node` interface: what the daemon needs from a server to run jobs on it.

Launch a job's attempt and be told when it ends; signal it (its whole
process tree: stop-mode suspend and resume are SIGSTOP and SIGCONT), and
suspend or resume its runner over the control channel (park, checkpoint);
find what a crash left behind
(recovery); read the records a job's shim and runner leave; sample the
server's GPUs; and talk to a job's `gpuq.runner` over its control channel.
Everything a node does is about one attempt of one job, named by job id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gpuq.control import Hello, Message
from gpuq.daemon.executor import LaunchSpec, OnSpawned, Outcome
from gpuq.gpus import JobHolding
from gpuq.models import GpuInfo


class ControlChannel(Protocol):
    """The per-job control channel to a job's `gpuq.runner` (`gpuq.daemon.control`)."""

    def open(self, job_id: int) -> Path | None:
        """Open the job's channel; where its runner connects, or None if it cannot be."""
        ...

    def close(self, job_id: int) -> None:
        """Close the job's channel."""
        ...

    def close_all(self) -> None:
        """Close every channel (daemon shutdown; runners reconnect to the next daemon)."""
        ...

    def runner(self, job_id: int) -> Hello | None:
        """The hello of the job's connected runner, or None."""
        ...

    def send(self, job_id: int, message: Message) -> bool:
        """Send a message to the job's runner; False if none is connected."""
        ...


class Node(Protocol):
    """A server the daemon runs jobs on (module docstring)."""

    name: str

    @property
    def control(self) -> ControlChannel:
        """The node's per-job control channels."""
        ...

    @property
    def gpu_backend(self) -> str:
        """The kind of GPU backend: "nvml" or "fake"."""
        ...

    def job_dir(self, job_id: int) -> Path:
        """The job's directory on this node (created on first use)."""
        ...

    def device_env(self) -> dict[str, str]:
        """Variables jobs get about their devices beyond the GPU UUIDs (`GPUQ_FAKE_GPU_DIR`)."""
        ...

    def launch(self, job_id: int, spec: LaunchSpec, on_spawned: OnSpawned) -> None:
        """Start an attempt; `on_spawned` is called with its shim's pid (or an error)."""
        ...

    def watch(
        self,
        job_id: int,
        pid: int,
        on_exit: Callable[[int, Outcome], None],
        pidfd: int | None = None,
    ) -> None:
        """Call `on_exit(job_id, outcome)` when the attempt's shim ends."""
        ...

    def unwatch_all(self) -> None:
        """Stop watching every attempt (daemon shutdown; the jobs run on)."""
        ...

    def signal(self, job_id: int, signum: int) -> bool:
        """Signal the attempt's whole process tree; False if it has no process group yet."""
        ...

    def outcome(self, job_id: int) -> Outcome:
        """How the attempt ended, from its shim's exit record."""
        ...

    def live_shim(self, job_id: int, settle: float = 10.0) -> int | None:
        """The pid of the attempt's shim if it still runs (verified), else None."""
        ...

    def has_exit_record(self, job_id: int) -> bool:
        """True once the attempt's shim has recorded how it ended."""
        ...

    def has_shim_record(self, job_id: int) -> bool:
        """True once the attempt's shim has recorded itself."""
        ...

    def kill_leftovers(self, job_id: int, timeout: float = 10.0) -> list[int]:
        """Kill what is left of an attempt whose shim is gone; the pids that survived."""
        ...

    def read_record(self, job_id: int, name: str) -> dict[str, Any] | None:
        """A JSON record the job's shim or runner left (`gpuq.daemon.jobfiles`), or None."""
        ...

    def remove_job_files(self, job_id: int) -> None:
        """Delete the job's directory (`gpuq clean`)."""
        ...

    async def sample_gpus(self, holdings: Mapping[int, JobHolding]) -> list[GpuInfo]:
        """The node's GPUs now, told first which jobs hold which (off the event loop)."""
        ...

    def close(self) -> None:
        """Release the node's resources (GPU backend, control sockets)."""
        ...
