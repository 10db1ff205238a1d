"""Framing of the daemon protocol: versions, limits, lines and reply envelopes.

The light half of `gpuq.protocol`, with no request types, so a client that
only sends and receives lines (`gpuq submit`) loads nothing else.
"""

from __future__ import annotations

import json
from typing import Any, Final, NamedTuple

from gpuq.errors import GpuqError, ProtocolError

PROTOCOL_VERSION: Final = 1
MAX_REQUEST_BYTES: Final = 1024 * 1024
"""Longest request line the daemon accepts (the environment rides along)."""
MAX_REPLY_BYTES: Final = 512 * 1024 * 1024
"""Longest reply line a client accepts (a listing of many jobs)."""


def encode(message: dict[str, Any]) -> bytes:
    """One protocol line: compact JSON, no NaN, newline-terminated."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode(line: bytes) -> object:
    """Decode one protocol line; raises ProtocolError on invalid JSON."""
    try:
        return json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"malformed JSON: {exc}", "send one JSON object per line") from exc


def error_reply(request_id: object, error: GpuqError) -> dict[str, Any]:
    """The reply object for a failed request."""
    return {"id": request_id, "error": error.to_wire()}


class Envelope(NamedTuple):
    """A decoded reply line: exactly one of result, error or event is set."""

    id: object
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    event: dict[str, Any] | None = None


def parse_reply(message: object) -> Envelope:
    """Validate a reply object from the daemon."""
    if not isinstance(message, dict) or "id" not in message:
        raise ProtocolError(f"malformed reply from daemon: {message!r:.200}")
    for key in ("result", "error", "event"):
        value = message.get(key)
        if isinstance(value, dict):
            return Envelope(message["id"], **{key: value})
    raise ProtocolError(f"malformed reply from daemon: {message!r:.200}")
