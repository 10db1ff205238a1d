"""`gpuq cluster add` and `gpuq cluster ls` against real servers (network namespaces with sshd).

The head runs the commands inside its namespace, as a user on that server
would; `gpu2` runs a daemon of three fake GPUs. A server is added only after
its daemon answered through `ssh gpu2 gpuq bridge`; every failure (unknown
host, unknown or changed host key, a login ssh refuses, no gpuq there,
another protocol, a server cut off)
is a clear error with its exit code and leaves the config file as it was.
Root only (tests/netns_harness.py), but for the --json refusal, which needs no lab.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuq.config import load_config
from tests.daemon_harness import DaemonHarness, running_daemon
from tests.netns_harness import GPUQ, THREE_GPUS, Lab, servers


@dataclass
class Cluster:
    """The lab, gpu2's daemon, and the head's config file."""

    net: Lab
    remote: DaemonHarness
    head_config: Path
    root: Path

    def gpuq(self, *args: str, timeout: float = 60.0) -> tuple[int, str, str]:
        """Run `gpuq ARGS` on the head; (exit status, stdout, stderr)."""
        env = {**os.environ, "GPUQ_CONFIG": str(self.head_config)}
        result = self.net.run_in("head", [GPUQ, *args], timeout=timeout, env=env)
        return result.returncode, result.stdout.decode(), result.stderr.decode()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_daemon(tmp_path / "gpu2", gpus_toml=THREE_GPUS) as remote:
        head_config = tmp_path / "head.toml"
        configs = {"head": head_config, "gpu2": remote.config_path}
        with servers(tmp_path / "net", ["head", "gpu2"], configs) as net:
            runtime = Path(remote.runtime_dir).with_name(Path(remote.runtime_dir).name + "h")
            head_config.write_text(
                "# the head's own settings\n"
                f'[daemon]\nstate_dir = "{tmp_path / "head-state"}"\nruntime_dir = "{runtime}"\n'
                f'[cluster]\nssh_config = "{net.ssh_config}"\nconnect_timeout = "3s"\n'
            )
            yield Cluster(net, remote, head_config, tmp_path)


def test_add_checks_the_server_appends_its_table_and_remove_takes_it_out(cluster: Cluster) -> None:
    before = cluster.head_config.read_text()
    code, out, err = cluster.gpuq("cluster", "add", "gpu2", "--label", "l4", "--command", GPUQ)
    assert code == 0, err
    assert "added gpu2" in out and "3 GPUs (Fake L4)" in out
    text = cluster.head_config.read_text()
    assert text.startswith(before)  # the user's file, comments and all, only extended
    config = load_config(str(cluster.head_config), environ={})
    [server] = config.cluster.servers
    assert (server.host, server.labels, server.command) == ("gpu2", ("l4",), GPUQ)

    code, out, err = cluster.gpuq("cluster", "ls", "--json")
    assert code == 0, err
    [row] = json.loads(out)["servers"]
    assert row["up"] and row["pid"] == cluster.remote.process.pid  # type: ignore[union-attr]
    assert row["gpus"] == ["Fake L4"] * 3

    code, _, err = cluster.gpuq("cluster", "add", "gpu2", "--command", GPUQ)
    assert code == 4 and "already a server" in err
    assert cluster.head_config.read_text() == text

    _, out, _ = cluster.gpuq("doctor", "--json")
    [check] = [c for c in json.loads(out)["checks"] if c["name"] == "server gpu2"]
    assert check["status"] == "ok" and "3 GPUs" in check["message"]

    code, _, err = cluster.gpuq("cluster", "remove", "gpu2")
    assert code == 0 and "removed gpu2" in err
    assert cluster.head_config.read_text() == before
    code, _, err = cluster.gpuq("cluster", "remove", "gpu2")
    assert code == 3 and "gpu2 is not a server" in err


def expect_refusal(cluster: Cluster, args: list[str], code: int, *words: str) -> str:
    before = cluster.head_config.read_text()
    status, out, err = cluster.gpuq("cluster", "add", *args)
    assert status == code, err
    assert out == ""
    for word in words:
        assert word in err
    assert "hint:" in err
    assert cluster.head_config.read_text() == before
    return err


def test_an_unknown_host_is_refused(cluster: Cluster) -> None:
    expect_refusal(cluster, ["nosuchhost", "--command", GPUQ], 5, "unknown host nosuchhost")


def test_a_refusal_under_json_leaves_only_the_error_object_on_stderr(tmp_path: Path) -> None:
    # Needs no lab: ssh is refused at once by a port nothing listens on.
    (tmp_path / "ssh_config").write_text("Host deadhost\n  Hostname 127.0.0.1\n  Port 9\n")
    config = tmp_path / "gpuq.toml"
    config.write_text(
        f'[daemon]\nstate_dir = "{tmp_path / "state"}"\nruntime_dir = "{tmp_path / "run"}"\n'
        f'[cluster]\nssh_config = "{tmp_path / "ssh_config"}"\nconnect_timeout = "3s"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "gpuq.cli.entry", "cluster", "add", "deadhost", "--json"],
        capture_output=True, text=True, env={**os.environ, "GPUQ_CONFIG": str(config)},
        timeout=60, check=False,
    )  # fmt: skip
    assert (result.returncode, result.stdout) == (5, ""), result.stderr
    [line] = result.stderr.splitlines()
    assert json.loads(line)["error"]["exit_code"] == 5


def test_an_unknown_host_key_is_refused_without_a_prompt(cluster: Cluster) -> None:
    (cluster.net.root / "known_hosts").write_text("")
    expect_refusal(cluster, ["gpu2", "--command", GPUQ], 5, "host key is not known")


def test_a_changed_host_key_is_refused_as_a_possible_interception(cluster: Cluster) -> None:
    known = cluster.net.root / "known_hosts"
    other = cluster.root / "other_host_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
        check=True,
        capture_output=True,
    )
    address = cluster.net.servers["gpu2"].address
    lines = [line for line in known.read_text().splitlines() if not line.startswith(address)]
    lines.append(f"{address} {other.with_suffix('.pub').read_text().strip()}")
    known.write_text("\n".join(lines) + "\n")
    err = expect_refusal(
        cluster, ["gpu2", "--command", GPUQ], 5, "gpu2's host key has changed since it was last"
    )
    assert "ssh-keygen -R gpu2" in err


def test_a_login_ssh_refuses_is_an_error_never_a_password_prompt(cluster: Cluster) -> None:
    (cluster.net.root / "authorized_keys").write_text("")
    err = expect_refusal(
        cluster, ["gpu2", "--command", GPUQ], 5, "ssh refused gpuq's login on gpu2"
    )
    assert "never asks for a password" in err and "ssh-copy-id gpu2" in err


def test_a_server_without_gpuq_is_refused(cluster: Cluster) -> None:
    expect_refusal(cluster, ["gpu2", "--command", "/nonexistent/gpuq"], 5, "gpu2 has no gpuq")


def test_a_server_of_another_protocol_is_refused_with_both_versions(cluster: Cluster) -> None:
    # What a newer daemon answers a hello of this protocol (gpuq.daemon.connection).
    newer = cluster.root / "gpuq-newer"
    reply: dict[str, Any] = {
        "id": 0,
        "error": {
            "code": "protocol",
            "message": "protocol version 1 is not supported (daemon speaks 2, gpuq 0.3.0)",
            "hint": None,
        },
    }
    newer.write_text(f"#!/bin/sh\nread -r hello\necho '{json.dumps(reply)}'\n")
    newer.chmod(newer.stat().st_mode | stat.S_IXUSR)
    expect_refusal(cluster, ["gpu2", "--command", str(newer)], 6, "0.3.0", "protocol")


def test_ls_reports_a_server_cut_off_as_down(cluster: Cluster) -> None:
    code, _, err = cluster.gpuq("cluster", "add", "gpu2", "--command", GPUQ)
    assert code == 0, err
    cluster.net.cut("gpu2")
    code, out, _ = cluster.gpuq("cluster", "ls", timeout=120)
    assert code == 5
    assert "gpu2" in out and "down" in out
    code, out, _ = cluster.gpuq("doctor", "--json", timeout=120)
    [check] = [c for c in json.loads(out)["checks"] if c["name"] == "server gpu2"]
    assert code == 1 and check["status"] == "fail" and check["hint"]
    cluster.net.mend("gpu2")
    code, out, err = cluster.gpuq("cluster", "ls", timeout=120)
    assert code == 0, err
    assert "up" in out
