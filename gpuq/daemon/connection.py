"""One client connection: peer check, handshake, then request after request.

Anything malformed, oversized, unknown or invalid gets an error reply and the
daemon keeps serving; an oversized line also closes the connection, since
the stream can no longer be framed reliably.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from gpuq import __version__
from gpuq.config import Config
from gpuq.daemon import audit
from gpuq.daemon.access import is_service_account
from gpuq.daemon.dispatch import dispatch
from gpuq.daemon.forward import NOT_TRUSTED, HeadLink, forwards
from gpuq.daemon.identity import Caller, UnknownAccount, lab_caller, owner_caller, peer_credentials
from gpuq.daemon.state import DaemonState
from gpuq.errors import DaemonUnavailable, GpuqError, PermissionDenied, ProtocolError
from gpuq.protocol import (
    HEARTBEAT_EVENT,
    HEARTBEAT_SECONDS,
    PROTOCOL_VERSION,
    Hello,
    Request,
    Shutdown,
    decode,
    encode,
    error_reply,
    parse_request,
)

log = logging.getLogger("gpuq.daemon")

HELLO_SECONDS = 10.0
"""How long a new connection has to send its hello: a silent one only holds a descriptor."""
MAX_CONNECTIONS_PER_USER = 256
"""Connections one user may hold open on a lab daemon at once (root and the lab's servers: any).

Each holds a descriptor and at most one reply buffered for a client that
does not read it: one user must not run the daemon out of either.
"""


def peer_uid(writer: asyncio.StreamWriter) -> int | None:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    return peer_credentials(sock)[1]


def identify(state: DaemonState, writer: asyncio.StreamWriter) -> Caller:
    """Who is at the other end, from the kernel; raises if they may not use this daemon.

    A lab daemon serves every user with an account on this server; a
    personal daemon only its own user.
    """
    uid = peer_uid(writer)
    if state.config.lab.enabled and uid is not None:
        try:
            return lab_caller(uid, state.config.lab.admins)
        except UnknownAccount as exc:
            raise PermissionDenied(str(exc), "only users with an account here may use it") from None
    if uid is not None and uid != os.getuid():
        raise ProtocolError(
            f"uid {uid} may not use this daemon (it belongs to uid {os.getuid()})",
            "each user runs their own gpuq daemon",
        )
    return owner_caller()


def admit(config: Config, connections: Counter[int], caller: Caller) -> int:
    """Count a connection in `connections` against its user's uid; refuse one past the lab's cap."""
    capped = config.lab.enabled and not (caller.uid == 0 or is_service_account(config, caller))
    if capped and connections[caller.uid] >= MAX_CONNECTIONS_PER_USER:
        raise DaemonUnavailable(
            f"uid {caller.uid} has {MAX_CONNECTIONS_PER_USER} connections to this daemon open "
            "already, the most one user may",
            "end some of your gpuq commands (waits, followed logs, gpuq top) and try again",
        )
    connections[caller.uid] += 1
    return caller.uid


def acting_for(config: Config, caller: Caller, message: object) -> Caller:
    """Who a request acts for: its sender, or the user a lab member forwards it for.

    Only the lab's service account may name another user (`as`, added by a
    member, `gpuq.daemon.forward`), and only one with an account here under
    the same name: the lab's servers share their accounts.
    """
    speaking = message.get("as") if isinstance(message, dict) else None
    if speaking is None:
        return caller
    if not config.lab.enabled or not is_service_account(config, caller):
        raise PermissionDenied(
            f"{NOT_TRUSTED} (you are {caller.name})",
            "a request acts for whoever sends it: leave out 'as'",
        )
    uid = speaking.get("uid") if isinstance(speaking, dict) else None
    name = speaking.get("name") if isinstance(speaking, dict) else None
    if not isinstance(uid, int) or isinstance(uid, bool) or not isinstance(name, str):
        raise ProtocolError("'as' must be an object with an integer uid and a name")
    try:
        acting = lab_caller(uid, config.lab.admins)
    except UnknownAccount:
        raise PermissionDenied(
            f"{name} (uid {uid}) has no account on this server",
            "the lab's servers must share their accounts (the same names and uids)",
        ) from None
    if acting.name != name:
        raise PermissionDenied(
            f"uid {uid} is {acting.name} here but {name} on the server that sent the request",
            "the lab's servers must share their accounts (the same names and uids)",
        )
    return acting


def check_hello(request: Request) -> None:
    """The first request must be a hello of our protocol version."""
    if not isinstance(request, Hello):
        raise ProtocolError("the first request must be hello", "send a hello with your version")
    if request.version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"protocol version {request.version} is not supported "
            f"(daemon speaks {PROTOCOL_VERSION}, gpuq {__version__})",
            "restart the daemon after upgrading: gpuq daemon restart",
        )


async def _with_heartbeats(
    work: Coroutine[Any, Any, dict[str, Any]], beat: Callable[[], bool]
) -> dict[str, Any]:
    """Run a request, calling `beat` every `HEARTBEAT_SECONDS` until it is done.

    A client's read timeout then bounds the daemon's silence, not the
    length of a `wait` or `logs -f`; a beat that finds the client gone
    (False) cancels the request, which then ends as a ConnectionResetError:
    the connection is over, not the daemon (a cancelled connection task
    would be logged as an error by asyncio). The request is awaited in
    place, not as a task of its own, so one that never waits (`list`,
    `show`) is answered in the loop turn its line arrived in; the heartbeats
    come from a timer.
    """
    loop = asyncio.get_running_loop()
    serving = asyncio.current_task()
    timer: asyncio.TimerHandle
    gone = False

    def tick() -> None:
        nonlocal timer, gone
        if beat():
            timer = loop.call_later(HEARTBEAT_SECONDS, tick)
        elif serving is not None:
            gone = True
            serving.cancel()

    timer = loop.call_later(HEARTBEAT_SECONDS, tick)
    try:
        return await work
    except asyncio.CancelledError:
        if not gone or serving is None:
            raise
        serving.uncancel()
        log.info("a request was dropped: its client went away")
        raise ConnectionResetError("the client went away") from None
    finally:
        timer.cancel()


async def serve_connection(
    state: DaemonState, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Serve one client until it disconnects."""

    async def send(message: dict[str, Any]) -> None:
        writer.write(encode(message))
        await writer.drain()

    link: HeadLink | None = None
    """The session to the lab's head, on a lab member (`gpuq.daemon.forward`)."""
    in_flight: object = None
    """The id of the request being answered, if any."""
    stopper = False
    """Whether this client asked the daemon to stop (and has its answer)."""
    counted: int | None = None
    """The uid this connection counts against, once admitted."""
    try:
        try:
            caller = identify(state, writer)
            counted = admit(state.config, state.connections, caller)
        except GpuqError as exc:
            await send(error_reply(None, exc))
            return
        greeted = False
        hello_by = asyncio.get_running_loop().time() + HELLO_SECONDS
        while not state.should_exit.is_set():
            in_flight = None  # the last request, if any, has its answer
            try:
                if greeted:
                    line = await reader.readline()
                else:
                    left = hello_by - asyncio.get_running_loop().time()
                    line = await asyncio.wait_for(reader.readline(), max(0.0, left))
            except TimeoutError:
                log.info("closed a connection that sent no hello in %.0f s", HELLO_SECONDS)
                return
            except ValueError:
                await send(
                    error_reply(
                        None,
                        ProtocolError(
                            "request too large", "requests are limited to 1 MiB per line"
                        ),
                    )
                )
                return
            if not line.endswith(b"\n"):
                return  # the client went away, perhaps mid-line: nobody to answer
            if not line.strip():
                continue
            request_id: object = None
            try:
                message = decode(line, unique_keys=True)
                if isinstance(message, dict):
                    request_id = message.get("id")
                request_id, request = parse_request(message)
                in_flight, stopper = request_id, isinstance(request, Shutdown)
                if not greeted or isinstance(request, Hello):
                    check_hello(request)
                    greeted = True

                async def emit(event: dict[str, Any], rid: object = request_id) -> None:
                    await send({"id": rid, "event": event})

                def beat(rid: object = request_id) -> bool:
                    if not writer.is_closing():  # a whole line: never splits another one
                        writer.write(encode({"id": rid, "event": {"type": HEARTBEAT_EVENT}}))
                    return not writer.is_closing()

                if forwards(state.config, caller, request):
                    assert isinstance(message, dict)
                    link = link or HeadLink(state.config)
                    result = await _with_heartbeats(link.forward(message, caller, emit), beat)
                    await send({"id": request_id, "result": result})
                    continue  # the head audits it
                acting = caller
                try:
                    acting = acting_for(state.config, caller, message)
                    result = await _with_heartbeats(dispatch(state, request, emit, acting), beat)
                except GpuqError as exc:
                    audit.record(state, acting, request, None, exc)
                    raise
                audit.record(state, acting, request, result, None)
                await send({"id": request_id, "result": result})
            except GpuqError as exc:
                await send(error_reply(request_id, exc))
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as exc:
                log.exception("internal error while serving a request")
                await send(
                    error_reply(
                        request_id,
                        GpuqError(f"internal error: {exc!r}", "see the daemon log; please report"),
                    )
                )
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        if counted is not None:
            state.connections[counted] -= 1
            if not state.connections[counted]:
                del state.connections[counted]
        if state.stopped_for_good is not None and not stopper and not writer.is_closing():
            # `gpuq daemon stop`: a client waiting here must not wait for a daemon to return
            writer.write(encode(error_reply(in_flight, state.stopped_for_good)))
        if link is not None:
            await link.close()
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
