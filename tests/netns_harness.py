"""Real servers for multi-server tests: Linux network namespaces, each with its own sshd.

`servers(root, names)` makes one namespace per server and a switch namespace
holding a Linux bridge, joins each server to it by a veth pair (10.77.0.1,
10.77.0.2, ...), and starts an OpenSSH server in each with a host key made
here. A user key made here is the only way in (root's, or that of the
account `servers(user=...)` names; BatchMode: never a password prompt), and
the client side is an ssh config file naming each server by its name, with
its host key already known, so a test runs
``ssh -F CONFIG NAME COMMAND`` from inside any server's namespace as a
head daemon would run ``ssh HOST gpuq bridge``. Each server's sshd accepts
``GPUQ_CONFIG`` from the client (``SetEnv`` per host), so servers that share
this machine's file system still run daemons of their own.

`Lab.cut(name)` takes a server's link down (a lost server) and `Lab.mend`
brings it back. Skips cleanly unless root, ``ip`` and ``sshd`` are there and
a namespace can be made (the CI installs openssh-server).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GPUQ = str(Path(sys.executable).parent / "gpuq")
"""This environment's gpuq command, which ssh sessions on the servers run (`command = ...`)."""
THREE_GPUS = '[[gpus.fake]]\nname = "Fake L4"\nmemory = "24G"\ncount = 3\n'
"""The fake GPUs of a server under test, told apart from the harness's default two."""
SSHD = "/usr/sbin/sshd"
SUBNET = "10.77.0"
START_TIMEOUT = 20.0


def skip_unless_possible() -> None:
    """Skip the calling test unless network namespaces with sshd can be made here."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (Debian: iproute2, openssh-client)")
    if not os.access(SSHD, os.X_OK):
        pytest.skip(f"{SSHD} is not installed (Debian: openssh-server)")
    probe = f"gqprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace: {made.stderr.decode().strip()}")
    entered = subprocess.run(
        ["ip", "netns", "exec", probe, "ip", "link", "set", "lo", "up"],
        capture_output=True,
        check=False,
    )
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    if entered.returncode != 0:
        pytest.skip(f"cannot enter a network namespace: {entered.stderr.decode().strip()}")


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    subprocess.run(command, check=True, capture_output=True)


@dataclass
class Server:
    """One server: its namespace, address, sshd and the GPUQ_CONFIG its sessions get."""

    name: str
    netns: str
    address: str
    veth: str
    gpuq_config: Path
    sshd: subprocess.Popen[bytes] | None = None


@dataclass
class Lab:
    """The servers of one test, reachable over real ssh (module docstring)."""

    root: Path
    switch: str
    servers: dict[str, Server] = field(default_factory=dict)

    @property
    def ssh_config(self) -> Path:
        """The client's ssh config: one Host entry per server."""
        return self.root / "ssh_config"

    def ssh_command(self, name: str, *command: str) -> list[str]:
        """The argv that runs `command` on server `name` over ssh (from any namespace)."""
        return ["ssh", "-F", str(self.ssh_config), name, *command]

    def run_in(
        self,
        name: str,
        argv: Sequence[str],
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run `argv` inside server `name`'s namespace (a process on that server)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.servers[name].netns, *argv],
            capture_output=True,
            timeout=timeout,
            check=False,
            env=env,
        )

    def popen_in(self, name: str, argv: Sequence[str], **kwargs: object) -> subprocess.Popen[bytes]:
        """Start `argv` inside server `name`'s namespace."""
        netns = self.servers[name].netns
        return subprocess.Popen(["ip", "netns", "exec", netns, *argv], **kwargs)  # type: ignore[call-overload,no-any-return]

    @contextlib.contextmanager
    def inside(self, name: str) -> Iterator[None]:
        """Run this thread inside server `name`'s network namespace (its processes too)."""
        original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/var/run/netns/{self.servers[name].netns}", os.O_RDONLY)
        try:
            _setns(target)
            yield
        finally:
            _setns(original)
            os.close(target)
            os.close(original)

    def cut(self, name: str) -> None:
        """Take server `name`'s link down: packets to and from it are lost."""
        server = self.servers[name]
        _ip("link", "set", server.veth, "down", netns=server.netns)

    def mend(self, name: str) -> None:
        """Bring server `name`'s link back up."""
        server = self.servers[name]
        _ip("link", "set", server.veth, "up", netns=server.netns)


CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    """setns(2) into the network namespace `fd` (os.setns arrives with Python 3.12)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpuq-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def _sshd_config(lab: Lab, server: Server, host_key: Path) -> Path:
    path = lab.root / f"sshd_{server.name}.conf"
    path.write_text(
        f"ListenAddress {server.address}\n"
        "Port 22\n"
        f"HostKey {host_key}\n"
        f"PidFile {lab.root / f'sshd_{server.name}.pid'}\n"
        f"AuthorizedKeysFile {lab.root / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "StrictModes no\n"
        "UsePAM no\n"
        "AcceptEnv GPUQ_CONFIG\n"
        "LogLevel ERROR\n"
    )
    return path


STARTUP_FILES = (".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshenv")
"""Shell start-up files an ssh session on a test server must not run (`_without_startup_files`)."""


def _without_startup_files() -> list[str]:
    """A command prefix that hides this user's shell start-up files from sshd's sessions.

    Debian's bash reads ~/.bashrc even for `ssh HOST COMMAND`, and a
    developer's or CI machine's one may do slow work on every login (pyenv's
    rehash waits up to 60 s for a lock that a session killed by a test leaves
    behind), so a test server would answer long after its timeouts. The
    servers get what a fresh server has: `ip netns exec` gives sshd a mount
    namespace of its own (slave to this one, so the tests' own mounts still
    show), and each start-up file is covered there by /dev/null.
    """
    home = Path(pwd.getpwuid(os.geteuid()).pw_dir)
    covers = [
        f"mount --bind /dev/null {shlex.quote(str(home / name))} && "
        for name in STARTUP_FILES
        if (home / name).is_file()
    ]
    return ["sh", "-c", "".join(covers) + 'exec "$@"', "sh"]


def _listening(address: str, netns: str) -> bool:
    probe = subprocess.run(
        ["ip", "netns", "exec", netns, "ssh-keyscan", "-T", "1", address],
        capture_output=True,
        check=False,
    )
    return probe.returncode == 0 and bool(probe.stdout.strip())


@contextlib.contextmanager
def servers(
    root: Path, names: Sequence[str], gpuq_configs: dict[str, Path], user: str = "root"
) -> Iterator[Lab]:
    """Make the servers `names` (module docstring); torn down afterwards, whatever happened.

    `gpuq_configs[name]` is the GPUQ_CONFIG an ssh session on that server gets.
    `user` is the account the client logs in as (its ``User`` line), root
    by default. Another account must be able to log in with a key: not
    locked (a password field of "*", not useradd's "!", since sshd runs
    without PAM), and able to read `root`'s authorized_keys (sshd opens it
    as that user), so `root` and the directories above it must be
    searchable by it.
    """
    skip_unless_possible()
    tag = secrets.token_hex(3)
    root.mkdir(parents=True, exist_ok=True)
    lab = Lab(root, f"gqsw{tag}")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    made: list[str] = []
    try:
        _ip("netns", "add", lab.switch)
        made.append(lab.switch)
        _ip("link", "add", "br0", "type", "bridge", netns=lab.switch)
        _ip("link", "set", "br0", "up", netns=lab.switch)
        user_key = root / "id_test"
        (root / "authorized_keys").write_text(_keygen(user_key) + "\n")
        known, hosts = [], []
        for index, name in enumerate(names, start=1):
            server = Server(
                name, f"gq{tag}n{index}", f"{SUBNET}.{index}", "eth0", gpuq_configs[name]
            )
            _ip("netns", "add", server.netns)
            made.append(server.netns)
            _ip("link", "set", "lo", "up", netns=server.netns)
            outside = f"gq{tag}p{index}"
            _ip("link", "add", "eth0", "netns", server.netns, "type", "veth", "peer", outside)
            _ip("link", "set", outside, "netns", lab.switch)
            _ip("link", "set", outside, "master", "br0", netns=lab.switch)
            _ip("link", "set", outside, "up", netns=lab.switch)
            _ip("addr", "add", f"{server.address}/24", "dev", "eth0", netns=server.netns)
            _ip("link", "set", "eth0", "up", netns=server.netns)
            host_key = root / f"host_{name}"
            known.append(f"{server.address} {_keygen(host_key)}")
            hosts.append(
                f"Host {name}\n  HostName {server.address}\n  User {user}\n"
                f"  IdentityFile {user_key}\n  IdentitiesOnly yes\n"
                f"  UserKnownHostsFile {root / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
                "  BatchMode yes\n  ConnectTimeout 5\n  ServerAliveInterval 2\n"
                f"  ServerAliveCountMax 2\n  SetEnv GPUQ_CONFIG={server.gpuq_config}\n"
                "  LogLevel ERROR\n"
            )
            lab.servers[name] = server
            config = _sshd_config(lab, server, host_key)
            with open(root / f"sshd_{name}.log", "ab") as log:
                server.sshd = subprocess.Popen(
                    ["ip", "netns", "exec", server.netns, *_without_startup_files(), SSHD]
                    + ["-D", "-e", "-f", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        lab.ssh_config.write_text("\n".join(hosts))
        for server in lab.servers.values():
            deadline = time.monotonic() + START_TIMEOUT
            while not _listening(server.address, server.netns):
                assert server.sshd is not None
                if server.sshd.poll() is not None or time.monotonic() > deadline:
                    output = (root / f"sshd_{server.name}.log").read_text(errors="replace")
                    raise AssertionError(f"sshd on {server.name} did not start:\n{output}")
                time.sleep(0.05)
        yield lab
    finally:
        for server in lab.servers.values():
            if server.sshd is not None and server.sshd.poll() is None:
                server.sshd.kill()
                server.sshd.wait()
        for netns in reversed(made):
            _kill_all_in(netns)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def _kill_all_in(netns: str) -> None:
    """SIGKILL every process in `netns`: sshd's session processes outlive the listener."""
    for _ in range(50):
        listed = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, check=False)
        pids = [int(pid) for pid in listed.stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
