"""`gpuq doctor`: check the set-up and say how to fix what is wrong.

Each check returns ok, warn or fail with a message and, when not ok, a hint.
Checks never change anything.
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuq import statelock
from gpuq.config import Config, load_config
from gpuq.errors import GpuqError
from gpuq.textsafe import visible


@dataclass(frozen=True, slots=True)
class Check:
    """The result of one check."""

    name: str
    status: str  # "ok" | "warn" | "fail"
    message: str
    hint: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON encoding for `gpuq doctor --json`."""
        return {
            "name": self.name,
            "status": self.status,
            "message": self.message,
            "hint": self.hint,
        }


def check_state_dir(config: Config) -> Check:
    """The state directory exists or can be made, is private, and is local."""
    from gpuq.paths import filesystem_type, is_network_filesystem

    path = config.daemon.state_dir
    probe = path if path.exists() else next((p for p in path.parents if p.exists()), path)
    fstype = filesystem_type(probe) or "unknown"
    if is_network_filesystem(fstype) and not config.daemon.allow_network_fs:
        return Check(
            "state directory",
            "fail",
            f"{path} is on {fstype}, a network filesystem (SQLite WAL is unsafe there)",
            "set [daemon] state_dir to a local disk, e.g. /var/tmp/gpuq-$USER",
        )
    if not os.access(probe, os.W_OK):
        return Check(
            "state directory", "fail", f"{probe} is not writable", "choose another state_dir"
        )
    if path.exists() and path.stat().st_mode & 0o077:
        return Check(
            "state directory", "warn", f"{path} is readable by others", f"chmod 700 {path}"
        )
    return Check("state directory", "ok", f"{path} ({fstype})")


def check_socket(config: Config) -> Check:
    """Check whether a daemon answers, its socket is stale, or none is there yet."""
    from gpuq.client import OTHER_CONFIG_HINT, Client, choose_daemon

    choice = choose_daemon(config)
    path = choice.path
    try:
        with Client.connect(config, autostart=False) as client:
            pid = client.hello.get("pid")
            warnings = client.call("status").get("warnings") or []
            elsewhere = client.other_config(config)
    except GpuqError as exc:
        if path.exists():
            return Check(
                "daemon",
                "warn",
                f"stale socket {path}: {exc.message}",
                "gpuq daemon start replaces it",
            )
        if choice.lab:
            return Check("daemon", "fail", exc.message, exc.hint or "")
        cfg = config.daemon
        if (held := statelock.holder(cfg.state_dir)) is not None:  # elsewhere, or its socket gone
            other = statelock.in_use(cfg.state_dir, cfg.runtime_dir, held)
            return Check("daemon", "fail", other.message, other.hint or "")
        return Check("daemon", "ok", "not running; the first gpuq command starts it")
    except OSError as exc:
        return Check(
            "daemon",
            "warn",
            f"stale socket {path} ({exc.strerror})",
            "gpuq daemon start replaces it",
        )
    if warnings:
        return Check(
            "daemon",
            "fail",
            f"running (pid {pid}), but: " + "; ".join(warnings),
            "gpuq daemon status shows the daemon's state",
        )
    if choice.lab:
        return Check("daemon", "ok", f"the lab daemon (pid {pid}) on {path}")
    if elsewhere is not None:
        return Check("daemon", "warn", f"running (pid {pid}), but {elsewhere}", OTHER_CONFIG_HINT)
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        return Check(
            "daemon",
            "warn",
            f"socket {path} has mode {mode:o}",
            "others may connect; check socket_mode",
        )
    return Check("daemon", "ok", f"running (pid {pid}) on {path}")


def check_nvml(config: Config) -> Check:
    """Can NVML see GPUs? Not needed where fake GPUs are declared or chosen."""
    from gpuq.gpus import GpuConfig, make_backend

    fake = sum(decl.count for decl in config.gpus.fake)
    if config.gpus.backend == "fake" or (config.gpus.backend == "auto" and fake):
        if fake:
            return Check("GPUs", "ok", f"{fake} fake GPU(s) declared; NVML is not used")
        return Check(
            "GPUs",
            "warn",
            'backend = "fake" with no fake GPUs declared: only CPU jobs (--gpus 0) can run',
            'declare some: [[gpus.fake]] with name = "Fake", memory = "24G", count = 2 '
            "(docs/configuration.md)",
        )
    try:
        backend = make_backend(GpuConfig(backend="nvml"))
    except GpuqError as exc:
        if config.gpus.backend == "nvml":
            return Check("NVML", "fail", exc.message, exc.hint or "")
        return Check(
            "NVML",
            "warn",
            f"{exc.message}; gpuq runs CPU-only jobs (--gpus 0)",
            "on a machine with NVIDIA GPUs, install the driver; on one without, declare fake "
            "GPUs to try gpuq ([[gpus.fake]] in the config, docs/configuration.md)",
        )
    try:
        devices = backend.devices()
        return Check(
            "NVML",
            "ok",
            f"driver {backend.driver_version()}, {len(devices)} GPU(s): "
            + ", ".join(sorted({d.name for d in devices})),
        )
    finally:
        backend.close()


def check_linger() -> Check:
    """Systemd linger keeps a user daemon alive after logout."""
    if shutil.which("loginctl") is None:
        return Check(
            "systemd linger",
            "warn",
            "loginctl not found (no systemd?)",
            "run the daemon under your init system, or keep a session open",
        )
    try:
        out = subprocess.run(
            ["loginctl", "show-user", getpass.getuser(), "--property=Linger"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("systemd linger", "warn", f"loginctl failed: {exc}")
    if out.stdout.strip() == "Linger=yes":
        return Check("systemd linger", "ok", "enabled: the daemon survives logout")
    return Check(
        "systemd linger",
        "warn",
        "not enabled: jobs' daemon stops when you log out",
        "loginctl enable-linger $USER, then see contrib/systemd/README.md",
    )


def check_ssh() -> Check:
    """An OpenSSH client is needed to reach other servers."""
    path = shutil.which("ssh")
    if path is None:
        return Check(
            "ssh", "warn", "no ssh client found", "install openssh-client for multi-server use"
        )
    return Check("ssh", "ok", path)


def check_servers(config: Config) -> list[Check]:
    """Each server of `[[cluster.servers]]`, reached through `ssh HOST gpuq bridge` now."""
    from gpuq.cluster.probe import check

    checks = []
    for server in config.cluster.servers:
        name = f"server {server.host}"
        try:
            result = check(server, config)
        except GpuqError as exc:
            checks.append(Check(name, "fail", exc.message, exc.hint or ""))
            continue
        detail = f"node {result.node}, gpuq {result.daemon_version}, {len(result.gpus)} GPUs"
        if result.version_note:
            checks.append(
                Check(
                    name,
                    "warn",
                    f"{detail}: {result.version_note}",
                    "run the same gpuq release on every server",
                )
            )
        else:
            checks.append(Check(name, "ok", f"{detail} ({result.seconds:.2f} s)"))
    return checks


def check_python() -> Check:
    """The interpreter and whether the runner's PyTorch is there."""
    import importlib.util

    version = ".".join(map(str, sys.version_info[:3]))
    if importlib.util.find_spec("torch") is None:
        return Check(
            "python",
            "warn",
            f"Python {version}; PyTorch not installed",
            "pip install 'gpuq-lab[runner]' for gpuq.runner",
        )
    return Check("python", "ok", f"Python {version} with PyTorch")


def check_policy(config: Config) -> Check:
    """The scheduling policy the daemon will run (the config has already refused others)."""
    from gpuq.config import SchedulerConfig
    from gpuq.policies.registry import LIVE_POLICY_NAMES, POLICY_NAMES

    sim_only = [name for name in POLICY_NAMES if name not in LIVE_POLICY_NAMES]
    policy = config.scheduler.policy
    default = " (the default)" if policy == SchedulerConfig().policy else ""
    return Check(
        "policy",
        "ok",
        f"{policy}{default} (the daemon runs: {', '.join(LIVE_POLICY_NAMES)}; "
        f"gpuq sim also: {', '.join(sim_only)})",
    )


def check_lab(config: Config) -> Check:
    """Lab mode: the daemon's user, and the admins it names (a missing group is a typo)."""
    import grp
    import pwd

    from gpuq.client import choose_daemon

    if not config.lab.enabled:
        choice = choose_daemon(config)
        where = f"the lab daemon at {choice.path}" if choice.lab else "your own daemon"
        return Check("lab", "ok", f"commands use {where}")
    missing = []
    for admin in config.lab.admins:
        try:
            grp.getgrnam(admin[1:]) if admin.startswith("@") else pwd.getpwnam(admin)
        except KeyError:
            missing.append(admin)
    if missing:
        return Check(
            "lab",
            "warn",
            f"[lab] admins names {', '.join(missing)}, unknown on this server",
            "create the group or user, or fix the name in [lab] admins",
        )
    if os.geteuid() != 0:
        return Check(
            "lab",
            "warn",
            f"a lab daemon runs jobs as their owners: it needs root (this is uid {os.geteuid()})",
            "run it as root: gpuq lab install writes a systemd unit",
        )
    admins = ", ".join(config.lab.admins) or "root only"
    return Check("lab", "ok", f"lab daemon on {config.lab.socket}; admins: {admins}")


def run_checks(config_path: str | None) -> list[Check]:
    """Run every check; a broken config stops the ones that need it."""
    try:
        config = load_config(config_path)
    except GpuqError as exc:
        return [Check("config", "fail", exc.message, exc.hint or "")]
    source = str(config.source) if config.source else "built-in defaults"
    checks = [Check("config", "ok", source)]
    steps: list[Callable[[], Check]] = [
        lambda: check_state_dir(config),
        lambda: check_policy(config),
        lambda: check_socket(config),
        lambda: check_lab(config),
        lambda: check_nvml(config),
        check_linger,
        check_ssh,
        check_python,
    ]
    checks.extend(step() for step in steps)
    checks.extend(check_servers(config))
    checks.extend(check_lab_servers(config))
    return checks


def check_lab_servers(config: Config) -> list[Check]:
    """A lab of several servers: the service account exists, and a member reaches its head."""
    import pwd

    from gpuq.cluster.probe import check
    from gpuq.config import ServerDecl

    lab = config.lab
    if not lab.enabled or not (lab.head or config.cluster.servers):
        return []
    if not lab.service_account:
        return [
            Check(
                "lab servers",
                "warn",
                "[lab] service_account is not set: other servers' lab daemons are refused here",
                "name the account the lab's servers log in to each other as, on every server",
            )
        ]
    try:
        pwd.getpwnam(lab.service_account)
    except KeyError:
        return [
            Check(
                "lab servers",
                "warn",
                f"[lab] service_account {lab.service_account} has no account on this server",
                "create it, with the same name on every server of the lab",
            )
        ]
    if not lab.head:
        return [
            Check(
                "lab servers",
                "ok",
                f"this server keeps the lab's queue; service account {lab.service_account}",
            )
        ]
    try:
        result = check(ServerDecl(host=lab.head, command=lab.head_command), config)
    except GpuqError as exc:
        return [Check("lab head", "fail", f"{lab.head}: {exc.message}", exc.hint or "")]
    return [
        Check(
            "lab head",
            "ok",
            f"the lab's queue is on {lab.head} (node {result.node}, gpuq {result.daemon_version})",
        )
    ]


def print_checks(checks: list[Check]) -> None:
    """Human output: one line per check, hints indented below (paths shown with `visible`)."""
    marks = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}
    for check in checks:
        print(visible(f"[{marks[check.status]}] {check.name}: {check.message}"))
        if check.hint and check.status != "ok":
            print(f"       hint: {visible(check.hint)}")
