"""`ssh HOST gpuq bridge` between real servers: network namespaces, each with its own sshd.

The groundwork of the multi-server issue: a head on one server reaches
another server's daemon through OpenSSH and `gpuq bridge`, never a password
prompt (BatchMode), and a server cut off from the network is noticed by the
ssh session's own keep-alives within seconds. Root only (tests/netns_harness.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.cluster.remote import SshClient
from gpuq.config import Config, ServerDecl, load_config
from gpuq.errors import DaemonUnavailable
from gpuq.wire import PROTOCOL_VERSION
from tests.daemon_harness import DaemonHarness, running_daemon
from tests.netns_harness import GPUQ, THREE_GPUS, Lab, servers

BRIDGE = [sys.executable, "-m", "gpuq.cli.entry", "bridge"]


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Lab, DaemonHarness]]:
    """Servers `head` and `gpu2`; gpu2 runs a daemon of three fake GPUs."""
    with running_daemon(tmp_path / "gpu2", gpus_toml=THREE_GPUS) as remote:
        head_config = tmp_path / "head.toml"
        head_config.write_text("")
        configs = {"head": head_config, "gpu2": remote.config_path}
        with servers(tmp_path / "net", ["head", "gpu2"], configs) as made:
            yield made, remote


def bridge_from_head(net: Lab) -> subprocess.Popen[bytes]:
    """`ssh gpu2 gpuq bridge`, started on the head, with pipes."""
    return net.popen_in(
        "head",
        net.ssh_command("gpu2", *BRIDGE),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def exchange(bridge: subprocess.Popen[bytes], request: dict[str, Any]) -> dict[str, Any]:
    """Send one request line through the bridge and read the next non-heartbeat line."""
    assert bridge.stdin is not None and bridge.stdout is not None
    bridge.stdin.write(json.dumps(request).encode() + b"\n")
    bridge.stdin.flush()
    while True:
        line = bridge.stdout.readline()
        assert line, "the bridge closed"
        message: dict[str, Any] = json.loads(line)
        if message.get("event") != "heartbeat":
            return message


def test_a_head_reaches_another_servers_daemon_through_ssh(
    lab: tuple[Lab, DaemonHarness],
) -> None:
    net, remote = lab
    with bridge_from_head(net) as bridge:
        hello = exchange(
            bridge, {"id": 0, "method": "hello", "params": {"version": PROTOCOL_VERSION}}
        )
        assert hello["result"]["pid"] == remote.process.pid  # type: ignore[union-attr]
        gpus = exchange(bridge, {"id": 1, "method": "gpus", "params": {}})
        assert [gpu["name"] for gpu in gpus["result"]["gpus"]] == ["Fake L4"] * 3
        assert bridge.stdin is not None
        bridge.stdin.close()
        assert bridge.wait(30) == 0


def test_an_unknown_host_key_fails_at_once_without_a_prompt(
    lab: tuple[Lab, DaemonHarness],
) -> None:
    net, _ = lab
    (net.root / "known_hosts").write_text("")
    started = time.monotonic()
    result = net.run_in("head", net.ssh_command("gpu2", *BRIDGE), timeout=30)
    assert result.returncode == 255  # ssh's own failure, not the remote command's
    assert b"Host key verification failed" in result.stderr
    assert time.monotonic() - started < 20


def test_a_server_cut_off_ends_the_bridge_session_within_seconds(
    lab: tuple[Lab, DaemonHarness],
) -> None:
    net, _ = lab
    with bridge_from_head(net) as bridge:
        exchange(bridge, {"id": 0, "method": "hello", "params": {"version": PROTOCOL_VERSION}})
        net.cut("gpu2")
        # ServerAliveInterval 2 x ServerAliveCountMax 2: about 6 s of silence ends it.
        assert bridge.wait(60) == 255
        assert bridge.stdout is not None and bridge.stdout.read() == b""
    net.mend("gpu2")
    again = net.run_in("head", net.ssh_command("gpu2", "true"), timeout=60)
    assert again.returncode == 0, again.stderr


def head_config(net: Lab, root: Path) -> Config:
    """The head's config: its ssh config is the lab's, its runtime directory short."""
    path = root / "head-client.toml"
    runtime = Path(tempfile.mkdtemp(prefix="gqh-"))
    path.write_text(
        f'[daemon]\nstate_dir = "{root / "head-state"}"\nruntime_dir = "{runtime}"\n'
        f'[cluster]\nssh_config = "{net.ssh_config}"\nconnect_timeout = "3s"\n'
        '[client]\ntimeout = "5s"\n'
    )
    return load_config(str(path), environ={})


def test_a_client_over_ssh_is_an_ordinary_client_until_the_server_is_cut_off(
    lab: tuple[Lab, DaemonHarness], tmp_path: Path
) -> None:
    net, remote = lab
    config = head_config(net, tmp_path)
    server = ServerDecl("gpu2", command=GPUQ)
    with net.inside("head"), SshClient.connect_to(server, config) as client:
        assert client.hello["pid"] == remote.process.pid  # type: ignore[union-attr]
        for _ in range(3):  # one session, many requests
            assert len(client.call("gpus")["gpus"]) == 3
        net.cut("gpu2")
        started = time.monotonic()
        with pytest.raises(DaemonUnavailable):
            client.call("gpus")
        assert time.monotonic() - started < 30  # the client timeout (5 s), not forever
        process = client.process
    assert process.poll() is not None  # closing the client ended its ssh


def test_a_session_that_cannot_start_says_why(
    lab: tuple[Lab, DaemonHarness], tmp_path: Path
) -> None:
    net, _ = lab
    config = head_config(net, tmp_path)
    with net.inside("head"):
        with pytest.raises(DaemonUnavailable, match="gpu2 has no gpuq"):
            SshClient.connect_to(ServerDecl("gpu2", command="/no/gpuq"), config)
        net.cut("gpu2")
        with pytest.raises(DaemonUnavailable, match="gpu2 did not answer"):
            SshClient.connect_to(ServerDecl("gpu2", command=GPUQ), config)
