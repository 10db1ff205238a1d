"""Where things run, in `gpuq ls`, `gpus` and `show`: several servers, and one as before.

The renderers are fed replies as the daemon documents them
(docs/json-schema.md): jobs on three servers, GPU indices that repeat on
each server, a server that is down. On one server nothing changes: no NODE
column, GPUs named by index, no server lines.
"""

from __future__ import annotations

from typing import Any

from gpuq.cli.render import (
    gpu_nodes,
    gpus_text,
    job_detail,
    jobs_table,
    node_cell,
    node_detail,
    shows_nodes,
)

NOW = 1_800_000_000.0
GIB = 1024**3
DOWN_REASON = "ssh: connect to host gpu3 port 22: No route to host"


def job(job_id: int, state: str, node: str, **changes: Any) -> dict[str, Any]:
    """A job object that ran for a minute (or waits, when `state` is pending)."""
    started = state not in ("queued", "held")
    base: dict[str, Any] = {
        "id": job_id,
        "name": "train",
        "user": "ana",
        "state": state,
        "reason": {"running": "started", "queued": "waiting for 1 free GPU (0 free)"}.get(
            state, ""
        ),
        "exit_code": None,
        "signal": None,
        "gpus": 1,
        "gpus_max": None,
        "gpu_mem": None,
        "gpu_uuids": [],
        "gpu_mem_reserved": None,
        "node": node,
        "priority": 0,
        "submit_time": NOW - 120,
        "start_time": NOW - 60 if started else None,
        "first_start_time": NOW - 60 if started else None,
        "end_time": None,
        "run_time": 60.0 if started else 0.0,
        "attempts": 1 if started else 0,
        "array_id": None,
        "array_index": None,
        "stdout": "",
        "stderr": "",
        "spec": {
            "command": ["python", "train.py"],
            "cwd": "/home/ana",
            "retries": 0,
            "after": [],
            "time_limit": None,
            "begin": None,
            "notify": None,
            "gpu_mem_auto": False,
        },
    }
    return {**base, **changes}


def gpu(node: str, index: int, jobs: tuple[int, ...] = ()) -> dict[str, Any]:
    """An 80G GPU object of `node`; its UUID names both."""
    used = 30 * GIB if jobs else 0
    return {
        "uuid": f"GPU-{node}-{index}",
        "index": index,
        "name": "H100",
        "memory_total": 80 * GIB,
        "memory_used": used,
        "utilization": 90.0 if jobs else 0.0,
        "processes": [],
        "node": node,
        "parent_uuid": None,
        "link_group": "",
        "memory_gpuq": used,
        "memory_foreign": 0,
        "memory_reserved": 0,
        "memory_free": 80 * GIB - used,
        "jobs": list(jobs),
        "mode": "whole" if jobs else "idle",
    }


def server(host: str, state: str, reason: str | None = None) -> dict[str, Any]:
    """A `servers` entry, as `daemon status` and the `gpus` reply carry it."""
    up = state == "up"
    return {
        "host": host,
        "state": state,
        "since": NOW - 300,
        "reason": reason,
        "node": host if up else None,
        "pid": 4242 if up else None,
        "gpus": 2 if up else None,
        "last_answer": NOW - 1 if up else None,
    }


# gpuq ls

LS_ONE_SERVER = """\
ID  NAME   STATE      GPUS  TIME   EXIT  REASON
1   train  running    1     1m00s        started
2   train  queued     1     2m00s        waiting for 1 free GPU (0 free)
3   train  succeeded  1     1m00s  0"""

LS_CLUSTER = """\
ID  NAME   STATE      GPUS  NODE  TIME   EXIT  REASON
1   train  running    1     gpu1  1m00s        started
2   train  queued     1           2m00s        waiting for 1 free GPU (0 free)
3   train  succeeded  1     gpu3  1m00s  0
4   train  running    1     gpu2  1m00s        started"""


def one_server_jobs() -> list[dict[str, Any]]:
    return [
        job(1, "running", "gpu1"),
        job(2, "queued", ""),
        job(3, "succeeded", "gpu1", exit_code=0, end_time=NOW),
    ]


def cluster_jobs() -> list[dict[str, Any]]:
    return [
        job(1, "running", "gpu1"),
        job(2, "queued", "gpu2"),  # waiting again after an attempt on gpu2
        job(3, "succeeded", "gpu3", exit_code=0, end_time=NOW),
        job(4, "running", "gpu2"),
    ]


def test_ls_on_one_server_has_no_node_column() -> None:
    assert jobs_table(one_server_jobs(), now=NOW, nodes=["gpu1"]) == LS_ONE_SERVER
    assert jobs_table(one_server_jobs(), now=NOW) == LS_ONE_SERVER


def test_ls_with_servers_configured_names_each_jobs_server() -> None:
    jobs = cluster_jobs()
    assert jobs_table(jobs, now=NOW, nodes=["gpu1", "gpu2", "gpu3"]) == LS_CLUSTER


def test_ls_shows_the_node_column_when_the_jobs_ran_on_several_servers() -> None:
    # `gpuq wait` and an array's `show` have no `nodes`: the jobs tell.
    assert jobs_table(cluster_jobs(), now=NOW) == LS_CLUSTER


def test_ls_shows_the_node_column_when_servers_are_configured_even_if_jobs_ran_on_one() -> None:
    table = jobs_table(one_server_jobs(), now=NOW, nodes=["gpu1", "gpu2"])
    assert table.split("\n")[0].split() == [
        "ID", "NAME", "STATE", "GPUS", "NODE", "TIME", "EXIT", "REASON"
    ]  # fmt: skip


def test_a_waiting_job_has_no_node_even_after_an_attempt_elsewhere() -> None:
    assert node_cell(job(2, "queued", "gpu2")) == ""
    assert node_cell(job(2, "held", "gpu2")) == ""
    assert node_cell(job(2, "suspended", "gpu2")) == "gpu2"
    assert node_cell(job(2, "failed", "gpu3")) == "gpu3"


def test_the_node_column_rule() -> None:
    assert not shows_nodes([], ["gpu1"])
    assert not shows_nodes([job(1, "running", "gpu1"), job(2, "queued", "")], ["gpu1"])
    assert shows_nodes([], ["gpu1", "gpu2"])
    assert shows_nodes([job(1, "running", "gpu1"), job(2, "failed", "gpu2")])


# gpuq show


def test_show_names_the_server_of_the_attempt_or_the_last_one() -> None:
    assert node_detail(job(1, "running", "gpu2")) == "gpu2"
    assert node_detail(job(1, "succeeded", "gpu3")) == "gpu3"
    assert node_detail(job(1, "queued", "")) == "-"
    assert node_detail(job(1, "queued", "gpu2")) == "- (last ran on gpu2)"
    lines = job_detail(job(1, "running", "gpu2"), [], now=NOW).split("\n")
    assert "  Node:       gpu2" in lines


# gpuq gpus

GPUS_ONE_SERVER = """\
GPU  NAME  TOTAL  GPUQ  OTHER  FREE  UTIL  MODE   JOBS  UUID
0    H100  80G    30G   0      50G   90%   whole  1     GPU-gpu1-0
1    H100  80G    0     0      80G   0%    idle   -     GPU-gpu1-1"""

GPUS_CLUSTER = """\
GPU     NAME  TOTAL  GPUQ  OTHER  FREE  UTIL  MODE   JOBS  UUID
gpu1:0  H100  80G    30G   0      50G   90%   whole  1     GPU-gpu1-0
gpu1:1  H100  80G    0     0      80G   0%    idle   -     GPU-gpu1-1
gpu2:0  H100  80G    30G   0      50G   90%   whole  4     GPU-gpu2-0
gpu2:1  H100  80G    0     0      80G   0%    idle   -     GPU-gpu2-1

gpu3: down for 5m00s: ssh: connect to host gpu3 port 22: No route to host"""


def gpus_reply(gpus: list[dict[str, Any]], servers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"gpus": gpus, "backend": "fake", "sampled_at": NOW, "servers": servers}


def test_gpus_on_one_server_are_named_by_index_as_before() -> None:
    reply = gpus_reply([gpu("gpu1", 0, (1,)), gpu("gpu1", 1)], [])
    assert gpus_text(reply, now=NOW) == GPUS_ONE_SERVER
    del reply["servers"]  # a daemon from before `servers`
    assert gpus_text(reply, now=NOW) == GPUS_ONE_SERVER


def test_gpus_of_several_servers_are_grouped_and_named_by_server() -> None:
    # The reply's order mixes servers; each has a GPU 0 and a GPU 1.
    gpus = [gpu("gpu2", 0, (4,)), gpu("gpu1", 0, (1,)), gpu("gpu2", 1), gpu("gpu1", 1)]
    servers = [server("gpu2", "up"), server("gpu3", "down", DOWN_REASON)]
    assert gpus_text(gpus_reply(gpus, servers), now=NOW) == GPUS_CLUSTER


def test_the_daemons_own_gpus_come_first_then_the_servers_in_config_order() -> None:
    gpus = [gpu("gpu4", 0), gpu("gpu2", 0), gpu("head", 0)]
    servers = [server("gpu4", "up"), server("gpu3", "down"), server("gpu2", "up")]
    assert gpu_nodes(gpus, servers) == ["head", "gpu4", "gpu3", "gpu2"]


def test_gpus_list_servers_that_are_unchecked_down_or_without_gpus() -> None:
    servers = [
        server("gpu2", "up"),
        server("gpu3", "down", DOWN_REASON),
        server("gpu4", "unknown"),
        server("gpu5", "down"),
    ]
    out = gpus_text(gpus_reply([gpu("gpu1", 0)], servers), now=NOW)
    assert out.split("\n\n")[1].split("\n") == [
        "gpu2: up, no GPUs",
        f"gpu3: down for 5m00s: {DOWN_REASON}",
        "gpu4: not checked yet",
        "gpu5: down for 5m00s",
    ]


def test_gpus_with_every_server_down_and_none_here_still_say_why() -> None:
    out = gpus_text(gpus_reply([], [server("gpu3", "down", DOWN_REASON)]), now=NOW)
    assert out == (
        f"No GPUs (CPU-only jobs run with --gpus 0).\n\ngpu3: down for 5m00s: {DOWN_REASON}"
    )


def test_a_reason_from_a_server_cannot_drive_the_terminal() -> None:
    out = gpus_text(gpus_reply([], [server("gpu3", "down", "x\x1b[2J\nforged")]), now=NOW)
    assert out.endswith("gpu3: down for 5m00s: x\\x1b[2J\\nforged")
