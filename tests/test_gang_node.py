"""`GangNode`: a multi-node job's attempt over its parts (gpuq/daemon/node/gang.py).

Each part's server is a recording stand-in for a `Node`; the real servers
are in tests/test_multi_node.py.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuq.daemon.executor import LaunchSpec, OnSpawned, Outcome
from gpuq.daemon.node.gang import GangNode, Part, part_path, rendezvous_port
from gpuq.daemon.node.interface import Node
from gpuq.daemon.spawner import Spawned


class Server:
    """Records what a part's node is asked (only what `GangNode` calls)."""

    def __init__(self, name: str, spawn_error: str = "") -> None:
        self.name = name
        self.spawn_error = spawn_error
        self.launched: list[LaunchSpec] = []
        self.signals: list[int] = []
        self.on_exit: Callable[[int, Outcome], None] | None = None
        self.gpu_backend = "fake"

    def job_dir(self, job_id: int) -> Path:
        return Path(f"/{self.name}/jobs/{job_id}")

    def device_env(self) -> dict[str, str]:
        return {"GPUQ_FAKE_GPU_DIR": f"/{self.name}/fake"}

    def launch(self, job_id: int, spec: LaunchSpec, on_spawned: OnSpawned) -> None:
        self.launched.append(spec)
        pid = None if self.spawn_error else 100 + len(self.name)
        on_spawned(Spawned(pid, None, self.spawn_error))

    def watch(self, job_id: int, pid: int, on_exit: Any, pidfd: int | None = None) -> None:
        self.on_exit = on_exit

    def signal(self, job_id: int, signum: int) -> bool:
        self.signals.append(signum)
        return True

    def end(self, code: int) -> None:
        assert self.on_exit is not None
        self.on_exit(7, Outcome(code, None, "", None))


def gang(*servers: Server) -> GangNode:
    parts = [
        Part(server, rank, (f"{server.name}-gpu0", f"{server.name}-gpu1"))  # type: ignore[arg-type]
        for rank, server in enumerate(servers)
    ]

    def outputs(name: str, rank: int) -> tuple[str, str, dict[str, str]]:
        return f"/logs/{name}/7.out", f"/logs/{name}/7.err", {f"/logs/{name}/7.out": "/logs"}

    return GangNode(parts, "10.0.0.1", outputs, lambda: 0.05)


SPEC = LaunchSpec(
    command=("torchrun", "train.py"),
    cwd="/home/me",
    env={"GPUQ_ATTEMPT": "2", "GPUQ_GPU_UUIDS": "all", "GPUQ_FAKE_GPU_DIR": "/head/fake"},
    stdout="/logs/7.out",
    stderr="/logs/7.err",
    time_limit=None,
    signal=None,
    kill_grace=1.0,
)


def start(node: GangNode) -> list[Spawned]:
    answers: list[Spawned] = []
    node.launch(7, SPEC, answers.append)
    return answers


def test_each_part_gets_its_own_gpus_directory_outputs_and_the_rendezvous() -> None:
    head, gpu2 = Server("head"), Server("gpu2")
    node = gang(head, gpu2)
    assert start(node) == [Spawned(104, None)]  # once, when every part has started
    env0, env1 = head.launched[0].env, gpu2.launched[0].env
    assert env1["CUDA_VISIBLE_DEVICES"] == env1["GPUQ_GPU_UUIDS"] == "gpu2-gpu0,gpu2-gpu1"
    assert env1["GPUQ_JOB_DIR"] == "/gpu2/jobs/7" and env1["GPUQ_NODE"] == "gpu2"
    assert env1["GPUQ_FAKE_GPU_DIR"] == "/gpu2/fake"
    port = str(rendezvous_port(7, 2))
    for rank, env in enumerate((env0, env1)):
        assert {key: env[key] for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")} == {
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": port,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
        }
        assert env["PET_NNODES"] == "2" and env["PET_NODE_RANK"] == env["NODE_RANK"] == str(rank)
        assert env["PET_NPROC_PER_NODE"] == "2" and env["GPUQ_NODES"] == "head,gpu2"
    assert head.launched[0].stdout == "/logs/head/7.out"
    assert gpu2.launched[0].stdout == "/logs/gpu2/7.out.part1"
    assert gpu2.launched[0].create_below == {"/logs/gpu2/7.out.part1": "/logs"}


def test_the_rendezvous_port_is_below_the_ephemeral_range_and_changes_per_attempt() -> None:
    ports = {rendezvous_port(job, attempt) for job in range(1, 500) for attempt in (1, 2)}
    assert min(ports) >= 20000 and max(ports) < 32000
    assert rendezvous_port(7, 1) != rendezvous_port(7, 2)
    assert part_path("/x/7.out", 0) == "/x/7.out" and part_path("/x/7.out", 2) == "/x/7.out.part2"


def test_a_part_that_cannot_start_fails_the_start_and_the_started_parts_are_killed() -> None:
    head, gpu2 = Server("head"), Server("gpu2", spawn_error="no such directory")
    assert start(gang(head, gpu2)) == [
        Spawned(None, None, "part 1 on gpu2: no such directory"),
    ]
    assert head.signals == [signal.SIGKILL]


def test_all_parts_exiting_zero_is_a_success_reported_once_all_have_ended() -> None:
    head, gpu2 = Server("head"), Server("gpu2")
    node = gang(head, gpu2)
    start(node)
    outcomes: list[Outcome] = []
    node.watch(7, 104, lambda job_id, outcome: outcomes.append(outcome))
    gpu2.end(0)
    assert outcomes == [] and head.signals == []  # a part done early waits for the others
    head.end(0)
    assert [outcome.exit_code for outcome in outcomes] == [0]


def test_the_first_failing_part_stops_the_others_and_gives_the_job_its_reason() -> None:
    async def scenario() -> tuple[list[Outcome], Server, Server]:
        head, gpu2, gpu3 = Server("head"), Server("gpu2"), Server("gpu3")
        node = gang(head, gpu2, gpu3)
        start(node)
        outcomes: list[Outcome] = []
        node.watch(7, 104, lambda job_id, outcome: outcomes.append(outcome))
        gpu2.end(3)
        assert head.signals == gpu3.signals == [signal.SIGTERM, signal.SIGCONT]
        head.end(143)  # TERMed: its end is not the cause
        await asyncio.sleep(0.2)  # past the kill grace: gpu3 ignored its TERM
        assert gpu3.signals[-1] == signal.SIGKILL and head.signals[-1] == signal.SIGCONT
        gpu3.end(137)
        return outcomes, head, gpu3

    outcomes, _, _ = asyncio.run(scenario())
    assert len(outcomes) == 1
    assert outcomes[0].exit_code == 3
    assert outcomes[0].reason == "part 1 on gpu2: exited with code 3"


def test_signals_go_to_every_part() -> None:
    head, gpu2 = Server("head"), Server("gpu2")
    node: Node = gang(head, gpu2)
    assert node.signal(7, signal.SIGSTOP)
    assert head.signals == gpu2.signals == [signal.SIGSTOP]
    assert node.control.open(7) is None and node.control.runner(7) is None
