"""The `[cluster]` section, the ssh command line to a server, and what ssh's failures mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.cluster.edit import append_server, remove_server, server_table
from gpuq.cluster.ssh import bridge_argv, explain
from gpuq.config import ClusterConfig, ServerDecl, load_config
from gpuq.errors import (
    ConfigError,
    ConflictError,
    DaemonUnavailable,
    NotFoundError,
    ProtocolError,
)


def config_of(tmp_path: Path, text: str) -> ClusterConfig:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(str(path), environ={}).cluster


def test_servers_are_read_with_their_defaults(tmp_path: Path) -> None:
    cluster = config_of(
        tmp_path,
        '[cluster]\nssh_config = "ssh.conf"\nconnect_timeout = "4s"\n'
        '[[cluster.servers]]\nhost = "gpu2"\n'
        '[[cluster.servers]]\nhost = "ana@gpu3.lab"\ngpus = [0, "GPU-x"]\nlabels = ["a100"]\n'
        'command = "/opt/gpuq/bin/gpuq"\n',
    )
    assert cluster.ssh_config == tmp_path / "ssh.conf"
    assert cluster.connect_timeout == 4.0
    assert cluster.servers == (
        ServerDecl("gpu2"),
        ServerDecl("ana@gpu3.lab", ("0", "GPU-x"), ("a100",), "/opt/gpuq/bin/gpuq"),
    )


def test_no_cluster_section_means_no_servers(tmp_path: Path) -> None:
    assert config_of(tmp_path, "") == ClusterConfig()


def test_safety_checkpoints_are_taken_every_ten_minutes_unless_told_otherwise(
    tmp_path: Path,
) -> None:
    assert ClusterConfig().checkpoint_every == 600.0
    assert config_of(tmp_path, '[cluster]\ncheckpoint_every = "2m"\n').checkpoint_every == 120.0
    assert config_of(tmp_path, "[cluster]\ncheckpoint_every = 0\n").checkpoint_every == 0.0
    with pytest.raises(ConfigError) as caught:
        config_of(tmp_path, "[cluster]\ncheckpoint_every = -5\n")
    assert "cluster.checkpoint_every" in caught.value.message
    assert "0: never" in f"{caught.value.message} {caught.value.hint}"


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ('host = "-oProxyCommand=touch /tmp/x"', "not starting with '-'"),
        ('host = "gpu2; rm -rf ~"', "ssh destination"),
        ("gpus = [0]", "cluster.servers[0].host"),
        ('host = "gpu2"\ncommand = "gpuq; reboot"', "command"),
        ('host = "gpu2"\nlabels = ["has space"]', "labels"),
        ('host = "gpu2"\nport = 22', "unknown config key cluster.servers[0].port"),
    ],
)
def test_a_bad_server_table_is_refused_with_its_key(tmp_path: Path, table: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config_of(tmp_path, f"[[cluster.servers]]\n{table}\n")
    assert words in f"{caught.value.message} {caught.value.hint}"


def test_two_tables_of_one_host_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="two .* host = 'gpu2'"):
        config_of(tmp_path, '[[cluster.servers]]\nhost = "gpu2"\n' * 2)


def test_the_ssh_command_is_batch_shared_and_ends_options_before_the_host(tmp_path: Path) -> None:
    cluster = ClusterConfig(ssh_config=tmp_path / "ssh.conf", connect_timeout=2.5)
    argv = bridge_argv(ServerDecl("gpu2", command="/opt/gpuq"), cluster, tmp_path)
    assert argv[:3] == ["ssh", "-F", str(tmp_path / "ssh.conf")]
    assert argv[-4:] == ["--", "gpu2", "/opt/gpuq", "bridge"]
    options = {argv[i + 1].split("=")[0]: argv[i + 1] for i, a in enumerate(argv) if a == "-o"}
    assert options["BatchMode"] == "BatchMode=yes"
    assert options["ConnectTimeout"] == "ConnectTimeout=2"
    assert options["ControlMaster"] == "ControlMaster=auto"
    assert options["ControlPath"] == f"ControlPath={tmp_path / 'ssh' / 'ssh-%C'}"


@pytest.mark.parametrize(
    ("status", "stderr", "kind", "words"),
    [
        (
            255,
            "ssh: Could not resolve hostname gpu9: Name or service not known",
            DaemonUnavailable,
            "unknown host gpu9",
        ),
        (255, "Host key verification failed.", DaemonUnavailable, "host key is not known"),
        (
            255,
            "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\n"
            "Host key verification failed.",
            DaemonUnavailable,
            "host key has changed",
        ),
        (
            255,
            "ana@gpu9: Permission denied (publickey).",
            DaemonUnavailable,
            "never asks for a password",
        ),
        (
            255,
            "ssh: connect to host gpu9 port 22: Connection timed out",
            DaemonUnavailable,
            "did not answer in time",
        ),
        (127, "bash: line 1: gpuq: command not found", DaemonUnavailable, "gpu9 has no gpuq"),
        (
            2,
            "Usage: gpuq [OPTIONS] COMMAND\nError: No such command 'bridge'.",
            ProtocolError,
            "too old",
        ),
        (
            2,
            "gpuq: error: no such command 'bridge'\nhint: see gpuq --help",
            ProtocolError,
            "too old",
        ),
        (
            255,
            "kex_exchange_identification: read: Connection reset by peer",
            DaemonUnavailable,
            "cannot reach gpu9",
        ),
    ],
)
def test_each_ssh_failure_gets_its_own_message_and_a_hint(
    status: int, stderr: str, kind: type[Exception], words: str
) -> None:
    error = explain("gpu9", "gpuq", status, stderr)
    assert isinstance(error, kind)
    assert words in error.message
    assert error.hint


def test_a_table_is_appended_to_the_users_file_as_written(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('# mine\n[scheduler]\npolicy = "fifo"   # keep\n')
    append_server(path, ServerDecl("gpu2", labels=("a100",)))
    text = path.read_text()
    assert text.startswith('# mine\n[scheduler]\npolicy = "fifo"   # keep\n\n[[cluster.servers]]')
    assert load_config(str(path), environ={}).cluster.servers == (
        ServerDecl("gpu2", labels=("a100",)),
    )
    with pytest.raises(ConflictError):
        append_server(path, ServerDecl("gpu2"))
    assert path.read_text() == text


def test_a_file_the_table_would_break_is_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    original = "[cluster]\nservers = []\n"  # an inline array: a [[cluster.servers]] table clashes
    path.write_text(original)
    with pytest.raises(ConfigError):
        append_server(path, ServerDecl("gpu2"))
    assert path.read_text() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_a_new_file_is_created_with_the_table(tmp_path: Path) -> None:
    path = tmp_path / "gpuq" / "config.toml"
    append_server(path, ServerDecl("gpu2", command="/opt/gpuq"))
    assert path.read_text() == server_table(ServerDecl("gpu2", command="/opt/gpuq"))
    assert 'command = "/opt/gpuq"' in path.read_text()


def test_removing_a_server_deletes_its_table_and_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        '# lab servers\n[scheduler]\npolicy = "fifo"\n\n'
        '[[cluster.servers]]\nhost = "gpu2"\nlabels = ["a100"]  # the new one\n\n'
        "# the old box, keep it last\n"
        '[[cluster.servers]]\nhost = "gpu3"\n'
    )
    remove_server(path, "gpu2")
    assert path.read_text() == (
        '# lab servers\n[scheduler]\npolicy = "fifo"\n\n'
        "# the old box, keep it last\n"
        '[[cluster.servers]]\nhost = "gpu3"\n'
    )
    remove_server(path, "gpu3")
    assert path.read_text() == '# lab servers\n[scheduler]\npolicy = "fifo"\n'
    with pytest.raises(NotFoundError, match="gpu3 is not a server"):
        remove_server(path, "gpu3")


def test_a_table_gpuq_cannot_find_line_by_line_is_left_to_the_user(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    original = '[cluster]\nservers = [{host = "gpu2"}]\n'  # an inline table: no header line
    path.write_text(original)
    with pytest.raises(ConfigError, match="cannot find"):
        remove_server(path, "gpu2")
    assert path.read_text() == original


def test_added_then_removed_gives_the_file_back(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    original = '[daemon]\nnode_name = "head"\n'
    path.write_text(original)
    append_server(path, ServerDecl("gpu2", labels=("l4",)))
    remove_server(path, "gpu2")
    assert path.read_text() == original
