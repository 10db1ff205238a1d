"""A lab member's link to the lab's head: users' requests forwarded, with who sent them.

A lab keeps one queue, on its head. Every other server (a member, `[lab]
head` set) still runs a lab daemon, which runs the head's jobs there and
answers `gpuq daemon status`, reload and shutdown itself; every other
request of a user on its socket goes to the head. The member opens
``ssh HEAD gpuq bridge`` as the lab's service account (the ssh config says
which key and user) for each client connection, sends the request
unchanged but for an `as` field naming the caller the kernel gave it
(SO_PEERCRED: uid and name), and relays the head's events and reply back.
The head believes `as` only from its service account and only for an
account it has itself under the same name (`gpuq.daemon.identity`), so a
user reaches the lab's queue as themselves and as nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable
from typing import IO, Any, Final

from gpuq.cluster.ssh import bridge_argv, explain, prepare_ssh_dir
from gpuq.config import Config, ServerDecl
from gpuq.daemon.access import is_service_account
from gpuq.daemon.identity import Caller
from gpuq.errors import DaemonUnavailable, GpuqError, PermissionDenied, ProtocolError, from_wire
from gpuq.protocol import (
    HEARTBEAT_EVENT,
    MAX_REPLY_BYTES,
    NODE_REQUESTS,
    PROTOCOL_VERSION,
    Audit,
    DaemonStatus,
    Hello,
    Reload,
    Request,
    Shutdown,
    decode,
    encode,
)
from gpuq.wire import parse_reply

Emit = Callable[[dict[str, Any]], Awaitable[None]]

LOCAL: Final = (Hello, DaemonStatus, Reload, Shutdown, *NODE_REQUESTS)
"""Requests a member answers itself: about its own daemon, or the head's node requests."""
NOT_TRUSTED: Final = "only the lab's service account may act for another user"
"""How the head's refusal of a caller naming another user begins (`connection.acting_for`)."""
EXIT_WAIT: Final = 2.0
"""Seconds to wait for ssh to end once asked, to read why it failed."""


def forwards(config: Config, caller: Caller, request: Request) -> bool:
    """True when this daemon is a lab member and `request` belongs to the head.

    The service account's requests never are: they are the head's own; nor
    is `gpuq audit --here`, which asks for this server's own audit log.
    """
    return (
        config.lab.enabled
        and bool(config.lab.head)
        and not isinstance(request, LOCAL)
        and not (isinstance(request, Audit) and request.here)
        and not is_service_account(config, caller)
    )


def speaking_for(caller: Caller) -> dict[str, Any]:
    """The `as` field a member adds to a forwarded request: who the kernel says sent it."""
    return {"uid": caller.uid, "name": caller.name}


def said_here(head: str, error: GpuqError) -> GpuqError:
    """The head's `error`, said for a user of this server where it is about this server.

    A head that does not trust this server's service account refuses every
    request it forwards as if the user had named another: say who is at fault.
    """
    if isinstance(error, PermissionDenied) and error.message.startswith(NOT_TRUSTED):
        return PermissionDenied(
            f"the lab's head {head} does not take this server's requests: {error.message}",
            "ask the lab's admin: [lab] service_account on the head must name the account "
            "this server logs in as",
        )
    return error


class HeadLink:
    """One client connection's session to the head (opened at its first forwarded request)."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._process: asyncio.subprocess.Process | None = None
        self._stderr: IO[bytes] | None = None

    async def forward(self, message: dict[str, Any], caller: Caller, emit: Emit) -> dict[str, Any]:
        """Send the decoded request `message` to the head for `caller`; its result.

        The head's events are passed to `emit` (its heartbeats are not: this
        daemon beats for the request itself); its error is raised as the same
        GpuqError. A session that fails, or a request cancelled half-way, is
        closed: the next request opens a new one.
        """
        try:
            if self._process is None:
                await self._open()
            return await self._call({**message, "as": speaking_for(caller)}, emit)
        except BaseException as exc:
            if not isinstance(exc, GpuqError) or exc.code in ("unavailable", "protocol"):
                await self.close()
            raise

    async def _open(self) -> None:
        """Start ssh to the head's `gpuq bridge` and complete the handshake."""
        config = self._config
        prepare_ssh_dir(config.daemon.runtime_dir)  # ssh's shared connection lives there
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        server = ServerDecl(host=config.lab.head, command=config.lab.head_command)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *bridge_argv(server, config.cluster, config.daemon.runtime_dir),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=self._stderr,
                start_new_session=True,
                limit=MAX_REPLY_BYTES,
            )
        except FileNotFoundError:
            await self.close()
            raise DaemonUnavailable(
                "ssh is not installed here: the lab's head cannot be reached",
                "install the OpenSSH client (Debian: openssh-client)",
            ) from None
        first = config.cluster.connect_timeout + config.client.timeout
        try:
            await self._call(
                {"id": 0, "method": "hello", "params": {"version": PROTOCOL_VERSION}}, None, first
            )
        except GpuqError as exc:
            raise await self._why(exc) from None

    async def _call(
        self, message: dict[str, Any], emit: Emit | None, timeout: float | None = None
    ) -> dict[str, Any]:
        """Write one request and read the head's lines up to its reply."""
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        seconds = self._config.client.timeout if timeout is None else timeout
        head = self._config.lab.head
        try:
            process.stdin.write(encode(message))
            await process.stdin.drain()
        except (ConnectionError, OSError):
            raise self._gone() from None
        while True:
            try:
                line = await asyncio.wait_for(process.stdout.readline(), seconds)
            except TimeoutError:
                raise DaemonUnavailable(
                    f"the lab's head {head} did not answer within {seconds:g}s",
                    f"is it overloaded, or its daemon stopped? check: ssh {head} gpuq daemon "
                    "status (or ask the lab's admin)",
                ) from None
            except ValueError:
                raise ProtocolError(f"a reply from the lab's head {head} is too large") from None
            if not line:
                raise self._gone()
            envelope = parse_reply(decode(line))
            if envelope.event is not None:
                if emit is not None and envelope.event.get("type") != HEARTBEAT_EVENT:
                    await emit(envelope.event)
                continue
            if envelope.error is not None:
                raise said_here(self._config.lab.head, from_wire(envelope.error))
            assert envelope.result is not None
            return envelope.result

    def _gone(self) -> GpuqError:
        return DaemonUnavailable(
            f"the session to the lab's head {self._config.lab.head} ended",
            "the lab's queue lives there: ask the lab's admin if this lasts",
        )

    async def _why(self, exc: GpuqError) -> GpuqError:
        """The error to show for a handshake with the head that failed with `exc`."""
        head, command = self._config.lab.head, self._config.lab.head_command
        if isinstance(exc, ProtocolError) and "version" in exc.message:
            failure: GpuqError = ProtocolError(
                f"the lab's head {head} speaks another protocol: {exc.message}",
                "run the same gpuq release on every server of the lab",
            )
        else:
            process, stderr = self._process, self._stderr
            status = None
            if process is not None and stderr is not None:
                with contextlib.suppress(TimeoutError):
                    status = await asyncio.wait_for(process.wait(), EXIT_WAIT)
            if status is None or stderr is None:
                failure = exc
            else:
                stderr.seek(0)
                text = stderr.read().decode(errors="replace")
                failure = explain(head, command, status, text)
            failure = type(failure)(
                f"cannot reach the lab's head: {failure.message}",
                failure.hint or "the lab's queue lives there: ask the lab's admin",
            )
        await self.close()
        return failure

    async def close(self) -> None:
        """End the ssh session (its process group); the next forward opens a new one."""
        process, self._process = self._process, None
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), EXIT_WAIT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
