"""`gpuq top` on several servers: GPUs under their server, down servers, a NODE column.

The pure parts (GPU groups, header texts, the NODE cell and filter) are
tested without Textual; the app runs on a `ReplaySource` of
`synthetic_cluster` (three servers, GPU indices repeating on each, one
server down), and on a one-server lab, whose views stay as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from textual.pilot import Pilot

from gpuq.tui.app import GpuqTop
from gpuq.tui.gpumodel import GpuBoard, NodeGroup, gpus_summary, node_state_text
from gpuq.tui.messages import JobChanged
from gpuq.tui.model import JobFilter, QueueModel, job_facts, node_cell
from gpuq.tui.replay import Lab, ReplaySource, synthetic_cluster, synthetic_lab
from gpuq.tui.widgets import StatusLine
from tests.test_tui_model import job

NOW = 1_800_000_000.0
SIZE = (140, 45)
DOWN_REASON = "ssh: connect to host gpu3 port 22: No route to host"


def cluster(n_jobs: int = 60) -> Lab:
    """gpu1 (the daemon's own, 2 GPUs), gpu2 (3 GPUs), gpu3 (2 GPUs, down)."""
    return synthetic_cluster(
        n_jobs, {"gpu1": 2, "gpu2": 3, "gpu3": 2}, {"gpu3": DOWN_REASON}, now=NOW
    )


def gpu(node: str, index: int) -> dict[str, Any]:
    return {"uuid": f"GPU-{node}-{index}", "index": index, "node": node, "utilization": 0.0}


def server(host: str, state: str, reason: str | None = None) -> dict[str, Any]:
    return {"host": host, "state": state, "since": NOW - 90, "reason": reason}


# The pure parts


def test_gpus_are_grouped_by_server_the_daemons_own_first() -> None:
    board = GpuBoard()
    board.update(
        {
            "gpus": [gpu("gpu2", 1), gpu("gpu2", 0), gpu("gpu1", 0), gpu("gpu4", 0)],
            "backend": "fake",
            "servers": [server("gpu4", "up"), server("gpu3", "down", DOWN_REASON)],
        }
    )
    groups = board.groups()
    assert [(g.node, [x["index"] for x in g.gpus]) for g in groups] == [
        ("gpu1", [0]),
        ("gpu2", [0, 1]),
        ("gpu4", [0]),
        ("gpu3", []),
    ]
    assert [g.down for g in groups] == [False, False, False, True]
    assert board.several_nodes
    assert gpus_summary(board) == "4 GPUs on 4 servers, 1 down"


def test_one_server_is_not_grouped_and_its_summary_is_as_before() -> None:
    board = GpuBoard()
    board.update({"gpus": [gpu("gpu1", 0), gpu("gpu1", 1)], "backend": "fake", "servers": []})
    assert not board.several_nodes
    assert gpus_summary(board) == "2 GPUs (fake)"
    assert gpus_summary(GpuBoard()) == ""  # before the first sample


def test_a_servers_header_says_how_many_gpus_or_why_none() -> None:
    two = [gpu("gpu2", 0), gpu("gpu2", 1)]
    assert node_state_text(NodeGroup("gpu1", two[:1]), NOW) == "1 GPU"
    assert node_state_text(NodeGroup("gpu2", two, server("gpu2", "up")), NOW) == "2 GPUs"
    down = NodeGroup("gpu3", [], server("gpu3", "down", DOWN_REASON))
    assert node_state_text(down, NOW) == f"down for 1m30s: {DOWN_REASON}"
    unknown = NodeGroup("gpu4", [], server("gpu4", "unknown"))
    assert node_state_text(unknown, NOW) == "not checked yet"
    assert node_state_text(NodeGroup("gpu5", [], server("gpu5", "up")), NOW) == "no GPUs"


def test_the_node_cell_is_empty_while_a_job_waits() -> None:
    assert node_cell(job(1, "running", node="gpu2")) == "gpu2"
    assert node_cell(job(1, "queued", node="gpu2")) == ""  # waiting again after gpu2
    facts = dict(job_facts(job(1, "queued", node="gpu2"), NOW))
    assert facts["Node"] == "- (last ran on gpu2)"
    assert dict(job_facts(job(1, "running", node="gpu2"), NOW))["Node"] == "gpu2"


def test_the_filter_takes_a_node() -> None:
    jobs = [job(1, "running", node="gpu1"), job(2, "running", node="gpu2"), job(3, node="gpu2")]
    chosen = JobFilter.parse("node:gpu2")
    assert [j["id"] for j in jobs if chosen.matches(j)] == [2]


def test_the_model_remembers_every_server_a_job_ran_on() -> None:
    model = QueueModel()
    model.replace([job(1, "running", node="gpu1"), job(2)])
    assert model.nodes == {"gpu1"}
    model.apply([job(2, "running", node="gpu2")], NOW)
    assert model.nodes == {"gpu1", "gpu2"}


# The app


def run_top(lab: Lab, scenario: Callable[[GpuqTop, Pilot[Any]], Awaitable[None]]) -> None:
    app = GpuqTop(ReplaySource(lab), interval=3600, clock=lambda: NOW, reconnect_delays=(3600,))

    async def main() -> None:
        async with app.run_test(size=SIZE) as pilot:
            while not (app.connected and app.table.row_count):
                await pilot.pause(0.02)
            await pilot.pause()
            await scenario(app, pilot)

    asyncio.run(main())


def test_top_shows_each_servers_gpus_and_why_a_server_is_down() -> None:
    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        lines = app.gpu_panel.render_board(120).plain.splitlines()
        headers = [line for line in lines if line.startswith("gpu")]
        assert headers == [
            "gpu1  2 GPUs",
            "gpu2  3 GPUs",
            f"gpu3  down for 5m00s: {DOWN_REASON}",
        ]
        gpu_rows = [line.split()[0] for line in lines if line[:3].strip().isdigit()]
        assert gpu_rows == ["0", "1", "0", "1", "2"]  # indices repeat, under their server
        assert "5 GPUs on 3 servers, 1 down" in str(app.query_one("#status", StatusLine).content)
        assert "node" in app.table.columns
        running = next(j for j in app.model.jobs.values() if j["state"] == "running")
        assert app.table.cell(running["id"], "node") == running["node"] != ""

    run_top(cluster(), scenario)


def test_one_server_has_no_node_column_until_a_job_runs_elsewhere() -> None:
    async def scenario(app: GpuqTop, pilot: Pilot[Any]) -> None:
        assert "node" not in app.table.columns
        panel = app.gpu_panel.render_board(120).plain.splitlines()
        assert not any(line.startswith("gpu") for line in panel)  # no server headers
        assert "2 GPUs (fake)" in str(app.query_one("#status", StatusLine).content)
        moved = job(90_001, "running", node="gpu2", start_time=NOW - 5)
        app.on_job_changed(JobChanged(moved))
        app.flush_jobs()
        await pilot.pause()
        assert "node" in app.table.columns
        assert app.table.cell(90_001, "node") == "gpu2"

    run_top(synthetic_lab(n_jobs=20, n_gpus=2, now=NOW), scenario)
