"""The GPUQ_* environment contract between the daemon and a job.

The executor sets these variables in every job's environment; the runner and
user scripts read them through the accessors below, never by name. Each
accessor returns None (or the documented default) outside gpuq, so scripts
behave as usual when run by hand.

Variables for the `gpuq` command itself (not set in jobs):

- ``GPUQ_CONFIG``: path of the TOML configuration file.
- ``GPUQ_STATE_DIR``: overrides ``[daemon] state_dir`` (database, job dirs).
- ``GPUQ_RUNTIME_DIR``: overrides ``[daemon] runtime_dir`` (socket, lock).
- ``GPUQ_DAEMON``: which daemon a command talks to: ``auto`` (the lab's
  system daemon where its socket exists), ``lab`` or ``personal``;
  overrides ``[client] daemon``.
- ``GPUQ_LAB_SOCKET``: overrides ``[lab] socket``, where the lab's system
  daemon listens (default /run/gpuq/gpuq.sock).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

JOB_ID = "GPUQ_JOB_ID"
JOB_NAME = "GPUQ_JOB_NAME"
ARRAY_ID = "GPUQ_ARRAY_ID"
ARRAY_INDEX = "GPUQ_ARRAY_INDEX"
GPU_UUIDS = "GPUQ_GPU_UUIDS"
GPU_MEM = "GPUQ_GPU_MEM"
GPU_TYPE = "GPUQ_GPU_TYPE"
JOB_DIR = "GPUQ_JOB_DIR"
CHECKPOINT_DIR = "GPUQ_CHECKPOINT_DIR"
CONTROL_SOCKET = "GPUQ_CONTROL_SOCKET"
ATTEMPT = "GPUQ_ATTEMPT"
NODE = "GPUQ_NODE"
FAKE_GPU_DIR = "GPUQ_FAKE_GPU_DIR"
NODE_RANK = "GPUQ_NODE_RANK"
NODES = "GPUQ_NODES"

CONTRACT: dict[str, str] = {
    JOB_ID: "The job's id (an integer); unset outside gpuq.",
    JOB_NAME: "The job's name (`--name`, or the command's base name).",
    ARRAY_ID: "For array tasks, the array's own id (`gpuq cancel` of it cancels every task).",
    ARRAY_INDEX: "For array tasks, this task's index (`--array`).",
    GPU_UUIDS: "Comma-separated UUIDs of the GPUs given to the job (empty for CPU jobs).",
    GPU_MEM: "Bytes of GPU memory reserved on each shared GPU; unset for whole GPUs.",
    GPU_TYPE: "The type of the job's GPUs from their name (A100, T4...; comma-separated if mixed).",
    JOB_DIR: "The job's private directory in the daemon's state directory.",
    CHECKPOINT_DIR: "Where the job should keep checkpoints; survives suspend and retry.",
    CONTROL_SOCKET: (
        "The job's control socket (a Unix socket of the daemon): gpuq.runner connects to it "
        "to report metrics and to receive suspend and resume requests."
    ),
    ATTEMPT: "1 for the first run, 2 for the first retry, and so on.",
    NODE: "Name of the server the job runs on.",
    NODE_RANK: "In a multi-node job (`--nodes N`), this part's rank, 0 to N-1.",
    NODES: "In a multi-node job, its servers, rank 0 first, comma-separated.",
    FAKE_GPU_DIR: (
        "On fake GPUs only: where the daemon publishes each GPU's load (jobs computing on "
        "it, their slowdown, memory used), for jobs that emulate a GPU's work."
    ),
    "CUDA_VISIBLE_DEVICES": "Set to the GPU UUIDs, so CUDA sees only the job's GPUs.",
    "CUDA_DEVICE_ORDER": "Set to PCI_BUS_ID, so device order matches nvidia-smi.",
}
"""Every variable a job sees, with its meaning (rendered into the man pages)."""

RENDEZVOUS: dict[str, str] = {
    "MASTER_ADDR": "Address of the rank-0 part's server, as the other servers reach it.",
    "MASTER_PORT": "A port for the rendezvous, from 20000 to 31999 (job id and attempt).",
    "NODE_RANK": "This part's rank among the job's servers, 0 to N-1.",
    "WORLD_SIZE": "The number of parts (servers); torchrun sets its own for its workers.",
    "RANK": "The same as NODE_RANK: one process per server, as started by gpuq.",
    "LOCAL_RANK": "0: the part is the only process gpuq starts on its server.",
    "PET_NNODES": "For torchrun (--nnodes): the number of servers.",
    "PET_NODE_RANK": "For torchrun (--node-rank): this part's rank.",
    "PET_MASTER_ADDR": "For torchrun (--master-addr): as MASTER_ADDR.",
    "PET_MASTER_PORT": "For torchrun (--master-port): as MASTER_PORT.",
    "PET_NPROC_PER_NODE": "For torchrun (--nproc-per-node): the part's GPU count.",
}
"""What a multi-node job's parts get besides the contract, so `torchrun train.py` needs no flags.

Set only for `--nodes N` jobs (they override a captured value); a
single-server job keeps whatever its submitter's environment had.
"""


def _get(environ: Mapping[str, str] | None, name: str) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    return value if value else None


def _get_int(environ: Mapping[str, str] | None, name: str) -> int | None:
    value = _get(environ, name)
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def job_id(environ: Mapping[str, str] | None = None) -> int | None:
    """The id of the job this process belongs to, or None outside gpuq."""
    return _get_int(environ, JOB_ID)


def job_name(environ: Mapping[str, str] | None = None) -> str | None:
    """The job's name, or None outside gpuq."""
    return _get(environ, JOB_NAME)


def array_id(environ: Mapping[str, str] | None = None) -> int | None:
    """The id of the array this task belongs to, or None."""
    return _get_int(environ, ARRAY_ID)


def array_index(environ: Mapping[str, str] | None = None) -> int | None:
    """This array task's index, or None when the job is not an array task."""
    return _get_int(environ, ARRAY_INDEX)


def gpu_uuids(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """UUIDs of the GPUs given to the job; empty outside gpuq or for CPU jobs."""
    value = _get(environ, GPU_UUIDS)
    return tuple(u for u in value.split(",") if u) if value else ()


def gpu_type(environ: Mapping[str, str] | None = None) -> str | None:
    """The type of the job's GPUs (`gpuq.gputypes`), or None outside gpuq or without GPUs."""
    return _get(environ, GPU_TYPE)


def gpu_mem(environ: Mapping[str, str] | None = None) -> int | None:
    """Bytes reserved per shared GPU, or None for whole GPUs and outside gpuq."""
    return _get_int(environ, GPU_MEM)


def job_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The job's private directory, or None outside gpuq."""
    return _get(environ, JOB_DIR)


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Directory for checkpoints that outlive suspend and retry, or None."""
    return _get(environ, CHECKPOINT_DIR)


def control_socket(environ: Mapping[str, str] | None = None) -> str | None:
    """Path of the job's control socket to the daemon, or None."""
    return _get(environ, CONTROL_SOCKET)


def attempt(environ: Mapping[str, str] | None = None) -> int:
    """1 on the first run of a job, 2 on its first retry; 1 outside gpuq."""
    return _get_int(environ, ATTEMPT) or 1


def node(environ: Mapping[str, str] | None = None) -> str | None:
    """The name of the server running the job, or None outside gpuq."""
    return _get(environ, NODE)


def fake_gpu_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the fake GPUs' load is published (`gpuq.gpus.fakeload`); None on real GPUs."""
    return _get(environ, FAKE_GPU_DIR)
