"""The control-channel vocabulary (`gpuq.control`) as pure functions.

Every message survives `to_dict` and `parse_message`; anything else, from a
wrong type to a non-finite number, is a `ProtocolError` naming the problem,
so neither end of the channel ever handles untyped input.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuq.control import (
    MESSAGE_TYPES,
    Ack,
    CheckpointRequest,
    Hello,
    Message,
    Metrics,
    MetricsSample,
    ResizeRequest,
    ResumeRequest,
    SuspendRequest,
    Welcome,
    parse_message,
    sample_to_dict,
    to_dict,
)
from gpuq.errors import ProtocolError

FULL_SAMPLE = MetricsSample(
    time=1700000000.5,
    step=120,
    epoch=2,
    step_seconds=0.031,
    samples_per_second=2064.5,
    batch_size=64,
    local_batch_size=32,
    accumulation_steps=2,
    replicas=1,
    memory_min_bytes=1 << 20,
    memory_peak_bytes=3 << 20,
    loss=-0.25,
    grad_sqr=0.5,
    grad_var=2.0,
    gain=1.5,
    efficiency=0.75,
    goodput=1548.4,
    progress=9000.0,
    perf_params=(0.1, 0.01, 0.2, 0.02, 0.3, 0.03, 1.5),
)

EVERY_MESSAGE: list[Message] = [
    Hello(1, 7, 2, 4242, ("checkpoint", "park", "metrics")),
    Welcome(1, 0.5),
    Metrics(FULL_SAMPLE),
    Metrics(MetricsSample(time=1.0, step=0)),
    SuspendRequest("checkpoint"),
    SuspendRequest("park"),
    ResumeRequest(),
    CheckpointRequest(),
    ResizeRequest(4),
    Ack("suspend", True, {"mode": "checkpoint", "bytes": 10, "seconds": 0.5}),
    Ack("checkpoint", False, {"error": "disk full"}),
]


def test_the_examples_cover_every_message_type() -> None:
    assert {type(m) for m in EVERY_MESSAGE} == set(MESSAGE_TYPES.values())


@pytest.mark.parametrize("message", EVERY_MESSAGE, ids=lambda m: type(m).__name__)
def test_every_message_survives_a_trip_through_json(message: Message) -> None:
    assert parse_message(json.loads(json.dumps(to_dict(message)))) == message


def test_a_sample_leaves_out_what_was_not_measured() -> None:
    assert sample_to_dict(MetricsSample(time=1.0, step=3)) == {"time": 1.0, "step": 3, "epoch": 0}


REFUSED: dict[str, tuple[Any, str]] = {
    "not an object": ([1], "must be a JSON object"),
    "no type": ({}, "unknown control message type None"),
    "unknown type": ({"type": "teleport"}, "unknown control message type 'teleport'"),
    "unknown field": ({"type": "resume", "now": True}, "unknown field(s) now"),
    "missing field": ({"type": "hello", "version": 1}, "missing field 'job_id'"),
    "wrong type": ({"type": "resize", "gpus": "2"}, "resize message: gpus must be int"),
    "bool for int": ({"type": "resize", "gpus": True}, "gpus must be int"),
    "bad mode": ({"type": "suspend", "mode": "hibernate"}, "unknown suspend mode 'hibernate'"),
    "bad ack": ({"type": "ack", "request": "dance"}, "ack for unknown request 'dance'"),
    "negative gpus": ({"type": "resize", "gpus": -1}, "negative number of GPUs"),
    "zero interval": ({"type": "welcome", "version": 1, "metrics_interval": 0}, "positive"),
    "no sample": ({"type": "metrics"}, "needs a 'sample' object"),
    "negative step": (
        {"type": "metrics", "sample": {"time": 1, "step": -1}},
        "step is negative",
    ),
    "infinite": (
        {"type": "metrics", "sample": {"time": 1, "step": 1, "goodput": float("inf")}},
        "goodput is not finite",
    ),
    "bad perf params": (
        {"type": "metrics", "sample": {"time": 1, "step": 1, "perf_params": ["a"]}},
        "perf_params must be float",
    ),
}


@pytest.mark.parametrize(("obj", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_anything_else_is_a_protocol_error_naming_the_problem(obj: Any, message: str) -> None:
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_message(obj)


def test_a_negative_loss_is_a_valid_measurement() -> None:
    parsed = parse_message({"type": "metrics", "sample": {"time": 1, "step": 1, "loss": -2}})
    assert isinstance(parsed, Metrics)
    assert parsed.sample.loss == -2.0
