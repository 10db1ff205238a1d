"""The ssh command line to another server's `gpuq bridge`, and what its failures mean.

Pure functions: `bridge_argv` builds the argv, `explain` turns a failed
session (ssh's exit status and stderr) into a `GpuqError` with a hint.

Every connection runs in BatchMode (a daemon can never answer a password or
passphrase prompt, and a new or changed host key fails instead of asking),
and shares one ssh connection per server through ControlMaster, its socket
in a private directory of the runtime directory's (`SSH_DIR`), kept `CONTROL_PERSIST`
seconds after the last session: a call then costs a round trip, not a
handshake. Keep-alives end a session whose server went silent
(`ALIVE_INTERVAL` x `ALIVE_COUNT` seconds). The destination comes after
``--`` and was checked not to start with '-' (`gpuq.config`), so a host
name can never be read as an ssh option.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from gpuq.config import ClusterConfig, ServerDecl
from gpuq.errors import DaemonUnavailable, GpuqError, ProtocolError
from gpuq.paths import ensure_private_dir

CONTROL_PERSIST = 60
"""Seconds an idle shared connection stays open."""
ALIVE_INTERVAL = 5
ALIVE_COUNT = 3
SSH_FAILED = 255
"""ssh's own exit status when the connection itself failed."""
COMMAND_NOT_FOUND = 127
SSH_DIR = "ssh"
"""The runtime directory's subdirectory for the shared connections' sockets (0700).

Its own, so that the runtime directory may be opened for a lab's users
(0711, their control sockets) while these stay private.
"""


def prepare_ssh_dir(runtime_dir: Path) -> None:
    """Make the shared connections' directory, private (0700); StateError if it cannot be."""
    runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ensure_private_dir(runtime_dir / SSH_DIR)


def ssh_argv(cluster: ClusterConfig, runtime_dir: Path) -> list[str]:
    """Ssh and its options, the destination left to add: every connection gpuq makes."""
    argv = ["ssh"]
    if cluster.ssh_config is not None:
        argv += ["-F", str(cluster.ssh_config)]
    argv += [
        "-T",
        "-o", "BatchMode=yes",
        "-o", f"ConnectTimeout={max(1, round(cluster.connect_timeout))}",
        "-o", f"ServerAliveInterval={ALIVE_INTERVAL}",
        "-o", f"ServerAliveCountMax={ALIVE_COUNT}",
        "-o", "ControlMaster=auto",
        "-o", f"ControlPath={runtime_dir / SSH_DIR / 'ssh-%C'}",
        "-o", f"ControlPersist={CONTROL_PERSIST}",
    ]  # fmt: skip
    return argv


def bridge_argv(server: ServerDecl, cluster: ClusterConfig, runtime_dir: Path) -> list[str]:
    """The argv that opens `gpuq bridge` on `server`."""
    return [*ssh_argv(cluster, runtime_dir), "--", server.host, server.command, "bridge"]


def rsync_argv(
    source: str, target: str, cluster: ClusterConfig, runtime_dir: Path, one_file: bool = False
) -> list[str]:
    """Rsync of directory `source` into `target` over gpuq's shared ssh connection.

    Either side may be ``HOST:PATH``. Paths go to the far side unexpanded
    (``--protect-args``); the copy keeps times and modes, and whole files
    (checkpoints change whole: the delta algorithm would only cost time).
    With `one_file`, `source` is a file, copied into directory `target`.
    """
    if one_file:
        return [*_RSYNC_OPTIONS, "--rsh", shlex.join(ssh_argv(cluster, runtime_dir))] + [
            "--",
            source,
            target.rstrip("/") + "/",
        ]
    return [
        "rsync",
        "--recursive",
        "--times",
        "--perms",
        "--whole-file",
        "--delete",
        "--protect-args",
        "--rsh",
        shlex.join(ssh_argv(cluster, runtime_dir)),
        "--",
        source.rstrip("/") + "/",
        target.rstrip("/") + "/",
    ]


_RSYNC_OPTIONS = ("rsync", "--times", "--perms", "--whole-file", "--protect-args")


_SSH_CAUSES: tuple[tuple[str, str, str], ...] = (
    (
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        "{host}'s host key has changed since it was last seen",
        "if the server was reinstalled, remove its old key (ssh-keygen -R {host}) "
        "and check the new one; otherwise someone may be intercepting the connection",
    ),
    (
        "Host key verification failed",
        "{host}'s host key is not known, and gpuq never accepts one unseen",
        "connect once by hand to check and accept it: ssh {host} true",
    ),
    (
        "Could not resolve hostname",
        "unknown host {host}",
        "check the name, or add a Host entry for it to your ssh config",
    ),
    (
        "Permission denied",
        "ssh refused gpuq's login on {host} (no key it accepts; gpuq never asks for a password)",
        "set up key login (ssh-copy-id {host}) with a key ssh-agent holds or without "
        "a passphrase, then check with: ssh -o BatchMode=yes {host} true",
    ),
    (
        "Connection refused",
        "{host} refuses ssh connections",
        "is sshd running there, on the port your ssh config names?",
    ),
    (
        "timed out",
        "{host} did not answer in time",
        "is it up and reachable from here? ssh {host} true",
    ),
    (
        "No route to host",
        "no route to {host}",
        "is it up and on this network? ssh {host} true",
    ),
)


def explain(host: str, command: str, status: int, stderr: str) -> GpuqError:
    """The error of a bridge session to `host` that ended with `status` before answering."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else f"exit status {status}"
    if status == SSH_FAILED:
        for needle, message, hint in _SSH_CAUSES:
            if needle.lower() in text.lower():
                return DaemonUnavailable(message.format(host=host), hint.format(host=host))
        return DaemonUnavailable(
            f"cannot reach {host} over ssh: {last}", f"check it by hand: ssh {host} true"
        )
    if status == COMMAND_NOT_FOUND or "command not found" in text or "No such file" in text:
        return DaemonUnavailable(
            f"{host} has no gpuq to run ({command!r}: {last})",
            'install gpuq there, or set command = "/path/to/gpuq" in its [[cluster.servers]] table',
        )
    if "no such command" in text.lower():  # typer's own words, or gpuq's rendering of them
        return ProtocolError(
            f"the gpuq on {host} is too old to have `gpuq bridge`",
            f"upgrade gpuq on {host} to this version",
        )
    return DaemonUnavailable(
        f"gpuq bridge on {host} failed: {last}", f"see: ssh {host} {command} doctor"
    )
