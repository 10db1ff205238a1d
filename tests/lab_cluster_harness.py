"""Lab mode across servers: a head's lab daemon and a member's (gpu2), over ssh as gpuq-svc.

Two lab daemons (root, `[lab] enabled`, each on its own private socket)
run on two servers simulated by network namespaces with real sshd
(tests/netns_harness.py). They reach each other as the lab's service
account gpuq-svc, never as root: the client's ssh config logs in as
gpuq-svc, and each server's sshd hands the session that server's
GPUQ_CONFIG, whose `[lab] socket` is where `gpuq bridge` (running as
gpuq-svc there) connects.

- The head (two fake GPUs) keeps the lab's one queue; gpu2 is one of its
  `[[cluster.servers]]`, reached as ``ssh gpu2 GPUQ bridge``.
- gpu2 (three fake GPUs, so a 3-GPU job runs only there) is a member:
  `[lab] head = "head"`, so users' requests on its socket go to the head
  (``ssh head GPUQ bridge``, as gpuq-svc, with the user's identity).

gpuq-svc, the test users and the bridges must read each daemon's config and
enter the directories of the lab sockets, so everything lives below a fresh
shared directory (sticky, 1777, like /tmp) in directories of 0755, removed
afterwards; the daemons' and sshds' logs are copied to `root` first, where
pytest keeps them. Root only: `lab_head_and_gpu2` skips elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.daemon_harness import FAKE_TWO_GPUS, DaemonHarness, wait_for
from tests.lab_users import (
    ADMIN,
    LabUser,
    as_user,
    lab_users,
    require_root,
    service_account,
    shared_dir,
    user_dir,
)
from tests.netns_harness import GPUQ, THREE_GPUS, Lab, servers, skip_unless_possible

NAMES = ("head", "gpu2")
"""The two servers; the first keeps the lab's queue."""
MEMBER = "gpu2"
HEAD = "head"


@dataclass
class LabCluster:
    """The two servers' lab daemons, their users and the namespaces they talk across."""

    net: Lab
    head: DaemonHarness
    gpu2: DaemonHarness
    users: dict[str, LabUser]
    svc: LabUser
    base: Path
    """The shared directory everything lives below."""
    _work: dict[str, Path] = field(default_factory=dict)

    @property
    def alice(self) -> LabUser:
        return self.users["gpuq-alice"]

    @property
    def bob(self) -> LabUser:
        return self.users["gpuq-bob"]

    @property
    def carol(self) -> LabUser:
        """The admin (through the gpuq-admins group)."""
        return self.users[ADMIN]

    def daemon(self, name: str) -> DaemonHarness:
        """Server `name`'s lab daemon."""
        return {HEAD: self.head, MEMBER: self.gpu2}[name]

    def socket(self, name: str) -> Path:
        """Server `name`'s lab socket (its `[lab] socket`)."""
        return lab_socket(self.daemon(name).root)

    def start(self, name: str) -> None:
        """Start server `name`'s daemon inside its namespace (its ssh sessions run there)."""
        with self.net.inside(name):
            self.daemon(name).start()

    def work_dir(self, user: LabUser) -> Path:
        """A directory of `user`'s own (0700), the same on both servers: a job's cwd."""
        if user.name not in self._work:
            self._work[user.name] = user_dir(self.base, user)
        return self._work[user.name]

    def gpuq(
        self,
        name: str,
        user: LabUser,
        *args: str,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        """The real `gpuq ARGS`, run as `user` on server `name` against its lab daemon.

        The command runs inside that server's namespace; its working
        directory is `cwd`, or the user's `work_dir`.
        """
        environ = {"GPUQ_LAB_SOCKET": str(self.socket(name)), **(env or {})}
        with self.net.inside(name):
            return as_user(
                user,
                [sys.executable, "-m", "gpuq.cli.entry", *args],
                env=environ,
                cwd=cwd or self.work_dir(user),
                timeout=timeout,
            )

    def gpuq_json(self, name: str, user: LabUser, *args: str) -> dict[str, Any]:
        """`gpuq ARGS --json` as `user` on server `name`; fails the test unless it succeeds."""
        result = self.gpuq(name, user, *args, "--json")
        assert result.returncode == 0, f"gpuq {' '.join(args)} on {name}: {result.stderr}"
        value: dict[str, Any] = json.loads(result.stdout)
        return value

    def audit(self, **match: Any) -> list[dict[str, Any]]:
        """The head's audit entries (read by the admin) whose fields equal `match`."""
        entries: list[dict[str, Any]] = self.gpuq_json(
            HEAD, self.carol, "audit", "--limit", "1000"
        )["entries"]
        return [e for e in entries if all(e.get(k) == v for k, v in match.items())]

    def remote_gpus(self) -> list[dict[str, Any]]:
        """gpu2's GPUs as the head's daemon shows them (asked as root, on the head)."""
        gpus: list[dict[str, Any]] = self.head.call("gpus")["gpus"]
        return [gpu for gpu in gpus if gpu["node"] == MEMBER]

    def wait_for_member(self, timeout: float = 60.0) -> None:
        """Wait until the head sees gpu2's three GPUs."""
        wait_for(
            lambda: len(self.remote_gpus()) == 3,
            timeout=timeout,
            interval=0.2,
            what="gpu2's GPUs at the head",
        )


def lab_socket(daemon_root: Path) -> Path:
    """Where the lab daemon whose directory is `daemon_root` listens (its own, root's)."""
    return daemon_root / "run" / "gpuq.sock"


def _lab_toml(name: str, daemon_root: Path, svc: LabUser) -> str:
    """`node_name` and the `[lab]` section of server `name`'s config."""
    toml = (
        f'node_name = "{name}"\n'
        f'[lab]\nenabled = true\nsocket = "{lab_socket(daemon_root)}"\n'
        f'admins = ["@gpuq-admins"]\nservice_account = "{svc.name}"\n'
    )
    if name == MEMBER:
        toml += f'head = "{HEAD}"\nhead_command = "{GPUQ}"\n'
    return toml


def _cluster_toml(name: str, net: Lab) -> str:
    """Server `name`'s `[cluster]` section: how ssh reaches the other one."""
    toml = f'\n[cluster]\nssh_config = "{net.ssh_config}"\nconnect_timeout = "2s"\n'
    if name == HEAD:
        # A sync answers within its 1 s poll plus 2 s (the heartbeat) even on a loaded
        # machine; a server silent 5 s is down.
        toml += (
            'heartbeat = "2s"\ndown_after = "5s"\n'
            f'[[cluster.servers]]\nhost = "{MEMBER}"\ncommand = "{GPUQ}"\n'
        )
    return toml


@contextlib.contextmanager
def lab_head_and_gpu2(root: Path) -> Iterator[LabCluster]:
    """Both lab daemons up, the head seeing gpu2's GPUs; everything removed afterwards.

    gpu2's daemon starts first (the member answers its own handshake), then
    the head's, each inside its server's namespace. Afterwards, whatever
    happened: both daemons stopped and every job of theirs killed, the
    daemons' and sshds' logs copied to `root`, the shared directory removed.
    """
    require_root()
    skip_unless_possible()
    users = lab_users()
    svc = service_account()
    root.mkdir(parents=True, exist_ok=True)
    base = shared_dir("gpuq-labnet-")
    daemons: dict[str, DaemonHarness] = {}
    try:
        for name, gpus in ((HEAD, FAKE_TWO_GPUS), (MEMBER, THREE_GPUS)):
            directory = base / name
            directory.mkdir(mode=0o755)
            daemons[name] = DaemonHarness(
                directory, gpus_toml=gpus, extra_toml=_lab_toml(name, directory, svc)
            )
            daemons[name].config_path.chmod(0o644)  # gpuq-svc's bridge reads it
        configs = {name: daemon.config_path for name, daemon in daemons.items()}
        net_root = base / "net"  # sshd reads authorized_keys there as gpuq-svc
        net_root.mkdir(mode=0o755)
        with servers(net_root, NAMES, configs, user=svc.name) as net:
            for name, daemon in daemons.items():
                with daemon.config_path.open("a") as config:
                    config.write(_cluster_toml(name, net))
            cluster = LabCluster(net, daemons[HEAD], daemons[MEMBER], users, svc, base)
            try:
                cluster.start(MEMBER)
                cluster.start(HEAD)
                cluster.wait_for_member()
                yield cluster
            finally:
                for name in NAMES:
                    daemons[name].close()
                _keep_logs(base, root)
    finally:
        for daemon in daemons.values():
            daemon.close()  # again: idempotent, and covers a failure before `servers` yielded
        shutil.rmtree(base, ignore_errors=True)


def _keep_logs(base: Path, root: Path) -> None:
    """Copy the daemons' and sshds' logs from the shared directory to `root`."""
    logs = {f"daemon_{name}.log": base / name / "state" / "daemon-test.log" for name in NAMES}
    logs |= {log.name: log for log in (base / "net").glob("sshd_*.log")}
    for target, log in logs.items():
        with contextlib.suppress(OSError):
            shutil.copyfile(log, root / target)
