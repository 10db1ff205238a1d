"""The real `gpuq` against a daemon that has another server: the views say where.

The daemon's config names a server, gpu2, that ssh cannot reach (its ssh
config sends it to a closed port): `gpuq ls` gets a NODE column, `gpuq gpus`
names this server's GPUs `NODE:INDEX` and says what is known of gpu2, and
the replies carry `nodes` and `servers`. The same commands on a daemon
without servers are covered, unchanged, by tests/test_cli_golden.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, submit_cli

UNREACHABLE = "Host gpu2\n  HostName 127.0.0.1\n  Port 1\n"


@pytest.fixture
def head(tmp_path: Path) -> Iterator[DaemonHarness]:
    """A daemon with two fake GPUs and gpu2, down, in `[[cluster.servers]]`."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(UNREACHABLE)
    cluster = (
        f'[cluster]\nssh_config = "{ssh_config}"\nconnect_timeout = "1s"\n'
        'heartbeat = "0.2s"\ndown_after = "0.5s"\n[[cluster.servers]]\nhost = "gpu2"\n'
    )
    with running_daemon(tmp_path / "head", extra_toml=cluster) as daemon:
        yield daemon


def test_ls_names_the_server_of_each_job(head: DaemonHarness) -> None:
    node = head.call("status")["node"]
    running = submit_cli(head, "--gpus", "1", "--", "sleep", "60")
    waiting = submit_cli(head, "--gpus", "2", "--", "true")
    head.wait_state(running, "running")

    assert head.call("list")["nodes"] == [node, "gpu2"]
    lines = head.cli("ls").stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "STATE", "GPUS", "NODE", "TIME", "EXIT", "REASON"]
    start, end = lines[0].index("NODE"), lines[0].index("TIME")
    nodes = {int(line.split()[0]): line[start:end].strip() for line in lines[1:]}
    assert nodes == {running: node, waiting: ""}  # a waiting job is on no server yet
    head.cli("cancel", str(running), str(waiting))


def test_gpus_are_named_by_server_and_the_other_server_is_listed(head: DaemonHarness) -> None:
    node = head.call("status")["node"]
    document = json.loads(head.cli("gpus", "--json").stdout)
    assert [server["host"] for server in document["servers"]] == ["gpu2"]
    assert {gpu["node"] for gpu in document["gpus"]} == {node}

    table, servers = head.cli("gpus").stdout.rstrip("\n").split("\n\n")
    assert [line.split()[0] for line in table.splitlines()] == ["GPU", f"{node}:0", f"{node}:1"]
    assert servers.startswith(("gpu2: down for ", "gpu2: not checked yet"))
