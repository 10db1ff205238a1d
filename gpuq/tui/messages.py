"""Messages the worker threads post to the `gpuq top` app; handlers own all state."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from gpuq.tui.source import Snapshot


class Connected(Message):
    """A (re)connection succeeded; the snapshot replaces everything shown."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class Disconnected(Message):
    """The daemon cannot be reached; the worker retries after `retry_in` seconds."""

    def __init__(self, reason: str, retry_in: float) -> None:
        super().__init__()
        self.reason = reason
        self.retry_in = retry_in


class JobChanged(Message):
    """One job object, from the subscription stream or fetched after an action.

    A fetched copy (`refreshed`) travels on another connection than the
    stream, so it may predate a transition the stream has already delivered:
    it only updates a job whose known state it shares (a new priority, say).
    """

    def __init__(self, job: dict[str, Any], *, refreshed: bool = False) -> None:
        super().__init__()
        self.job = job
        self.refreshed = refreshed


class GpusSampled(Message):
    """One `gpus` result from the poller."""

    def __init__(self, document: dict[str, Any]) -> None:
        super().__init__()
        self.document = document


class ActionDone(Message):
    """The per-job results of an action the user asked for."""

    def __init__(self, method: str, results: list[dict[str, Any]]) -> None:
        super().__init__()
        self.method = method
        self.results = results


class ActionFailed(Message):
    """An action could not be sent (the daemon refused it or is down)."""

    def __init__(self, method: str, message: str, hint: str | None) -> None:
        super().__init__()
        self.method = method
        self.message = message
        self.hint = hint
