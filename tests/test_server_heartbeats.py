"""The head daemon's heartbeats: each server of [cluster] up or down, since when, and why.

Real servers (tests/cluster_harness.py): the head's daemon runs inside the
head's namespace with gpu2 in its config; its long poll of gpu2's daemon
through `ssh gpu2 gpuq bridge` is the heartbeat.
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

from tests.cluster_harness import Cluster, head_and_gpu2
from tests.daemon_harness import DaemonHarness, wait_for
from tests.netns_harness import Lab


@dataclass
class Head:
    """The two-server lab (tests/cluster_harness.py), seen through the head's status."""

    lab: Cluster

    @property
    def net(self) -> Lab:
        return self.lab.net

    @property
    def head(self) -> DaemonHarness:
        return self.lab.head

    @property
    def remote(self) -> DaemonHarness:
        return self.lab.gpu2

    def servers(self) -> list[dict[str, Any]]:
        with self.head.client() as client:
            result: list[dict[str, Any]] = client.call("status")["servers"]
        return result

    def gpu2(self) -> dict[str, Any]:
        [server] = self.servers()
        return server


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Head]:
    with head_and_gpu2(tmp_path) as cluster:
        yield Head(cluster)


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
