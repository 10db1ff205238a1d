"""Route each request kind to its handler module: one exhaustive match."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, assert_never

from gpuq.daemon.access import require_admin, require_server
from gpuq.daemon.handlers import (
    actions,
    audit,
    clean,
    gpus,
    hello,
    listing,
    logs,
    metrics,
    migrate,
    node,
    reload,
    share,
    show,
    shutdown,
    status,
    submit,
    subscribe,
    wait,
)
from gpuq.daemon.identity import Caller
from gpuq.daemon.state import DaemonState
from gpuq.protocol import (
    NODE_REQUESTS,
    Audit,
    Cancel,
    Clean,
    DaemonStatus,
    Gpus,
    Hello,
    Hold,
    JobMetrics,
    ListJobs,
    Logs,
    Migrate,
    NodeCheck,
    NodeControl,
    NodeDirs,
    NodeLaunch,
    NodeOutput,
    NodeRead,
    NodeReceive,
    NodeSignal,
    NodeSync,
    Release,
    Reload,
    Request,
    Resume,
    Retry,
    SetPriority,
    Share,
    Show,
    Shutdown,
    Submit,
    Subscribe,
    Suspend,
    Wait,
)

Emit = Callable[[dict[str, Any]], Awaitable[None]]


async def dispatch(
    state: DaemonState, request: Request, emit: Emit, caller: Caller
) -> dict[str, Any]:
    """Run the handler for `request` on behalf of `caller`; streaming handlers use `emit`.

    Server-wide requests are refused here to anyone but a lab's admins, and
    node requests to anyone but root and its service account
    (`gpuq.daemon.access`); per-job rules live in the job handlers.
    """
    if isinstance(request, Shutdown | Reload):
        require_admin(state.config, caller, "stop or reload the daemon")
    elif isinstance(request, NODE_REQUESTS):
        require_server(state.config, caller, "send a server's node requests")
    match request:
        case Hello():
            return hello.handle(state, request)
        case Submit():
            return submit.handle(state, request, caller)
        case ListJobs():
            return listing.handle(state, request, caller)
        case Show():
            return show.handle(state, request, caller)
        case Cancel() | Hold() | Release() | Retry() | SetPriority() | Suspend() | Resume():
            return await actions.handle(state, request, caller)
        case Wait():
            return await wait.handle(state, request, emit)
        case Logs():
            return await logs.handle(state, request, emit, caller)
        case JobMetrics():
            return metrics.handle(state, request)
        case Gpus():
            return gpus.handle(state, request)
        case DaemonStatus():
            return status.handle(state, request)
        case Shutdown():
            return shutdown.handle(state, request)
        case Reload():
            return reload.handle(state, request)
        case Clean():
            return clean.handle(state, request, caller)
        case Audit():
            return audit.handle(state, request, caller)
        case Share():
            return share.handle(state, request)
        case Subscribe():
            return await subscribe.handle(state, request, emit, caller)
        case Migrate():
            return migrate.handle(state, request, caller)
        case NodeLaunch():
            return await node.launch(state, request, caller)
        case NodeSignal():
            return await node.signal(state, request)
        case NodeSync():
            return await node.sync(state, request)
        case NodeControl():
            return node.control(state, request)
        case NodeReceive():
            return await node.receive(state, request)
        case NodeCheck():
            return await node.check(state, request)
        case NodeDirs():
            return node.dirs(request)
        case NodeRead():
            return node.read(state, request)
        case NodeOutput():
            return await node.output(state, request)
        case _:
            assert_never(request)
