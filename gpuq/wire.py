"""Framing of the daemon protocol: versions, limits, lines and reply envelopes.

The light half of `gpuq.protocol`, with no request types, so a client that
only sends and receives lines (`gpuq submit`) loads nothing else.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final, NamedTuple

from gpuq.errors import GpuqError, ProtocolError

PROTOCOL_VERSION: Final = 1
MAX_REQUEST_BYTES: Final = 1024 * 1024
"""Longest request line the daemon accepts (the environment rides along)."""
MAX_REPLY_BYTES: Final = 512 * 1024 * 1024
"""Longest reply line a client accepts (a listing of many jobs)."""
HEARTBEAT_EVENT: Final = "heartbeat"
"""Type of the event the daemon sends on a connection while a request is still running."""
HEARTBEAT_SECONDS: Final = 2.0
"""Seconds between heartbeats: a client's read timeout must be longer than this."""


def encode(message: dict[str, Any]) -> bytes:
    """One protocol line: compact JSON, no NaN, newline-terminated."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text:.40} is out of range")
    return value


def _has_lone_surrogate(value: object) -> bool:
    """True if a string anywhere in `value` is not valid Unicode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def decode(line: bytes, *, unique_keys: bool = False) -> object:
    """Decode one protocol line; raises ProtocolError unless it is strict JSON.

    Strict means UTF-8 text (json.loads would take bytes in UTF-16 or
    UTF-32 too, and skip a byte order mark) holding a value that can be
    stored and sent back: no NaN or Infinity, no number beyond a double, no
    string with a lone surrogate, and no nesting deeper than Python's
    recursion limit. With `unique_keys` (the daemon, reading a request), an
    object naming a key twice is refused too: `{"method": "list", "method":
    "shutdown"}` must not mean whichever comes last.
    """
    hint = "send one JSON object per line"
    pairs = _unique_object if unique_keys else None
    try:
        text = line.decode("utf-8")
        value = json.loads(
            text,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            object_pairs_hook=pairs,
        )
    except RecursionError:
        raise ProtocolError("malformed JSON: nested too deeply", hint) from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an over-long integer
        raise ProtocolError(f"malformed JSON: {exc}", hint) from exc
    if _has_lone_surrogate(value):
        raise ProtocolError("malformed JSON: a string is not valid Unicode (lone surrogate)", hint)
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object as a dict; ValueError (malformed JSON) if it names a key twice."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"key {key!r} given twice")
        obj[key] = value
    return obj


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
