"""Loading the TOML config: which file, defaults, validation and environment overrides."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from gpuq.config import (
    Config,
    DaemonConfig,
    DefaultsConfig,
    SchedulerConfig,
    config_to_dict,
    default_config,
    load_config,
)
from gpuq.errors import ConfigError
from gpuq.gpus import FakeGpuDecl, GpuConfig

GiB, MiB = 1024**3, 1024**2


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment whose XDG directories all point into tmp_path (no real config)."""
    return {
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(tmp_path),
    }


def write(tmp_path: Path, text: str, name: str = "gpuq.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_text(tmp_path: Path, env: dict[str, str], text: str) -> Config:
    return load_config(str(write(tmp_path, text)), env)


def test_defaults_without_any_file(tmp_path: Path, env: dict[str, str]) -> None:
    config = load_config(None, env)
    assert config.source is None
    assert config.daemon.state_dir == tmp_path / "state" / "gpuq"
    assert config.daemon.runtime_dir == tmp_path / "gpuq"
    assert config.daemon.log_dir == tmp_path / "state" / "gpuq" / "logs"
    assert config.daemon.socket_mode == 0o600
    assert config.daemon.node_name == os.uname().nodename.split(".")[0]
    assert config.daemon.kill_grace == 10.0
    assert config.daemon.allow_network_fs is False
    assert config.scheduler == SchedulerConfig(
        policy="gpuq",
        memory_margin=0.05,
        foreign_tolerance=512 * MiB,
        auto_mem_margin=0.10,
        interval=5.0,
    )
    assert config.defaults == DefaultsConfig(priority=0, retries=0, time_limit=None, gpus=1)
    assert config.gpus == GpuConfig(node=config.daemon.node_name)
    assert default_config(env) == config


def test_an_empty_file_means_defaults(tmp_path: Path, env: dict[str, str]) -> None:
    path = write(tmp_path, "")
    config = load_config(str(path), env)
    assert config.source == path
    assert config.scheduler == SchedulerConfig()


FULL = """\
[daemon]
state_dir = "/srv/gpuq/state"
runtime_dir = "/run/gpuq"
log_dir = "/srv/gpuq/logs"
socket_mode = "0660"
node_name = "gpu-box-1"
kill_grace = "30s"
allow_network_fs = true

[scheduler]
policy = "fifo"
memory_margin = 0.1
foreign_tolerance = "1G"
auto_mem_margin = 0.2
interval = 0.3

[defaults]
priority = -5
retries = 2
time_limit = "1-00:00:00"
gpus = 0

[gpus]
backend = "fake"
include = ["GPU-abc", 1]
exclude = [2]
fake_state_file = "/tmp/fake.json"

[[gpus.fake]]
name = "Fake A100"
memory = "80G"
count = 4

[[gpus.fake]]
memory = 25769803776
foreign_memory = "2G"
foreign_pid = 4242
utilization = 30
share_slowdown = 2.8
job_memory = "6G"
"""


def test_every_key(tmp_path: Path, env: dict[str, str]) -> None:
    config = load_text(tmp_path, env, FULL)
    assert config.daemon == DaemonConfig(
        state_dir=Path("/srv/gpuq/state"),
        runtime_dir=Path("/run/gpuq"),
        log_dir=Path("/srv/gpuq/logs"),
        socket_mode=0o660,
        node_name="gpu-box-1",
        kill_grace=30.0,
        allow_network_fs=True,
    )
    assert config.scheduler == SchedulerConfig("fifo", 0.1, GiB, 0.2, 0.3)
    assert config.defaults == DefaultsConfig(priority=-5, retries=2, time_limit=86400.0, gpus=0)
    assert config.gpus == GpuConfig(
        backend="fake",
        fake=(
            FakeGpuDecl(name="Fake A100", memory=80 * GiB, count=4),
            FakeGpuDecl(
                memory=24 * GiB,
                foreign_memory=2 * GiB,
                foreign_pid=4242,
                utilization=30.0,
                share_slowdown=2.8,
                job_memory=6 * GiB,
            ),
        ),
        fake_state_file="/tmp/fake.json",
        include=("GPU-abc", "1"),
        exclude=("2",),
        node="gpu-box-1",
    )


def test_the_documented_example_loads(tmp_path: Path, env: dict[str, str]) -> None:
    docs = Path(__file__).parent.parent / "docs" / "configuration.md"
    text = docs.read_text()
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    load_text(tmp_path, env, example)


def test_every_key_is_documented() -> None:
    docs = (Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    keys = (
        [f"daemon.{f.name}" for f in fields(DaemonConfig)]
        + [f"scheduler.{f.name}" for f in fields(SchedulerConfig)]
        + [f"defaults.{f.name}" for f in fields(DefaultsConfig)]
        + [f"gpus.{name}" for name in ("backend", "include", "exclude", "fake_state_file")]
        + [f"gpus.fake.{f.name}" for f in fields(FakeGpuDecl)]
    )
    for key in keys:
        assert f"| `{key}` |" in docs


@pytest.mark.parametrize(
    ("key_value", "field", "expected"),
    [
        ('socket_mode = "0660"', "socket_mode", 0o660),
        ('socket_mode = "0o640"', "socket_mode", 0o640),
        ('socket_mode = "600"', "socket_mode", 0o600),
        ("socket_mode = 0o660", "socket_mode", 0o660),
        ("kill_grace = 0", "kill_grace", 0.0),
        ("kill_grace = 2.5", "kill_grace", 2.5),
        ('kill_grace = "1m"', "kill_grace", 60.0),
        ('kill_grace = "0:45"', "kill_grace", 45.0),  # Slurm MM:SS
    ],
)
def test_daemon_value_forms(
    tmp_path: Path, env: dict[str, str], key_value: str, field: str, expected: object
) -> None:
    config = load_text(tmp_path, env, f"[daemon]\n{key_value}\n")
    assert getattr(config.daemon, field) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [("6G", 6 * GiB), ("512MiB", 512 * MiB), ("1GB", 10**9), (0, 0)]
)
def test_sizes_accept_strings_and_byte_counts(
    tmp_path: Path, env: dict[str, str], value: object, expected: int
) -> None:
    literal = json.dumps(value)
    config = load_text(tmp_path, env, f"[scheduler]\nforeign_tolerance = {literal}\n")
    assert config.scheduler.foreign_tolerance == expected


def test_relative_paths_are_relative_to_the_config_file(
    tmp_path: Path, env: dict[str, str]
) -> None:
    text = '[daemon]\nstate_dir = "state"\n[gpus]\nfake_state_file = "fake.json"\n'
    config = load_text(tmp_path, env, text)
    assert config.daemon.state_dir == tmp_path / "state"
    assert config.daemon.log_dir == tmp_path / "state" / "logs"
    assert config.gpus.fake_state_file == str(tmp_path / "fake.json")


def test_home_is_expanded(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = load_text(tmp_path, env, '[daemon]\nstate_dir = "~/gpuq-state"\n')
    assert config.daemon.state_dir == tmp_path / "home" / "gpuq-state"


def test_gpus_node_follows_daemon_node_name(tmp_path: Path, env: dict[str, str]) -> None:
    config = load_text(tmp_path, env, '[daemon]\nnode_name = "box"\n')
    assert config.gpus.node == "box"


def test_explicit_path_beats_environment_beats_default(tmp_path: Path, env: dict[str, str]) -> None:
    default = tmp_path / "config" / "gpuq" / "config.toml"
    default.parent.mkdir(parents=True)
    default.write_text("[defaults]\npriority = 1\n")
    from_env = write(tmp_path, "[defaults]\npriority = 2\n", "env.toml")
    explicit = write(tmp_path, "[defaults]\npriority = 3\n", "arg.toml")

    assert load_config(None, env).defaults.priority == 1
    assert load_config(None, env).source == default
    env["GPUQ_CONFIG"] = str(from_env)
    assert load_config(None, env).defaults.priority == 2
    assert load_config(str(explicit), env).defaults.priority == 3


@pytest.mark.parametrize("origin", ["--config", "GPUQ_CONFIG"])
def test_a_missing_named_file_is_an_error(tmp_path: Path, env: dict[str, str], origin: str) -> None:
    missing = tmp_path / "nope.toml"
    path = None
    if origin == "--config":
        path = str(missing)
    else:
        env["GPUQ_CONFIG"] = str(missing)
    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(path, env)
    assert str(missing) in info.value.message and origin in info.value.message


def test_gpuq_config_passed_on_as_the_config_option_is_named_as_the_variable(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # Every command's --config defaults to $GPUQ_CONFIG, so both arrive as `path`.
    missing = str(tmp_path / "nope.toml")
    env["GPUQ_CONFIG"] = missing
    with pytest.raises(ConfigError) as info:
        load_config(missing, env)
    assert "(from GPUQ_CONFIG)" in info.value.message
    assert info.value.hint == "create it, or unset GPUQ_CONFIG to use the default file"


def test_a_byte_order_mark_is_ignored(tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[defaults]\npriority = 4\n")
    assert load_config(str(path), env).defaults.priority == 4


def test_a_file_that_is_not_utf8_names_the_line(tmp_path: Path, env: dict[str, str]) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"[defaults]\n# caf\xe9\npriority = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env)
    assert info.value.message == f"config file {path} is not UTF-8 text (line 2)"


def test_a_directory_is_not_a_config_file(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path), env)
    assert info.value.message == (
        f"cannot read config file {tmp_path}: it is a directory, not a regular file"
    )


@pytest.mark.timeout(30)  # before the check, opening the FIFO waited for a writer forever
@pytest.mark.parametrize("origin", ["--config", "GPUQ_CONFIG"])
def test_a_fifo_is_refused_without_waiting_for_a_writer(
    tmp_path: Path, env: dict[str, str], origin: str
) -> None:
    fifo = tmp_path / "gpuq.toml"
    os.mkfifo(fifo)
    path = None
    if origin == "--config":
        path = str(fifo)
    else:
        env["GPUQ_CONFIG"] = str(fifo)
    with pytest.raises(ConfigError) as info:
        load_config(path, env)
    assert info.value.message == (
        f"cannot read config file {fifo}: it is a FIFO (named pipe), not a regular file"
    )
    assert info.value.hint == "point --config / GPUQ_CONFIG at a TOML file"


def test_a_device_is_not_a_config_file(env: dict[str, str]) -> None:
    """Not even /dev/null: /dev/zero would never end, and /dev/tty would wait for typing."""
    with pytest.raises(ConfigError) as info:
        load_config("/dev/null", env)
    assert info.value.message == (
        "cannot read config file /dev/null: it is a device, not a regular file"
    )


def test_invalid_toml_names_the_file_and_position(tmp_path: Path, env: dict[str, str]) -> None:
    path = write(tmp_path, "[daemon]\nstate_dir = \n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(str(path), env)
    assert str(path) in info.value.message and "line 2" in info.value.message


@pytest.mark.parametrize(
    "text",
    [
        "a = " + "[" * 5000 + "]" * 5000,
        "[daemon]\nlabels = " + "[" * 500 + "]" * 500,
        "a = " + "{b = " * 2000 + "1" + "}" * 2000,
    ],
    ids=["5000-arrays", "500-arrays-in-a-key", "2000-inline-tables"],
)
def test_toml_nested_too_deeply_is_a_config_error(
    tmp_path: Path, env: dict[str, str], text: str
) -> None:
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env)
    assert info.value.message == (
        f"config file {path} is not valid TOML: arrays or tables nested too deeply"
    )
    assert info.value.hint == (
        "a gpuq config nests a few levels at most; see docs/configuration.md for every key"
    )


def test_state_and_runtime_dirs_from_the_environment_win(
    tmp_path: Path, env: dict[str, str]
) -> None:
    env["GPUQ_STATE_DIR"] = str(tmp_path / "env-state")
    env["GPUQ_RUNTIME_DIR"] = str(tmp_path / "env-run")
    config = load_text(tmp_path, env, '[daemon]\nstate_dir = "/srv/s"\nruntime_dir = "/run/r"\n')
    assert config.daemon.state_dir == tmp_path / "env-state"
    assert config.daemon.runtime_dir == tmp_path / "env-run"
    assert config.daemon.log_dir == tmp_path / "env-state" / "logs"


def test_an_empty_environment_override_is_ignored(tmp_path: Path, env: dict[str, str]) -> None:
    env["GPUQ_STATE_DIR"] = ""
    assert load_config(None, env).daemon.state_dir == tmp_path / "state" / "gpuq"


@pytest.mark.parametrize(
    ("text", "key", "hint_part"),
    [
        ("[deamon]\n", "deamon", "did you mean 'daemon'?"),
        ("policy = 'fifo'\n", "policy", "valid keys: daemon, scheduler, defaults, gpus"),
        ("[scheduler]\nmemory_margn = 0.1\n", "scheduler.memory_margn", "'memory_margin'"),
        ("[gpus]\nnode = 'x'\n", "gpus.node", "valid keys: backend"),
        ("[[gpus.fake]]\nmem = '1G'\n", "gpus.fake[0].mem", "'memory'"),
    ],
)
def test_unknown_keys_are_named_with_the_valid_ones(
    tmp_path: Path, env: dict[str, str], text: str, key: str, hint_part: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, env, text)
    assert f"unknown config key {key} " in info.value.message
    assert info.value.hint is not None and hint_part in info.value.hint


BAD_VALUES: list[tuple[str, str, str, str]] = [
    # (section, key, TOML value, part of the hint)
    ("daemon", "state_dir", "5", "a directory path"),
    ("daemon", "state_dir", '""', "a directory path"),
    ("daemon", "socket_mode", "660", "0o660"),  # decimal 660 is not a mode
    ("daemon", "socket_mode", '"0999"', "0o660"),
    ("daemon", "socket_mode", "true", "0o660"),
    ("daemon", "node_name", '"has space"', "host name"),
    ("daemon", "node_name", '"a/b"', "host name"),
    ("daemon", "kill_grace", "-1", "seconds"),
    ("daemon", "kill_grace", '"10"', "seconds"),  # ambiguous: Slurm minutes or seconds?
    ("daemon", "kill_grace", '"soon"', "invalid duration"),
    ("daemon", "allow_network_fs", '"yes"', "true or false"),
    ("daemon", "allow_network_fs", "1", "true or false"),
    ("scheduler", "policy", '""', "policy name"),
    ("scheduler", "policy", "3", "policy name"),
    (
        "scheduler",
        "policy",
        '"ones"',
        "runs only in the simulator so far (gpuq sim); "
        "the daemon runs: fifo, tiresias, pollux, gandiva, gpuq",
    ),
    (
        "scheduler",
        "policy",
        '"nope"',
        "unknown policy 'nope'; the daemon runs: fifo, tiresias, pollux, gandiva, gpuq",
    ),
    ("scheduler", "memory_margin", "0.5", "0.5"),
    ("scheduler", "memory_margin", "-0.1", "0.5"),
    ("scheduler", "memory_margin", "true", "0.5"),
    ("scheduler", "memory_margin", '"5%"', "0.5"),
    ("scheduler", "foreign_tolerance", "-1", "512M"),
    ("scheduler", "foreign_tolerance", "1.5", "512M"),
    ("scheduler", "foreign_tolerance", '"lots"', "invalid size"),
    ("scheduler", "auto_mem_margin", "1.0", "1"),
    ("scheduler", "interval", "0.01", "from 0.05 to 3600"),
    ("scheduler", "interval", '"2h"', "from 0.05 to 3600"),
    ("defaults", "priority", "1.5", "whole number"),
    ("defaults", "priority", "true", "whole number"),
    ("defaults", "retries", "-1", "0 or more"),
    ("defaults", "time_limit", "0", "seconds"),
    ("defaults", "time_limit", "[1]", "seconds"),
    ("defaults", "gpus", '"2"', "whole number"),
    ("gpus", "backend", '"cuda"', "'auto' or 'nvml' or 'fake'"),
    ("gpus", "include", '"0"', "a list"),
    ("gpus", "include", "[-1]", "a list"),
    ("gpus", "exclude", "[true]", "a list"),
    ("gpus", "fake_state_file", "1", "a file path"),
    ("gpus", "fake", '"x"', "[[gpus.fake]]"),
]


@pytest.mark.parametrize(("section", "key", "value", "hint_part"), BAD_VALUES)
def test_bad_values_are_named_with_what_is_accepted(
    tmp_path: Path, env: dict[str, str], section: str, key: str, value: str, hint_part: str
) -> None:
    path = write(tmp_path, f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env)
    assert info.value.message.startswith(f"invalid {section}.{key} = ")
    assert str(path) in info.value.message
    assert info.value.hint is not None and hint_part in info.value.hint


@pytest.mark.parametrize("policy", ["pollux", "tiresias", "gandiva", "fifo:moves=false"])
def test_a_lab_refuses_a_policy_that_ignores_its_fair_share_and_limits(
    tmp_path: Path, env: dict[str, str], policy: str
) -> None:
    # Such a policy would order the lab's jobs without regard to their owners and let
    # any of them past max_gpus; outside lab mode the same policy loads.
    lab = write(tmp_path, f"[scheduler]\npolicy = '{policy}'\n[lab]\nenabled = true\n")
    alone = write(tmp_path, f"[scheduler]\npolicy = '{policy}'\n", name="alone.toml")
    if policy.startswith("fifo"):  # fifo applies them, with or without its moves
        assert load_config(str(lab), env).scheduler.policy == policy
        return
    with pytest.raises(ConfigError) as info:
        load_config(str(lab), env)
    message = info.value.message
    assert message.startswith(f"invalid scheduler.policy = '{policy}' with [lab] enabled in ")
    assert "fair share or its per-user limits" in message
    assert message.endswith("in lab mode the daemon runs: fifo, gpuq")
    assert info.value.hint is not None and "gpuq is the default" in info.value.hint
    assert load_config(str(alone), env).scheduler.policy == policy


def test_a_lab_runs_the_default_policy_which_applies_its_fair_share(
    tmp_path: Path, env: dict[str, str]
) -> None:
    path = write(tmp_path, "[lab]\nenabled = true\nmax_gpus = 4\n")
    assert load_config(str(path), env).scheduler.policy == "gpuq"


@pytest.mark.parametrize(
    ("table", "key", "hint_part"),
    [
        ("memory = 0", "memory", "more than 0"),
        ("memory = '1G'\nforeign_memory = '2G'", "foreign_memory", "at most `memory`"),
        ("count = 0", "count", "1 to 1024"),
        ("foreign_pid = 0", "foreign_pid", "process id"),
        ("name = ''", "name", "non-empty"),
        ("utilization = 120", "utilization", "0 to 100"),
        ("share_slowdown = 0.5", "share_slowdown", "1 or more"),
        ("share_slowdown = inf", "share_slowdown", "1 or more"),
        ("utilization = nan", "utilization", "0 to 100"),
        ("memory = '1G'\njob_memory = '2G'", "job_memory", "at most `memory`"),
    ],
)
def test_bad_fake_gpus(
    tmp_path: Path, env: dict[str, str], table: str, key: str, hint_part: str
) -> None:
    text = f"[[gpus.fake]]\nname = 'ok'\n[[gpus.fake]]\n{table}\n"
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, env, text)
    assert info.value.message.startswith(f"invalid gpus.fake[1].{key} = ")
    assert info.value.hint is not None and hint_part in info.value.hint


@pytest.mark.parametrize(
    ("line", "key", "hint_part"),
    [
        ("shares = { alice = 0 }", "shares", "numbers more than 0"),
        ("shares = { alice = nan }", "shares", "numbers more than 0"),
        ("shares = { alice = inf }", "shares", "numbers more than 0"),
        ("shares = { '@staff' = 1 }", "shares", "user names"),
        ("half_life = 0", "half_life", "more than 0"),
        ("aging = inf", "aging", "more than 0"),
        ("audit_keep = nan", "audit_keep", "more than 0"),
        ("max_gpus = -1", "max_gpus", "0 (no limit) or more"),
        ("max_running = 1.5", "max_running", "whole number"),
    ],
)
def test_bad_lab_values(
    tmp_path: Path, env: dict[str, str], line: str, key: str, hint_part: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, env, f"[lab]\n{line}\n")
    assert info.value.message.startswith(f"invalid lab.{key} = ")
    assert info.value.hint is not None and hint_part in info.value.hint


def test_a_section_must_be_a_table(tmp_path: Path, env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="invalid daemon = 3") as info:
        load_text(tmp_path, env, "daemon = 3\n")
    assert info.value.hint is not None and "[daemon]" in info.value.hint


def test_config_to_dict_is_json_ready(tmp_path: Path, env: dict[str, str]) -> None:
    path = write(tmp_path, FULL)
    data: dict[str, Any] = config_to_dict(load_config(str(path), env))
    assert json.loads(json.dumps(data)) == data
    assert data["source"] == str(path)
    assert data["daemon"]["state_dir"] == "/srv/gpuq/state"
    assert data["daemon"]["socket_mode"] == 0o660
    assert data["scheduler"]["foreign_tolerance"] == GiB
    assert data["gpus"]["include"] == ["GPU-abc", "1"]
    assert data["gpus"]["fake"][0] == {
        "name": "Fake A100",
        "memory": 80 * GiB,
        "count": 4,
        "foreign_memory": 0,
        "foreign_pid": 999999,
        "utilization": 100.0,
        "share_slowdown": 1.0,
        "link_group": "",
        "job_memory": 0,
    }
    assert set(data) == {
        "daemon",
        "scheduler",
        "gpus",
        "defaults",
        "client",
        "logs",
        "cluster",
        "lab",
        "source",
    }


def test_config_to_dict_of_defaults_has_no_source(env: dict[str, str]) -> None:
    assert config_to_dict(default_config(env))["source"] is None
