"""The TOML configuration file, read once into a frozen `Config`.

Which file: the `--config` argument, else `$GPUQ_CONFIG`, else
`$XDG_CONFIG_HOME/gpuq/config.toml` (`~/.config/gpuq/config.toml`). A file
named explicitly must exist; a missing default file means built-in defaults.
`$GPUQ_STATE_DIR` and `$GPUQ_RUNTIME_DIR` then override `daemon.state_dir`
and `daemon.runtime_dir` (tests and the demo use them to stay isolated).

Validation is strict, so a typo never silently does nothing: an unknown key,
a wrong type or an out-of-range value is a `ConfigError` naming the key and
the value, with a hint saying what is accepted (docs/configuration.md lists
every key). On the `gpuq submit` fast path: stdlib only, `tomllib` imported
only when a file is read.
"""

from __future__ import annotations

import codecs
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

from gpuq.errors import ConfigError, UsageError
from gpuq.gpus import BACKEND_KINDS, FakeGpuDecl, GpuConfig
from gpuq.models import HOST_PATTERN, LABEL_PATTERN
from gpuq.paths import default_config_path, default_runtime_dir, default_state_dir
from gpuq.units import MAX_DURATION, parse_duration, parse_size

T = TypeVar("T")
Converter = Callable[[object], T | None]
"""Turns a TOML value into a setting, or returns None to reject it."""

CONFIG_ENV = "GPUQ_CONFIG"
"""Environment variable naming the config file (below `--config`, above the default)."""
STATE_DIR_ENV = "GPUQ_STATE_DIR"
"""Environment variable overriding `daemon.state_dir`."""
RUNTIME_DIR_ENV = "GPUQ_RUNTIME_DIR"
"""Environment variable overriding `daemon.runtime_dir`."""

_DOCS_HINT = "see docs/configuration.md for every key"
_NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """The `[daemon]` section: where the daemon keeps things and how it behaves."""

    state_dir: Path
    runtime_dir: Path
    log_dir: Path
    socket_mode: int = 0o600
    node_name: str = ""
    kill_grace: float = 10.0
    allow_network_fs: bool = False
    labels: tuple[str, ...] = ()
    """This server's labels, for `gpuq submit --label` (servers have their own)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The `[scheduler]` section: the policy, how often it decides, the memory safety margins.

    `interval` is the longest time between two decisions when nothing
    happens (a submission, an exit or a GPU change triggers one at once):
    policies whose choices change with time alone (tiresias's service
    thresholds) act within it.
    """

    policy: str = "gpuq"
    memory_margin: float = 0.05
    foreign_tolerance: int = 512 * 1024**2
    auto_mem_margin: float = 0.10
    interval: float = 5.0


@dataclass(frozen=True, slots=True)
class DefaultsConfig:
    """The `[defaults]` section: what `gpuq submit` assumes when an option is absent."""

    priority: int = 0
    retries: int = 0
    time_limit: float | None = None
    gpus: int = 1


@dataclass(frozen=True, slots=True)
class LogsConfig:
    """The `[logs]` section: how large a job's output file may grow (0: no limit)."""

    max_size: int = 1024**3


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """The `[client]` section: how long a command waits for the daemon, and which daemon.

    `daemon`: "auto" uses the lab's system daemon where its socket exists
    and this user's own daemon otherwise; "lab" or "personal" forces one.
    """

    timeout: float = 10.0
    daemon: str = "auto"


@dataclass(frozen=True, slots=True)
class ServerDecl:
    """One `[[cluster.servers]]` table: another server this daemon reaches over ssh."""

    host: str
    """The ssh destination: a host name or an alias of the ssh config, optionally user@."""
    gpus: tuple[str, ...] = ()
    """Only these GPUs of it (UUIDs or indices); empty: all."""
    labels: tuple[str, ...] = ()
    command: str = "gpuq"
    """The gpuq command on that server (a path where gpuq is not on ssh's PATH there)."""


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """The `[cluster]` section: the other servers of the lab, and how ssh reaches them."""

    servers: tuple[ServerDecl, ...] = ()
    ssh_config: Path | None = None
    """An ssh config file for these connections (ssh -F); None: the user's own."""
    connect_timeout: float = 10.0
    heartbeat: float = 5.0
    """Seconds between two status requests to each server (`gpuq.daemon.servers`)."""
    down_after: float = 30.0
    """Seconds without an answer after which a server is down."""
    checkpoint_every: float = 600.0
    """Seconds between safety checkpoints of a runner job on another server; 0: none.

    The head keeps a copy of each (`gpuq.daemon.safety`), so the job resumes
    from it when that server is lost.
    """


LAB_SOCKET = Path("/run/gpuq/gpuq.sock")
"""Where the lab's system daemon listens (`[lab] socket` or `$GPUQ_LAB_SOCKET` moves it)."""
LAB_SOCKET_ENV = "GPUQ_LAB_SOCKET"
"""Environment variable naming the lab daemon's socket (tests run one on a private path)."""
DAEMON_ENV = "GPUQ_DAEMON"
"""Environment variable choosing the daemon a command talks to: auto, lab or personal."""
DAEMON_CHOICES = ("auto", "lab", "personal")


@dataclass(frozen=True, slots=True)
class LabConfig:
    """The `[lab]` section: one system daemon shared by the lab's users.

    `enabled` makes this daemon the lab's: it accepts every local user
    (identity from the kernel, SO_PEERCRED), runs each job as its owner, and
    applies `admins` (user names, or `@group`), the per-user limits (0: no
    limit), fair share (each user's `shares`, default 1, against usage
    decayed with `half_life`) and `hide_others` (other users' job names and
    commands shown as "-").
    """

    enabled: bool = False
    socket: Path = LAB_SOCKET
    admins: tuple[str, ...] = ()
    hide_others: bool = False
    max_gpus: int = 0
    max_running: int = 0
    max_queued: int = 0
    max_priority: int = 0
    """The highest job priority a user who is not an admin may give (fair share rules below it)."""
    half_life: float = 7 * 86400.0
    shares: tuple[tuple[str, float], ...] = ()
    aging: float = 86400.0
    """Seconds of waiting that add 1 to a job's fair-share priority, so nothing starves."""
    audit_keep: float = 90 * 86400.0
    """Seconds an audit entry is kept."""
    service_account: str = ""
    """The account the lab daemons of other servers log in as over ssh ("": none).

    Only it (and root) may send node requests, and only it may act for
    another user (a member forwarding that user's request).
    """
    head: str = ""
    """The ssh destination of the server that keeps the lab's one queue ("": this one).

    Set on every other server (a member): users' requests there go to the
    head, as the service account, with the caller's identity attached.
    """
    head_command: str = "gpuq"
    """The gpuq command on the head (a path where gpuq is not on ssh's PATH there)."""

    def share_of(self, user: str) -> float:
        """The user's configured share (1 for a user the table does not name)."""
        return dict(self.shares).get(user, 1.0)


@dataclass(frozen=True, slots=True)
class Config:
    """The whole configuration; `source` is the file it came from (None: built-in defaults)."""

    daemon: DaemonConfig
    scheduler: SchedulerConfig
    gpus: GpuConfig
    defaults: DefaultsConfig
    client: ClientConfig = ClientConfig()
    logs: LogsConfig = LogsConfig()
    cluster: ClusterConfig = ClusterConfig()
    lab: LabConfig = LabConfig()
    source: Path | None = None


_SIZE = 'bytes (a whole number) or a size such as "512M"'
_DEVICES = 'a list of GPU UUIDs or indices, like ["0", 1]'
_EXPECTED: dict[str, str] = {
    "daemon.state_dir": "a directory path",
    "daemon.runtime_dir": "a directory path",
    "daemon.log_dir": "a directory path",
    "daemon.socket_mode": 'a mode such as 0o660 or "0660"',
    "daemon.node_name": "a host name (letters, digits, '.', '_', '-')",
    "daemon.kill_grace": 'seconds (0 or more) or a duration such as "30s"',
    "daemon.allow_network_fs": "true or false",
    "daemon.labels": 'a list of labels such as ["a100", "fast-disk"]',
    "scheduler.policy": 'a policy name such as "gpuq" or "fifo"',
    "scheduler.memory_margin": "a fraction from 0 up to but excluding 0.5",
    "scheduler.foreign_tolerance": _SIZE,
    "scheduler.auto_mem_margin": "a fraction from 0 up to but excluding 1",
    "scheduler.interval": 'seconds, from 0.05 to 3600, or a duration such as "5s"',
    "defaults.priority": "a whole number",
    "defaults.retries": "a whole number, 0 or more",
    "defaults.time_limit": 'seconds (a number) or a duration such as "4h"',
    "defaults.gpus": "a whole number, 0 or more",
    "logs.max_size": 'a size of 4K or more, such as "1G" (past it, the middle of a log is '
    "dropped, with a marker), or 0 for no limit",
    "lab.enabled": "true or false",
    "lab.socket": "a socket path (default /run/gpuq/gpuq.sock)",
    "lab.admins": 'a list of user names and @groups, such as ["alice", "@gpuadmin"]',
    "lab.hide_others": "true or false",
    "lab.max_gpus": "a whole number, 0 (no limit) or more",
    "lab.max_running": "a whole number, 0 (no limit) or more",
    "lab.max_queued": "a whole number, 0 (no limit) or more",
    "lab.max_priority": "a whole number (0: users may only lower their jobs' priority)",
    "lab.half_life": 'seconds, more than 0, or a duration such as "7d"',
    "lab.shares": "a table of user names to shares (numbers more than 0), such as "
    "{ alice = 2, bob = 1 }",
    "lab.aging": 'seconds, more than 0, or a duration such as "1d" (waiting this long adds 1 '
    "to a job's fair-share priority)",
    "lab.audit_keep": 'seconds, more than 0, or a duration such as "90d"',
    "lab.service_account": 'a user name, such as "gpuq"',
    "lab.head": 'the head server\'s ssh destination, such as "gpuq@gpu1"',
    "lab.head_command": 'a command or path, such as "/opt/gpuq/bin/gpuq"',
    "client.daemon": '"auto" (the lab daemon where one runs), "lab" or "personal"',
    "client.timeout": "seconds of silence from the daemon before a command gives up, more than 2 "
    '(a number or a duration such as "30s")',
    "gpus.backend": " or ".join(map(repr, BACKEND_KINDS)),
    "gpus.include": _DEVICES,
    "gpus.exclude": _DEVICES,
    "gpus.fake_state_file": "a file path",
    "gpus.fake": "tables, each written with double brackets: [[gpus.fake]] then its keys "
    "(count = 4) on the lines below, one table per kind of fake GPU",
    "gpus.fake.name": "a non-empty string",
    "gpus.fake.memory": _SIZE,
    "gpus.fake.count": "a whole number from 1 to 1024",
    "gpus.fake.foreign_memory": _SIZE,
    "gpus.fake.foreign_pid": "a process id, 1 or more",
    "gpus.fake.utilization": "a percentage from 0 to 100",
    "gpus.fake.share_slowdown": "a number, 1 or more (1: sharing costs nothing)",
    "gpus.fake.link_group": "a string (GPUs with the same one share a PCIe switch or NVLink)",
    "gpus.fake.job_memory": _SIZE,
    "cluster.servers": "tables, each written with double brackets: [[cluster.servers]] then "
    'its keys (host = "gpu2") on the lines below, one table per server',
    "cluster.ssh_config": "a file path (an ssh config for gpuq's connections)",
    "cluster.connect_timeout": 'seconds, more than 0, or a duration such as "10s"',
    "cluster.heartbeat": 'seconds, from 0.05 to 3600, or a duration such as "5s"',
    "cluster.down_after": 'seconds, more than 0, or a duration such as "30s"',
    "cluster.checkpoint_every": 'seconds (0: never) or a duration such as "10m"',
    "cluster.servers.host": "an ssh destination: a host name or ssh alias, optionally user@, "
    "not starting with '-'",
    "cluster.servers.gpus": _DEVICES,
    "cluster.servers.labels": 'a list of labels such as ["a100", "fast-disk"]',
    "cluster.servers.command": "the gpuq command on that server: a path such as "
    '"/opt/gpuq/bin/gpuq" (letters, digits and ._/~+-)',
}
"""Every valid key, with what it accepts (the hint of a ConfigError)."""


def load_config(path: str | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate the config file chosen by `path`, `$GPUQ_CONFIG` or the default.

    Raises `ConfigError` for a missing explicit file, unreadable or invalid
    TOML, unknown keys, and values of the wrong type or range.
    """
    env = os.environ if environ is None else environ
    if path:
        # --config takes GPUQ_CONFIG as its default: name the variable when it is the source.
        origin = CONFIG_ENV if env.get(CONFIG_ENV) == path else "--config"
        source = Path(path).expanduser()
    elif env.get(CONFIG_ENV):
        source, origin = Path(env[CONFIG_ENV]).expanduser(), CONFIG_ENV
    else:
        source, origin = default_config_path(env), ""
    data = _read_toml(source, origin)
    if data is None:
        return _build({}, None, env)
    return _build(data, source.absolute(), env)


def default_config(environ: Mapping[str, str] | None = None) -> Config:
    """The built-in defaults, with the `$GPUQ_STATE_DIR`/`$GPUQ_RUNTIME_DIR` overrides."""
    return _build({}, None, os.environ if environ is None else environ)


def config_to_dict(config: Config) -> dict[str, Any]:
    """The config as plain JSON-ready data (paths as strings), for `gpuq doctor --json`."""
    return {f.name: _plain(getattr(config, f.name)) for f in fields(config)}


def _plain(value: object) -> object:
    """Dataclasses to dicts, tuples to lists, paths to strings; other values unchanged."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _read_toml(source: Path, origin: str) -> dict[str, Any] | None:
    """The parsed file, or None when the default file does not exist."""
    import tomllib

    try:
        raw = _read_regular_file(source)
        if raw.startswith(codecs.BOM_UTF8):  # Windows editors write one; TOML has none
            raw = raw[len(codecs.BOM_UTF8) :]
        return tomllib.loads(raw.decode())
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(
            f"config file {source} is not valid TOML: arrays or tables nested too deeply",
            f"a gpuq config nests a few levels at most; {_DOCS_HINT}",
        ) from None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"config file {source} is not UTF-8 text (line {line})",
            "save it as UTF-8: TOML files are UTF-8",
        ) from None
    except FileNotFoundError:
        if not origin:
            return None
        raise ConfigError(
            f"config file {source} (from {origin}) does not exist",
            "create it, or "
            + (f"unset {origin}" if origin == CONFIG_ENV else f"drop {origin}")
            + " to use the default file",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {source}: {exc.strerror}",
            "make it a readable file, or point --config / GPUQ_CONFIG elsewhere",
        ) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"config file {source} is not valid TOML: {exc}",
            f"fix the syntax at the position shown; {_DOCS_HINT}",
        ) from None


def _read_regular_file(source: Path) -> bytes:
    """The bytes of `source`; ConfigError unless it is a regular file (raises OSError).

    Opened without blocking and looked at before reading: a FIFO would wait
    for a writer forever, and a device such as /dev/zero might never end.
    """
    fd = os.open(source, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(
                f"cannot read config file {source}: it is {_file_kind(mode)}, not a regular file",
                "point --config / GPUQ_CONFIG at a TOML file",
            )
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read()
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    """What a file that is not a regular one is, for an error message."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a special file"


class _Table:
    """One TOML table being read: typed getters that reject unknown keys and bad values."""

    def __init__(
        self, data: object, name: str, source: Path | None, section: str | None = None
    ) -> None:
        self.name = name
        self.section = section or name.split("[")[0]
        self.source = source
        if not isinstance(data, dict):
            raise self.error("", data, "a table, like [" + name + "]")
        self.data: dict[str, Any] = data
        valid = _valid_keys(self.section)
        for key in data:
            if key not in valid:
                raise _unknown(f"{name}.{key}", key, valid, source)

    def error(self, key: str, value: object, expected: str) -> ConfigError:
        """A ConfigError for `key` = `value`, with `expected` as the hint."""
        dotted = f"{self.name}.{key}" if key else self.name
        where = f" in {self.source}" if self.source else ""
        return ConfigError(f"invalid {dotted} = {value!r}{where}", f"{dotted} must be {expected}")

    def get(self, key: str, default: T, convert: Converter[T]) -> T:
        """The converted value of `key`, `default` if absent; `convert` returns None to reject."""
        if key not in self.data:
            return default
        value = self.data[key]
        expected = _EXPECTED[f"{self.section}.{key}"]
        try:
            converted = convert(value)
        except UsageError as exc:
            raise self.error(key, value, f"{expected} ({exc.message})") from None
        if converted is None:
            raise self.error(key, value, expected)
        return converted


def _valid_keys(section: str) -> tuple[str, ...]:
    """The keys a table may hold, from `_EXPECTED`."""
    return tuple(k.rpartition(".")[2] for k in _EXPECTED if k.rpartition(".")[0] == section)


def _unknown(dotted: str, key: str, valid: tuple[str, ...], source: Path | None) -> ConfigError:
    """The error for an unknown key, suggesting the nearest valid one."""
    import difflib

    close = difflib.get_close_matches(key, valid, n=1)
    suggestion = f"did you mean {close[0]!r}? " if close else ""
    where = f" in {source}" if source else ""
    return ConfigError(
        f"unknown config key {dotted}{where}", f"{suggestion}valid keys: {', '.join(valid)}"
    )


def _instance(kind: type[T], accept: Callable[[Any], object] | None = None) -> Converter[T]:
    """A converter accepting values of `kind` (booleans only for bool) that `accept` approves."""

    def convert(value: object) -> T | None:
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            return None
        return value if accept is None or accept(value) else None

    return convert


def _live_policy(value: object) -> str | None:
    """A policy name the daemon can run (the registry's UsageError says which it can)."""
    if not isinstance(value, str) or not value.strip():
        return None
    from gpuq.policies.registry import check_live_policy

    return check_live_policy(value.strip())


def _integer(minimum: int, maximum: int | None = None) -> Converter[int]:
    """A converter accepting whole numbers (not booleans) in [minimum, maximum]."""
    return _instance(int, lambda v: minimum <= v and (maximum is None or v <= maximum))


def _fraction(below: float) -> Converter[float]:
    """A converter accepting a number x with 0 <= x < below."""

    def convert(value: object) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if 0 <= value < below else None

    return convert


def _number(minimum: float, maximum: float | None = None) -> Converter[float]:
    """A converter accepting a finite number (not a boolean) in [minimum, maximum]."""

    def convert(value: object) -> float | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        top = math.inf if maximum is None else maximum
        return float(value) if minimum <= value <= top and math.isfinite(value) else None

    return convert


def _size(value: object) -> int | None:
    """Bytes from an integer or a size string ("6G"); see `parse_size`."""
    if isinstance(value, str):
        return parse_size(value)
    return _integer(0)(value)


def _duration(value: object) -> float | None:
    """Seconds (0 or more) from a number, or from a duration string other than a bare number."""
    if isinstance(value, str):
        if re.fullmatch(r"\s*[\d.]+\s*", value):  # minutes to Slurm, seconds as a TOML number
            number = value.strip()
            raise UsageError(f'write {number} for seconds, or add a unit as in "{number}m"')
        return parse_duration(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < MAX_DURATION else None


def _positive_duration(value: object) -> float | None:
    """Like `_duration`, but 0 is refused."""
    seconds = _duration(value)
    return seconds if seconds is None or seconds > 0 else None


def _interval(value: object) -> float | None:
    """A duration from 50 ms to an hour."""
    seconds = _duration(value)
    return seconds if seconds is None or 0.05 <= seconds <= 3600 else None


def _log_size(value: object) -> int | None:
    """0 (no limit) or a size of at least 4 KiB."""
    size = _size(value)
    return size if size is None or size == 0 or size >= 4096 else None


def _client_timeout(value: object) -> float | None:
    """A duration longer than the daemon's heartbeat interval (2 s)."""
    seconds = _duration(value)
    return seconds if seconds is None or seconds > 2 else None


def _socket_mode(value: object) -> int | None:
    """A permission mode from an integer (0o660) or an octal string ("0660")."""
    if isinstance(value, str):
        digits = value.strip().lower().removeprefix("0o")
        if not re.fullmatch(r"[0-7]{1,4}", digits):
            return None
        value = int(digits, 8)
    return _integer(0, 0o777)(value)


def _device_list(value: object) -> tuple[str, ...] | None:
    """GPU UUIDs or indices; integers become strings ("0")."""
    if not isinstance(value, list):
        return None
    entries: list[str] = []
    for item in value:
        if isinstance(item, str) and item.strip():
            entries.append(item.strip())
        elif isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            entries.append(str(item))
        else:
            return None
    return tuple(entries)


def _path_converter(base: Path | None) -> Converter[Path]:
    """A converter to a path: "~" expanded, relative paths taken from the config's directory."""

    def convert(value: object) -> Path | None:
        if not isinstance(value, str) or not value.strip():
            return None
        path = Path(value).expanduser()
        return path if path.is_absolute() or base is None else base / path

    return convert


def _env_dir(env: Mapping[str, str], name: str) -> Path | None:
    value = env.get(name, "")
    return Path(os.path.abspath(Path(value).expanduser())) if value else None


def _short_hostname() -> str:
    return os.uname().nodename.split(".")[0] or "localhost"


def _build(data: Mapping[str, Any], source: Path | None, env: Mapping[str, str]) -> Config:
    """Validate parsed TOML `data` into a Config (defaults for what is absent)."""
    sections = ("daemon", "scheduler", "defaults", "gpus", "client", "logs", "cluster", "lab")
    for section in data:
        if section not in sections:
            raise _unknown(section, section, sections, source)
    path = _path_converter(None if source is None else source.parent)
    daemon = _daemon(_Table(data.get("daemon", {}), "daemon", source), path, env)
    scheduler = _Table(data.get("scheduler", {}), "scheduler", source)
    s = SchedulerConfig()
    defaults = _Table(data.get("defaults", {}), "defaults", source)
    d = DefaultsConfig()
    client = _Table(data.get("client", {}), "client", source)
    logs = _Table(data.get("logs", {}), "logs", source)
    lab = _lab(data.get("lab", {}), source, path, env)
    policy = scheduler.get("policy", s.policy, _live_policy)
    if lab.enabled:
        _lab_policy(policy, source)
    return Config(
        daemon=daemon,
        scheduler=SchedulerConfig(
            policy=policy,
            memory_margin=scheduler.get("memory_margin", s.memory_margin, _fraction(0.5)),
            foreign_tolerance=scheduler.get("foreign_tolerance", s.foreign_tolerance, _size),
            auto_mem_margin=scheduler.get("auto_mem_margin", s.auto_mem_margin, _fraction(1.0)),
            interval=scheduler.get("interval", s.interval, _interval),
        ),
        gpus=_gpus(data.get("gpus", {}), source, path, daemon.node_name),
        defaults=DefaultsConfig(
            priority=defaults.get("priority", d.priority, _integer(-(2**31), 2**31 - 1)),
            retries=defaults.get("retries", d.retries, _integer(0)),
            time_limit=defaults.get("time_limit", d.time_limit, _positive_duration),
            gpus=defaults.get("gpus", d.gpus, _integer(0)),
        ),
        client=ClientConfig(
            timeout=client.get("timeout", ClientConfig().timeout, _client_timeout),
            daemon=_daemon_choice(env) or client.get("daemon", "auto", _choice(DAEMON_CHOICES)),
        ),
        logs=LogsConfig(max_size=logs.get("max_size", LogsConfig().max_size, _log_size)),
        cluster=_cluster(data.get("cluster", {}), source, path),
        lab=lab,
        source=source,
    )


def _lab_policy(policy: str, source: Path | None) -> None:
    """Refuse, with `[lab] enabled`, a policy that ignores the lab's fair share and limits."""
    from gpuq.policies.registry import check_lab_policy

    try:
        check_lab_policy(policy)
    except UsageError as exc:
        where = f" in {source}" if source else ""
        raise ConfigError(
            f"invalid scheduler.policy = {policy!r} with [lab] enabled{where}: {exc.message}",
            exc.hint,
        ) from None


def _choice(choices: tuple[str, ...]) -> Converter[str]:
    return _instance(str, lambda value: value in choices)


def _daemon_choice(env: Mapping[str, str]) -> str | None:
    """`$GPUQ_DAEMON`, validated (it overrides `client.daemon`)."""
    value = env.get(DAEMON_ENV, "")
    if not value:
        return None
    if value not in DAEMON_CHOICES:
        raise ConfigError(
            f"{DAEMON_ENV}={value!r} is not a daemon choice",
            f"use one of {', '.join(DAEMON_CHOICES)}",
        )
    return value


_USER_RE = re.compile(r"@?[A-Za-z0-9_][A-Za-z0-9._-]*\$?")


def _admins(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(
        isinstance(v, str) and _USER_RE.fullmatch(v) for v in value
    ):
        return None
    return tuple(value)


def _shares(value: object) -> tuple[tuple[str, float], ...] | None:
    if not isinstance(value, dict):
        return None
    out = []
    for user, share in value.items():
        if (
            not _USER_RE.fullmatch(user)
            or user.startswith("@")
            or not isinstance(share, int | float)
            or isinstance(share, bool)
            or not 0 < share < math.inf
        ):
            return None
        out.append((user, float(share)))
    return tuple(sorted(out))


def _lab(
    data: object, source: Path | None, path: Converter[Path], env: Mapping[str, str]
) -> LabConfig:
    """The `[lab]` section; `$GPUQ_LAB_SOCKET` overrides its socket."""
    table = _Table(data, "lab", source)
    d = LabConfig()
    socket = _env_dir(env, LAB_SOCKET_ENV) or table.get("socket", d.socket, path)
    return LabConfig(
        enabled=table.get("enabled", d.enabled, _instance(bool)),
        socket=socket,
        admins=table.get("admins", d.admins, _admins),
        hide_others=table.get("hide_others", d.hide_others, _instance(bool)),
        max_gpus=table.get("max_gpus", d.max_gpus, _integer(0)),
        max_running=table.get("max_running", d.max_running, _integer(0)),
        max_queued=table.get("max_queued", d.max_queued, _integer(0)),
        max_priority=table.get("max_priority", d.max_priority, _integer(-(2**63), 2**63 - 1)),
        half_life=table.get("half_life", d.half_life, _positive_duration),
        shares=table.get("shares", d.shares, _shares),
        audit_keep=table.get("audit_keep", d.audit_keep, _positive_duration),
        aging=table.get("aging", d.aging, _positive_duration),
        service_account=table.get(
            "service_account", d.service_account, _instance(str, _account_name)
        ),
        head=table.get("head", d.head, _instance(str, _HOST_RE.fullmatch)),
        head_command=table.get(
            "head_command", d.head_command, _instance(str, _COMMAND_RE.fullmatch)
        ),
    )


def _account_name(value: str) -> bool:
    """An account name ("" for none): what `[lab] admins` accepts, without '@'."""
    return not value or (not value.startswith("@") and bool(_USER_RE.fullmatch(value)))


_HOST_RE = re.compile(HOST_PATTERN)
_COMMAND_RE = re.compile(r"[A-Za-z0-9._/~+-]+")
_LABEL_RE = re.compile(LABEL_PATTERN)


def _labels(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(
        isinstance(v, str) and _LABEL_RE.fullmatch(v) for v in value
    ):
        return None
    return tuple(value)


def server_decl(data: object, name: str = "server", source: Path | None = None) -> ServerDecl:
    """One `[[cluster.servers]]` table (`name` is what errors call it), validated."""
    server = _Table(data, name, source, section="cluster.servers")
    if "host" not in server.data:
        raise server.error("host", None, _EXPECTED["cluster.servers.host"])
    return ServerDecl(
        host=server.get("host", "", _instance(str, _HOST_RE.fullmatch)),
        gpus=server.get("gpus", (), _device_list),
        labels=server.get("labels", (), _labels),
        command=server.get("command", "gpuq", _instance(str, _COMMAND_RE.fullmatch)),
    )


def _cluster(data: object, source: Path | None, path: Converter[Path]) -> ClusterConfig:
    """The `[cluster]` section with its `[[cluster.servers]]` tables.

    A host is what ssh gets as its destination: one starting with '-' would be
    read as an option, so the pattern refuses it; two tables of one host are refused.
    """
    table = _Table(data, "cluster", source)
    d = ClusterConfig()
    servers: list[ServerDecl] = []
    tables: list[object] = table.get("servers", [], _instance(list))
    for i, item in enumerate(tables):
        decl = server_decl(item, f"cluster.servers[{i}]", source)
        if any(other.host == decl.host for other in servers):
            raise ConfigError(
                f"two [[cluster.servers]] tables have host = {decl.host!r}"
                + (f" in {source}" if source else ""),
                "keep one table per server",
            )
        servers.append(decl)
    return ClusterConfig(
        servers=tuple(servers),
        ssh_config=table.get("ssh_config", d.ssh_config, path),
        connect_timeout=table.get("connect_timeout", d.connect_timeout, _positive_duration),
        heartbeat=table.get("heartbeat", d.heartbeat, _interval),
        down_after=table.get("down_after", d.down_after, _positive_duration),
        checkpoint_every=table.get("checkpoint_every", d.checkpoint_every, _duration),
    )


def _daemon(table: _Table, path: Converter[Path], env: Mapping[str, str]) -> DaemonConfig:
    """The `[daemon]` section, with the environment's directory overrides applied."""
    state_dir = _env_dir(env, STATE_DIR_ENV) or table.get("state_dir", default_state_dir(env), path)
    runtime_dir = _env_dir(env, RUNTIME_DIR_ENV) or table.get(
        "runtime_dir", default_runtime_dir(env), path
    )
    d = DaemonConfig(state_dir, runtime_dir, table.get("log_dir", state_dir / "logs", path))
    return DaemonConfig(
        state_dir=d.state_dir,
        runtime_dir=d.runtime_dir,
        log_dir=d.log_dir,
        socket_mode=table.get("socket_mode", d.socket_mode, _socket_mode),
        node_name=table.get("node_name", d.node_name, _instance(str, _NODE_NAME_RE.fullmatch))
        or _short_hostname(),
        kill_grace=table.get("kill_grace", d.kill_grace, _duration),
        allow_network_fs=table.get("allow_network_fs", d.allow_network_fs, _instance(bool)),
        labels=table.get("labels", d.labels, _labels),
    )


def _gpus(data: object, source: Path | None, path: Converter[Path], node: str) -> GpuConfig:
    """The `[gpus]` section with its `[[gpus.fake]]` tables."""
    gpus = _Table(data, "gpus", source)
    fake_tables: list[object] = gpus.get("fake", [], _instance(list))
    fake_state_file = gpus.get("fake_state_file", None, path)
    return GpuConfig(
        backend=gpus.get("backend", "auto", _instance(str, BACKEND_KINDS.__contains__)),
        fake=tuple(
            _fake_decl(item, f"gpus.fake[{i}]", source) for i, item in enumerate(fake_tables)
        ),
        fake_state_file=None if fake_state_file is None else str(fake_state_file),
        include=gpus.get("include", (), _device_list),
        exclude=gpus.get("exclude", (), _device_list),
        node=node,
    )


def _fake_decl(data: object, name: str, source: Path | None) -> FakeGpuDecl:
    """One `[[gpus.fake]]` table."""
    table = _Table(data, name, source)
    d = FakeGpuDecl()
    memory = table.get("memory", d.memory, _size)
    if memory == 0:
        raise table.error("memory", table.data["memory"], "more than 0 bytes")
    foreign_memory = table.get("foreign_memory", d.foreign_memory, _size)
    if foreign_memory > memory:
        raise table.error("foreign_memory", table.data["foreign_memory"], "at most `memory`")
    job_memory = table.get("job_memory", d.job_memory, _size)
    if job_memory > memory:
        raise table.error("job_memory", table.data["job_memory"], "at most `memory`")
    return FakeGpuDecl(
        name=table.get("name", d.name, _instance(str, str.strip)),
        memory=memory,
        count=table.get("count", d.count, _integer(1, 1024)),
        foreign_memory=foreign_memory,
        foreign_pid=table.get("foreign_pid", d.foreign_pid, _integer(1)),
        utilization=table.get("utilization", d.utilization, _number(0.0, 100.0)),
        share_slowdown=table.get("share_slowdown", d.share_slowdown, _number(1.0)),
        link_group=table.get("link_group", d.link_group, _instance(str)),
        job_memory=job_memory,
    )
