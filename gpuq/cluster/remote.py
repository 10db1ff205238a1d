"""A client of another server's daemon: `gpuq.client.Client` over `ssh HOST gpuq bridge`.

`SshClient.connect` starts ssh (`gpuq.cluster.ssh.bridge_argv`) with one end
of a socket pair as its stdin and stdout and hands the other end to the
ordinary `Client`, so requests, streams, heartbeats and timeouts work as they
do on the local socket. What can only go wrong over ssh is told apart when
the handshake fails: ssh's own failure (its exit status and stderr, through
`gpuq.cluster.ssh.explain`), a daemon of another protocol, or no answer
within the connect timeout plus the client timeout. Closing the client ends
the ssh process (and only it: a shared ControlMaster connection stays up for
the next session). `resolve_address` says which address ssh reaches a
server at (for a multi-node job's rendezvous).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
from typing import IO, Any

from gpuq import __version__
from gpuq.client import Client
from gpuq.cluster.ssh import bridge_argv, explain, prepare_ssh_dir
from gpuq.config import ClusterConfig, Config, ServerDecl
from gpuq.errors import DaemonUnavailable, GpuqError, ProtocolError
from gpuq.wire import PROTOCOL_VERSION

EXIT_WAIT = 2.0
"""Seconds to wait for ssh to exit once the connection closed, to read why it failed."""


class SshClient(Client):
    """A `Client` whose connection is an ssh session to `gpuq bridge` on `server`."""

    server: ServerDecl
    _process: subprocess.Popen[bytes]
    _stderr: IO[bytes]

    @classmethod
    def connect_to(
        cls, server: ServerDecl, config: Config, *, timeout: float | None = None
    ) -> SshClient:
        """Open the session and complete the handshake; a GpuqError says why it could not."""
        prepare_ssh_dir(config.daemon.runtime_dir)  # the shared connection's socket goes there
        seconds = config.client.timeout if timeout is None else timeout
        ours, theirs = socket.socketpair()
        stderr = tempfile.TemporaryFile()  # not a pipe: a shared connection may outlive ssh
        try:
            process = subprocess.Popen(  # noqa: S603 - argv from bridge_argv
                bridge_argv(server, config.cluster, config.daemon.runtime_dir),
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=stderr,
                start_new_session=True,
            )
        except FileNotFoundError:
            ours.close()
            stderr.close()
            raise DaemonUnavailable(
                "ssh is not installed here", "install the OpenSSH client (Debian: openssh-client)"
            ) from None
        finally:
            theirs.close()
        first_answer = config.cluster.connect_timeout + seconds
        ours.settimeout(first_answer)
        client = cls(ours, None, first_answer, None)
        client.server, client._process, client._stderr = server, process, stderr
        try:
            client._send(0, "hello", {"version": PROTOCOL_VERSION})
            _ = client.hello
        except GpuqError as exc:
            failure = client._why(exc, first_answer)
            client.close()
            raise failure from None
        ours.settimeout(seconds)
        client._timeout = seconds
        return client

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The ssh process carrying the session."""
        return self._process

    def _why(self, exc: GpuqError, waited: float) -> GpuqError:
        """The error to show for a handshake that failed with `exc`."""
        host, command = self.server.host, self.server.command
        if isinstance(exc, ProtocolError) and exc.code == "protocol" and "version" in exc.message:
            return ProtocolError(
                f"{host} cannot talk with this gpuq ({__version__}, protocol "
                f"{PROTOCOL_VERSION}): {exc.message}",
                "run the same gpuq release on every server (upgrade the older one)",
            )
        try:
            status = self._process.wait(EXIT_WAIT)
        except subprocess.TimeoutExpired:
            if "did not answer" in exc.message:
                return DaemonUnavailable(
                    f"{host} did not answer within {waited:g}s",
                    f"is it overloaded, or its daemon stopped? check by hand: "
                    f"ssh {host} {command} daemon status",
                )
            return exc
        self._stderr.seek(0)
        return explain(host, command, status, self._stderr.read().decode(errors="replace"))

    def close(self) -> None:
        """Close the connection and end the ssh process, even while another thread reads it."""
        self.interrupt()  # a read blocked in another thread (a heartbeat) returns at once
        if self._process.poll() is None:
            _signal(self._process, signal.SIGTERM)
            try:
                self._process.wait(EXIT_WAIT)
            except subprocess.TimeoutExpired:
                _signal(self._process, signal.SIGKILL)
                self._process.wait()
        super().close()
        self._stderr.close()

    def __enter__(self) -> SshClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass


def resolve_address(host: str, cluster: ClusterConfig, timeout: float = 10.0) -> str:
    """The IP address ssh connects to for `host` (its HostName after the ssh config), resolved.

    Raises OSError if ssh cannot say or the name does not resolve: what a
    multi-node job's other servers use to reach a part there.
    """
    argv = ["ssh"]
    if cluster.ssh_config is not None:
        argv += ["-F", str(cluster.ssh_config)]
    done = subprocess.run(
        [*argv, "-G", "--", host], capture_output=True, text=True, timeout=timeout, check=False
    )
    name = next(
        (
            line.split(None, 1)[1]
            for line in done.stdout.splitlines()
            if line.startswith("hostname ")
        ),
        None,
    )
    if done.returncode != 0 or not name:
        raise OSError(f"ssh -G {host} gave no host name: {done.stderr.strip() or done.returncode}")
    infos = socket.getaddrinfo(name.strip(), None, type=socket.SOCK_STREAM)
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first
    return str(infos[0][4][0])
