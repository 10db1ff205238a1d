"""The head daemon's heartbeats: each server of [cluster] up or down, since when, and why.

Real servers (tests/netns_harness.py): the head's daemon runs inside the
head's namespace with gpu2 in its config; it keeps a session to gpu2's
daemon through `ssh gpu2 gpuq bridge` and asks for its status every beat.
Cutting gpu2's link turns it down after `down_after`, with the reason;
mending it brings it back up; a server removed from the config by a reload
is dropped. Root only.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.daemon_harness import DaemonHarness, running_daemon, wait_for
from tests.netns_harness import GPUQ, THREE_GPUS, Lab, servers


@dataclass
class Head:
    net: Lab
    head: DaemonHarness
    remote: DaemonHarness

    def servers(self) -> list[dict[str, Any]]:
        with self.head.client() as client:
            result: list[dict[str, Any]] = client.call("status")["servers"]
        return result

    def gpu2(self) -> dict[str, Any]:
        [server] = self.servers()
        return server


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Head]:
    with running_daemon(tmp_path / "gpu2", gpus_toml=THREE_GPUS) as remote:
        head = DaemonHarness(tmp_path / "head")
        configs = {"head": head.config_path, "gpu2": remote.config_path}
        with servers(tmp_path / "net", ["head", "gpu2"], configs) as net:
            with head.config_path.open("a") as config:
                config.write(
                    f'\n[cluster]\nssh_config = "{net.ssh_config}"\nconnect_timeout = "2s"\n'
                    'heartbeat = "2s"\ndown_after = "5s"\n'
                    f'[[cluster.servers]]\nhost = "gpu2"\ncommand = "{GPUQ}"\n'
                )
            with net.inside("head"):  # the daemon and its ssh sessions run on the head
                head.start()
            try:
                yield Head(net, head, remote)
            finally:
                head.close()


def test_a_server_is_up_down_when_cut_off_and_up_again(lab: Head) -> None:
    up = wait_for(lambda: lab.gpu2()["state"] == "up" and lab.gpu2(), what="gpu2 up")
    assert up["pid"] == lab.remote.process.pid  # type: ignore[union-attr]
    assert up["gpus"] == 3 and up["reason"] is None

    status = lab.head.cli("daemon", "status")
    assert status.returncode == 0
    assert "Server:    gpu2 up" in status.stdout and "3 GPUs" in status.stdout

    lab.net.cut("gpu2")
    down = wait_for(lambda: lab.gpu2()["state"] == "down" and lab.gpu2(), timeout=60, what="down")
    assert down["reason"] and down["since"] >= up["since"]
    assert "down for" in lab.head.cli("daemon", "status").stdout

    lab.net.mend("gpu2")
    wait_for(lambda: lab.gpu2()["state"] == "up", timeout=60, what="gpu2 up again")


def test_a_server_removed_from_the_config_is_dropped_at_reload(lab: Head) -> None:
    wait_for(lambda: lab.gpu2()["state"] == "up", what="gpu2 up")
    removed = lab.head.cli("cluster", "remove", "gpu2")
    assert removed.returncode == 0, removed.stderr
    reloaded = lab.head.cli("daemon", "reload")
    assert reloaded.returncode == 0, reloaded.stderr
    wait_for(lambda: lab.servers() == [], what="gpu2 dropped")


def test_the_daemon_stops_while_a_server_hangs(lab: Head) -> None:
    wait_for(lambda: lab.gpu2()["state"] == "up", what="gpu2 up")
    lab.net.cut("gpu2")  # the next beat hangs in ssh until its timeouts
    stopped = lab.head.cli("daemon", "stop")
    assert stopped.returncode == 0, stopped.stderr
    process = lab.head.process
    assert process is not None
    wait_for(lambda: process.poll() is not None, what="the head daemon to exit")
