"""`GangNode`: a multi-node job's attempt, run as one part on each of its servers.

A job submitted with `--nodes N` runs one process (a part) on each of N
servers, each with its share of the job's GPUs. The rest of the daemon
sees one node and one attempt: lifecycle, cancel, suspend and recovery call
the `Node` interface as for any job, and this class carries each call out
on every part.

- **Launch**: each part gets the job's launch record with its own GPUs,
  job directory, device variables and output files (rank 0 the job's;
  rank r the same paths with `.partR` added), plus the rendezvous
  environment of `gpuq.env.RENDEZVOUS` (MASTER_ADDR is rank 0's server as
  the others reach it). The attempt has started once every part has; if
  one cannot start, the others are killed and the start fails with that
  part's reason.
- **End**: the attempt ends once every part has ended. The first part to
  fail (a non-zero exit, a signal, a time limit, its server lost) ends the
  others: they get SIGTERM at once and SIGKILL after the kill grace, and
  the job's outcome is that part's, its reason naming the part ("part 1 on
  gpu2: exited with code 3"). All parts exiting 0 is a success.
- **Signals** (cancel, stop-mode suspend and resume) go to every part.
  Parts have no control channel: a multi-node job is never checkpointed,
  preempted, resized or moved by gpuq, and its `gpuq.runner` (if any) runs
  without one.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuq import env as job_env
from gpuq.control import Hello, Message
from gpuq.daemon.executor import LaunchSpec, OnSpawned, Outcome
from gpuq.daemon.node.interface import Node
from gpuq.daemon.node.remote import RemoteNode
from gpuq.daemon.spawner import Spawned
from gpuq.gpus import JobHolding
from gpuq.models import GpuInfo

log = logging.getLogger(__name__)

PORT_BASE = 20000
PORT_SPAN = 12000
"""Rendezvous ports are taken from 20000-31999: below Linux's ephemeral range."""

PartOutputs = Callable[[str, int], tuple[str, str, dict[str, str]]]
"""(node name, rank) -> the part's stdout, stderr and directories it may create."""


def rendezvous_port(job_id: int, attempt: int) -> int:
    """The attempt's MASTER_PORT: fixed by job id and attempt, so every part agrees."""
    return PORT_BASE + (job_id * 8 + attempt) % PORT_SPAN


def part_path(path: str, rank: int) -> str:
    """Where part `rank` writes what the job writes to `path` (rank 0: `path` itself)."""
    return path if rank == 0 else f"{path}.part{rank}"


def address_toward(peer: str) -> str:
    """This machine's address on the route to `peer` (an IP): what `peer` sees it as.

    A UDP socket's connect chooses the route and source address without
    sending anything.
    """
    family = socket.AF_INET6 if ":" in peer else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((peer, 9))
        return str(probe.getsockname()[0])


class NoControl:
    """The control channel of a multi-node job: there is none (module docstring)."""

    def open(self, job_id: int) -> Path | None:
        """No socket: parts run without a control channel."""
        return None

    def close(self, job_id: int) -> None:
        """Nothing to close."""

    def close_all(self) -> None:
        """Nothing to close."""

    def runner(self, job_id: int) -> Hello | None:
        """No runner is ever connected."""
        return None

    def send(self, job_id: int, message: Message) -> bool:
        """Nothing can be sent."""
        return False


@dataclass(frozen=True, slots=True)
class Part:
    """One server's share of a multi-node job: its node, rank and GPUs."""

    node: Node
    rank: int
    gpu_uuids: tuple[str, ...]


class GangNode:
    """One attempt of a multi-node job, as a `Node` (module docstring)."""

    def __init__(
        self,
        parts: Sequence[Part],
        master_addr: str,
        outputs: PartOutputs,
        kill_grace: Callable[[], float],
    ) -> None:
        self.parts = tuple(parts)
        self.name = ",".join(part.node.name for part in self.parts)
        self.master_addr = master_addr
        self._outputs = outputs
        self._kill_grace = kill_grace
        self._control = NoControl()
        self._spawned: dict[int, Spawned] = {}
        self._ended: dict[int, Outcome] = {}
        self._failure: tuple[Part, Outcome] | None = None
        self._on_exit: Callable[[int, Outcome], None] | None = None
        self._kill_timer: asyncio.TimerHandle | None = None

    @property
    def control(self) -> NoControl:
        """No control channel (module docstring)."""
        return self._control

    @property
    def gpu_backend(self) -> str:
        """Rank 0's server's GPU backend."""
        return self.parts[0].node.gpu_backend

    def job_dir(self, job_id: int) -> Path:
        """The job's directory on rank 0's server."""
        return self.parts[0].node.job_dir(job_id)

    def device_env(self) -> dict[str, str]:
        """Rank 0's device variables (each part gets its own server's at launch)."""
        return self.parts[0].node.device_env()

    # -- launch -------------------------------------------------------------

    def part_spec(self, job_id: int, spec: LaunchSpec, part: Part) -> LaunchSpec:
        """The launch record of one part: its GPUs, directories, outputs and rendezvous."""
        environ = dict(spec.env)
        for name in self.parts[0].node.device_env():
            environ.pop(name, None)
        uuids = ",".join(part.gpu_uuids)
        job_dir = part.node.job_dir(job_id)
        attempt = int(environ.get(job_env.ATTEMPT, "1"))
        rank, count = str(part.rank), str(len(self.parts))
        port = str(rendezvous_port(job_id, attempt))
        environ.update(part.node.device_env())
        environ.update(
            {
                job_env.GPU_UUIDS: uuids,
                "CUDA_VISIBLE_DEVICES": uuids,
                job_env.JOB_DIR: str(job_dir),
                job_env.CHECKPOINT_DIR: str(job_dir / "checkpoints"),
                job_env.NODE: part.node.name,
                job_env.NODE_RANK: rank,
                job_env.NODES: self.name,
                "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": port,
                "NODE_RANK": rank,
                "RANK": rank,
                "LOCAL_RANK": "0",
                "WORLD_SIZE": count,
                "PET_NNODES": count,
                "PET_NODE_RANK": rank,
                "PET_MASTER_ADDR": self.master_addr,
                "PET_MASTER_PORT": port,
                "PET_NPROC_PER_NODE": str(max(1, len(part.gpu_uuids))),
            }
        )
        environ.pop(job_env.CONTROL_SOCKET, None)
        stdout, stderr, below = self._outputs(part.node.name, part.rank)
        return replace(
            spec,
            env=environ,
            stdout=part_path(stdout, part.rank),
            stderr=part_path(stderr, part.rank),
            create_below={part_path(path, part.rank): top for path, top in below.items()},
        )

    def launch(self, job_id: int, spec: LaunchSpec, on_spawned: OnSpawned) -> None:
        """Start every part; `on_spawned` is called once all have answered (module docstring)."""
        self._spawned.clear()
        for part in self.parts:
            rank = part.rank

            def spawned(answer: Spawned, rank: int = rank) -> None:
                self._part_spawned(job_id, rank, answer, on_spawned)

            try:
                part.node.launch(job_id, self.part_spec(job_id, spec, part), spawned)
            except (OSError, RuntimeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                spawned(Spawned(None, None, why))

    def _part_spawned(self, job_id: int, rank: int, answer: Spawned, on_spawned: OnSpawned) -> None:
        self._spawned[rank] = answer
        if len(self._spawned) < len(self.parts):
            return
        failed = [r for r, s in sorted(self._spawned.items()) if s.pid is None]
        if not failed:
            on_spawned(Spawned(self._spawned[0].pid, None))
            return
        for part in self.parts:
            if part.rank not in failed:
                part.node.signal(job_id, signal.SIGKILL)
        part = self.parts[failed[0]]
        why = self._spawned[part.rank].error
        on_spawned(Spawned(None, None, f"part {part.rank} on {part.node.name}: {why}"))

    # -- the end ------------------------------------------------------------

    def watch(
        self,
        job_id: int,
        pid: int,
        on_exit: Callable[[int, Outcome], None],
        pidfd: int | None = None,
    ) -> None:
        """Watch every part; `on_exit` gets the attempt's outcome once all have ended."""
        self._on_exit = on_exit
        self._ended.clear()
        for part in self.parts:
            spawned = self._spawned.get(part.rank)
            part_pid = spawned.pid if spawned is not None and spawned.pid else 0
            part_fd = spawned.pidfd if spawned is not None else None

            def ended(jid: int, outcome: Outcome, part: Part = part) -> None:
                self._part_ended(jid, part, outcome)

            part.node.watch(job_id, part_pid, ended, part_fd)

    def _part_ended(self, job_id: int, part: Part, outcome: Outcome) -> None:
        self._ended[part.rank] = outcome
        if self._failure is None and _failed(outcome):
            self._failure = (part, outcome)
            others = [p for p in self.parts if p.rank not in self._ended]
            if others:
                log.info(
                    "job %d: part %d on %s ended (%s): stopping the other parts",
                    job_id,
                    part.rank,
                    part.node.name,
                    outcome.reason or outcome.exit_code,
                )
                self._stop(job_id, others)
        if len(self._ended) < len(self.parts):
            return
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        on_exit, self._on_exit = self._on_exit, None
        if on_exit is not None:
            on_exit(job_id, self.combined())

    def _stop(self, job_id: int, parts: Sequence[Part]) -> None:
        """TERM the parts still running now, and KILL them after the kill grace."""
        for part in parts:
            part.node.signal(job_id, signal.SIGTERM)
            part.node.signal(job_id, signal.SIGCONT)

        def kill() -> None:
            for part in parts:
                if part.rank not in self._ended:
                    part.node.signal(job_id, signal.SIGKILL)

        self._kill_timer = asyncio.get_running_loop().call_later(self._kill_grace(), kill)

    def combined(self) -> Outcome:
        """The attempt's outcome: the first failed part's, else rank 0's (module docstring)."""
        if self._failure is None:
            return self._ended.get(0) or Outcome(None, None, "no part reported", None)
        part, outcome = self._failure
        why = outcome.reason or _exit_text(outcome)
        return replace(outcome, reason=f"part {part.rank} on {part.node.name}: {why}")

    def adopt(self, job_id: int, on_exit: Callable[[int, Outcome], None], attempt: int) -> None:
        """Watch parts a previous daemon started (head restart); `on_exit` as for `watch`.

        A part on another server is left to that server's node, whose next
        sync tells whether it runs or how it ended; a part here is watched
        if its shim lives, else ended with its exit record, or lost without one.
        """
        self._on_exit = on_exit
        self._ended.clear()
        for part in self.parts:

            def ended(jid: int, outcome: Outcome, part: Part = part) -> None:
                self._part_ended(jid, part, outcome)

            node = part.node
            if isinstance(node, RemoteNode):
                node.adopt(job_id, attempt, ended, lambda jid: None, ended)
                continue
            pid = node.live_shim(job_id)
            if pid is not None:
                node.watch(job_id, pid, ended)
            elif node.has_exit_record(job_id):
                ended(job_id, node.outcome(job_id))
            else:
                why = "the part's shim ended while the daemon was down, without a record"
                ended(job_id, Outcome(None, None, why, None))

    def unwatch_all(self) -> None:
        """Nothing of its own to unwatch: each server's node stops watching its parts."""

    # -- acting on every part -------------------------------------------------

    def signal(self, job_id: int, signum: int) -> bool:
        """Signal every part's process tree; False if one has no process group yet."""
        sent = [part.node.signal(job_id, signum) for part in self.parts]
        return all(sent)

    def outcome(self, job_id: int) -> Outcome:
        """How the attempt ended, from every part's record (recovery)."""
        for part in self.parts:
            outcome = part.node.outcome(job_id)
            self._ended[part.rank] = outcome
            if self._failure is None and _failed(outcome):
                self._failure = (part, outcome)
        return self.combined()

    def live_shim(self, job_id: int, settle: float = 10.0) -> int | None:
        """Rank 0's shim pid while any part still runs, else None."""
        alive = [part.node.live_shim(job_id, settle) for part in self.parts]
        if not any(pid is not None for pid in alive):
            return None
        return alive[0] or next(pid for pid in alive if pid is not None)

    def has_exit_record(self, job_id: int) -> bool:
        """True once every part has recorded how it ended."""
        return all(part.node.has_exit_record(job_id) for part in self.parts)

    def has_shim_record(self, job_id: int) -> bool:
        """True once every part's shim has recorded itself."""
        return all(part.node.has_shim_record(job_id) for part in self.parts)

    def kill_leftovers(self, job_id: int, timeout: float = 10.0) -> list[int]:
        """Kill what is left of every part; the pids that survived."""
        return [pid for part in self.parts for pid in part.node.kill_leftovers(job_id, timeout)]

    def read_record(self, job_id: int, name: str) -> dict[str, Any] | None:
        """A record of rank 0's part."""
        return self.parts[0].node.read_record(job_id, name)

    def remove_job_files(self, job_id: int) -> None:
        """Delete the job's directory on every server that lets the head do so."""
        for part in self.parts:
            part.node.remove_job_files(job_id)

    async def sample_gpus(self, holdings: Mapping[int, JobHolding]) -> list[GpuInfo]:
        """Each server's node samples its own GPUs: nothing here."""
        return []

    def close(self) -> None:
        """Nothing to release: the servers' nodes own their resources."""
        if self._kill_timer is not None:
            self._kill_timer.cancel()


def _failed(outcome: Outcome) -> bool:
    """True if a part's end ends the job (anything but exit 0 within its time)."""
    return outcome.returncode != 0 or outcome.time_limit or outcome.start_failed


def _exit_text(outcome: Outcome) -> str:
    if outcome.exit_code is None:
        return "no exit status"
    sig = f" ({outcome.signal})" if outcome.signal else ""
    return f"exited with code {outcome.exit_code}{sig}"
