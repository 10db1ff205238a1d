"""The wire protocol as pure functions: requests, specs, framing and replies.

`parse_request` turns a decoded line into one typed request or refuses it
with a `ProtocolError` (the envelope is wrong) or a `UsageError` (the
parameters are). `validate_spec` checks a submitted job spec. `encode` and
`decode` frame one JSON object per line, and `decode` accepts only strict
JSON: what the daemon can store and send back.
"""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq import client as client_module
from gpuq.client import Client
from gpuq.errors import GpuqError, NotFoundError, ProtocolError, UsageError, from_wire
from gpuq.models import Dependency, DependencyKind, JobSpec, JobState, SignalSpec
from gpuq.protocol import (
    INT_RANGE,
    MAX_BEGIN,
    MAX_REPLY_BYTES,
    MAX_REQUEST_BYTES,
    METHOD_NAMES,
    METHODS,
    PROTOCOL_VERSION,
    ActionOutcome,
    Audit,
    Cancel,
    Clean,
    DaemonStatus,
    Envelope,
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
    decode,
    encode,
    error_reply,
    parse_reply,
    parse_request,
    parse_states,
    request_params,
    validate_spec,
)
from gpuq.units import MAX_DURATION

# -- parse_request: every method ---------------------------------------------

EVERY_METHOD: list[tuple[str, dict[str, Any], Request]] = [
    ("hello", {"version": 1}, Hello(1)),
    ("hello", {"version": 1, "client": "gpuq-cli"}, Hello(1, "gpuq-cli")),
    (
        "submit",
        {"spec": {"command": ["true"], "cwd": "/"}},
        Submit({"command": ["true"], "cwd": "/"}),
    ),
    (
        "submit",
        {"spec": {}, "array": [0, 2], "token": "t1"},
        Submit({}, (0, 2), "t1"),
    ),
    ("list", {}, ListJobs()),
    (
        "list",
        {
            "states": ["queued"],
            "user": "ada",
            "name": "train",
            "ids": [1, 2],
            "include_done": False,
            "limit": 5,
        },
        ListJobs(("queued",), "ada", "train", (1, 2), False, 5),
    ),
    ("show", {"id": 7}, Show(7)),
    ("cancel", {"ids": [1, 2]}, Cancel((1, 2))),
    ("hold", {"ids": [3]}, Hold((3,))),
    ("release", {"ids": [3]}, Release((3,))),
    ("retry", {"ids": []}, Retry(())),
    ("priority", {"ids": [4], "priority": -2}, SetPriority((4,), -2)),
    ("suspend", {"ids": [5]}, Suspend((5,))),
    ("suspend", {"ids": [5], "mode": "park"}, Suspend((5,), "park")),
    ("resume", {"ids": [5]}, Resume((5,))),
    ("wait", {"ids": [1]}, Wait((1,))),
    ("wait", {"ids": [1, 2], "any": True, "timeout": 2.5}, Wait((1, 2), True, 2.5)),
    ("logs", {"id": 1}, Logs(1)),
    ("metrics", {"id": 3}, JobMetrics(3)),
    ("metrics", {"id": 3, "since": 17, "limit": 10}, JobMetrics(3, 17.0, 10)),
    (
        "logs",
        {"id": 1, "stream": "stderr", "tail": 10, "follow": True, "part": 2},
        Logs(1, "stderr", 10, True, 2),
    ),
    ("gpus", {}, Gpus()),
    ("status", {}, DaemonStatus()),
    ("shutdown", {}, Shutdown()),
    ("reload", {}, Reload()),
    ("clean", {}, Clean()),
    ("clean", {"older_than": 3600, "dry_run": True}, Clean(3600.0, True)),
    ("audit", {}, Audit()),
    ("audit", {"user": "alice", "since": 5.0, "limit": 10}, Audit("alice", 5.0, 10)),
    ("share", {}, Share()),
    ("subscribe", {}, Subscribe()),
    ("subscribe", {"topics": ["jobs", "gpus"]}, Subscribe(("jobs", "gpus"))),
    ("subscribe", {"topics": ["metrics"]}, Subscribe(("metrics",))),
    (
        "node.launch",
        {"head": "gpu1", "job": 7, "attempt": 2, "launch": {}, "gpus": ["GPU-a"]},
        NodeLaunch("gpu1", 7, 2, {}, ("GPU-a",)),
    ),
    (
        "node.signal",
        {"head": "gpu1", "job": 7, "attempt": 2, "signal": 15},
        NodeSignal("gpu1", 7, 2, 15),
    ),
    ("node.sync", {"head": "gpu1", "expect": {"7": 2}}, NodeSync("gpu1", {"7": 2})),
    (
        "node.sync",
        {"head": "gpu1", "expect": {}, "dirs": ["/home/ada"], "version": 4, "wait": 1},
        NodeSync("gpu1", {}, ("/home/ada",), 4, 1.0),
    ),
    (
        "node.sync",
        {"head": "gpu1", "expect": {}, "acked": 12, "outbox": "3f2a"},
        NodeSync("gpu1", {}, acked=12, outbox="3f2a"),
    ),
    (
        "node.control",
        {"head": "gpu1", "job": 7, "attempt": 2, "message": {"type": "resume"}},
        NodeControl("gpu1", 7, 2, {"type": "resume"}),
    ),
    ("migrate", {"id": 7, "to": "gpu2"}, Migrate(7, "gpu2")),
    (
        "node.receive",
        {"head": "gpu1", "job": 7, "phase": "prepare"},
        NodeReceive("gpu1", 7, "prepare"),
    ),
    (
        "node.receive",
        {"head": "gpu1", "job": 7, "phase": "commit", "checked": True},
        NodeReceive("gpu1", 7, "commit", checked=True),
    ),
    ("node.check", {"head": "gpu1", "job": 7}, NodeCheck("gpu1", 7)),
    ("node.dirs", {"paths": ["/home/ada"]}, NodeDirs(("/home/ada",))),
    ("node.read", {"head": "gpu1", "job": 7, "stream": "stdout"}, NodeRead("gpu1", 7, "stdout")),
    (
        "node.read",
        {"head": "gpu1", "job": 7, "stream": "stderr", "offset": 10, "limit": 5, "tail": 3},
        NodeRead("gpu1", 7, "stderr", 10, 5, 3),
    ),
    (
        "node.read",
        {"head": "gpu1", "job": 7, "stream": "stdout", "raw": True},
        NodeRead("gpu1", 7, "stdout", raw=True),
    ),
    (
        "node.output",
        {"head": "gpu1", "job": 7, "stream": "stdout", "uid": 1001, "offset": 0, "data": "aGk="},
        NodeOutput("gpu1", 7, "stdout", 1001, 0, "aGk="),
    ),
]


def test_the_table_covers_every_method() -> None:
    assert {method for method, _, _ in EVERY_METHOD} == set(METHODS)
    assert {METHOD_NAMES[cls] for cls in METHODS.values()} == set(METHODS)


@pytest.mark.parametrize(("method", "params", "expected"), EVERY_METHOD)
def test_every_method_parses_into_its_request(
    method: str, params: dict[str, Any], expected: Request
) -> None:
    request_id, request = parse_request({"id": 42, "method": method, "params": params})
    assert request_id == 42
    assert request == expected


@pytest.mark.parametrize(("method", "params", "expected"), EVERY_METHOD)
def test_request_params_encode_what_parse_request_decodes(
    method: str, params: dict[str, Any], expected: Request
) -> None:
    wire = json.loads(encode({"id": 1, "method": method, "params": request_params(expected)}))
    assert parse_request(wire) == (1, expected)


def test_params_may_be_left_out_when_every_field_has_a_default() -> None:
    assert parse_request({"id": 1, "method": "status"}) == (1, DaemonStatus())
    assert parse_request({"id": 1, "method": "list"}) == (1, ListJobs())


@pytest.mark.parametrize("request_id", [None, 0, -3, "abc", 1.5, [1, {"a": None}], {"k": "v"}])
def test_the_request_id_is_returned_as_given(request_id: object) -> None:
    assert parse_request({"id": request_id, "method": "status"})[0] == request_id


def test_a_request_without_an_id_has_id_none() -> None:
    assert parse_request({"method": "gpus"})[0] is None


def test_a_float_field_takes_an_integer_as_a_float() -> None:
    _, request = parse_request({"method": "wait", "params": {"ids": [1], "timeout": 3}})
    assert isinstance(request, Wait)
    assert request.timeout == 3.0
    assert isinstance(request.timeout, float)


@pytest.mark.parametrize(
    ("method", "params", "expected"),
    [
        ("list", {"user": None, "limit": None}, ListJobs()),
        ("wait", {"ids": [1], "timeout": None}, Wait((1,))),
        ("submit", {"spec": {}, "token": None}, Submit({})),
        ("logs", {"id": 2, "tail": None}, Logs(2)),
    ],
)
def test_optional_fields_accept_null(
    method: str, params: dict[str, Any], expected: Request
) -> None:
    assert parse_request({"method": method, "params": params})[1] == expected


# -- parse_request: refusals ------------------------------------------------------


def test_an_unknown_method_asks_whether_the_daemon_is_up_to_date() -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_request({"id": 1, "method": "frobnicate", "params": {}})
    assert caught.value.message == "unknown message 'frobnicate': is the daemon up to date?"
    assert caught.value.hint is not None
    assert all(name in caught.value.hint for name in METHODS)


@pytest.mark.parametrize("message", [[1, 2], "status", 3, 2.5, None, True])
def test_a_request_that_is_not_an_object_is_a_protocol_error(message: object) -> None:
    with pytest.raises(ProtocolError, match="a request must be a JSON object"):
        parse_request(message)


@pytest.mark.parametrize(
    "message",
    [{"id": 1}, {"id": 1, "method": None}, {"id": 1, "method": 5}, {"method": ["status"]}],
)
def test_a_request_needs_a_string_method(message: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError, match="needs a string 'method'"):
        parse_request(message)


@pytest.mark.parametrize("params", [None, [], "x", 1])
def test_params_must_be_an_object(params: object) -> None:
    with pytest.raises(UsageError, match="'params' of show must be an object"):
        parse_request({"method": "show", "params": params})


@pytest.mark.parametrize(
    ("method", "params", "missing"),
    [
        ("hello", {}, "hello.version"),
        ("show", {}, "show.id"),
        ("cancel", {}, "cancel.ids"),
        ("priority", {"ids": [1]}, "priority.priority"),
        ("submit", {"array": [1]}, "submit.spec"),
        ("logs", {"stream": "stdout"}, "logs.id"),
    ],
)
def test_a_missing_required_parameter_is_named(
    method: str, params: dict[str, Any], missing: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_request({"method": method, "params": params})
    assert caught.value.message == f"missing parameter {missing}"


def test_unknown_parameters_are_named_with_the_known_ones() -> None:
    with pytest.raises(UsageError) as caught:
        parse_request({"method": "show", "params": {"id": 1, "zeta": 1, "alpha": 2}})
    assert caught.value.message == "unknown parameter(s) for show: alpha, zeta"
    assert caught.value.hint == "known: id"


def test_a_method_without_parameters_says_it_takes_none() -> None:
    with pytest.raises(UsageError) as caught:
        parse_request({"method": "status", "params": {"verbose": True}})
    assert caught.value.hint == "known: none"


@pytest.mark.parametrize(
    ("method", "params", "where", "expected", "got"),
    [
        ("show", {"id": "7"}, "show.id", "int", "str"),
        ("show", {"id": True}, "show.id", "int", "bool"),
        ("show", {"id": 7.0}, "show.id", "int", "float"),
        ("show", {"id": None}, "show.id", "int", "NoneType"),
        ("cancel", {"ids": 1}, "cancel.ids", "tuple[int, ...]", "int"),
        ("cancel", {"ids": {"1": 1}}, "cancel.ids", "tuple[int, ...]", "dict"),
        ("cancel", {"ids": [1, "2"]}, "cancel.ids[]", "int", "str"),
        ("wait", {"ids": [1], "timeout": "5"}, "wait.timeout", "float | None", "str"),
        ("wait", {"ids": [1], "any": 1}, "wait.any", "bool", "int"),
        ("wait", {"ids": [1], "timeout": False}, "wait.timeout", "float | None", "bool"),
        ("logs", {"id": 1, "follow": "yes"}, "logs.follow", "bool", "str"),
        ("list", {"user": 5}, "list.user", "str | None", "int"),
        ("list", {"states": ["queued", 1]}, "list.states[]", "str", "int"),
        ("submit", {"spec": []}, "submit.spec", "dict[str, Any]", "list"),
        ("priority", {"ids": [1], "priority": None}, "priority.priority", "int", "NoneType"),
        ("hello", {"version": "1"}, "hello.version", "int", "str"),
        ("clean", {"older_than": [1]}, "clean.older_than", "float", "list"),
    ],
)
def test_a_wrong_parameter_type_names_the_field_and_both_types(
    method: str, params: dict[str, Any], where: str, expected: str, got: str
) -> None:
    with pytest.raises(UsageError) as caught:
        parse_request({"method": method, "params": params})
    assert caught.value.message == f"invalid value for {where}: expected {expected}, got {got}"


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_integers_beyond_64_bits_are_refused(value: int) -> None:
    with pytest.raises(UsageError, match=r"invalid value for show\.id: out of range"):
        parse_request({"method": "show", "params": {"id": value}})
    with pytest.raises(UsageError, match=r"cancel\.ids\[\]: out of range"):
        parse_request({"method": "cancel", "params": {"ids": [1, value]}})


@pytest.mark.parametrize("value", [INT_RANGE[0], INT_RANGE[-1], 0])
def test_integers_within_64_bits_are_accepted(value: int) -> None:
    assert parse_request({"method": "show", "params": {"id": value}})[1] == Show(value)


# -- validate_spec ------------------------------------------------------------


LONGEST = "1e12 seconds (some 31,700 years)"
"""What a refused duration is said to have to stay under (`MAX_DURATION`)."""


def spec(**fields: Any) -> dict[str, Any]:
    """A minimal valid wire spec with `fields` changed."""
    return {"command": ["true"], "cwd": "/", **fields}


def test_a_minimal_spec_gets_the_defaults() -> None:
    assert validate_spec(spec()) == JobSpec(command=("true",), cwd="/")


def test_a_full_spec_is_decoded_field_by_field() -> None:
    full = validate_spec(
        spec(
            env={"A": "1"},
            name="train",
            gpus=2,
            gpu_mem=6 * 1024**3,
            exclusive=True,
            priority=-1,
            after=["3", "4:any", "5:notok"],
            hold=True,
            begin=1.5e9,
            time_limit=60,
            retries=2,
            output="out-%j.txt",
            error="err.txt",
            signal=[10, 30],
            notify="echo done",
            array_parallel=4,
        )
    )
    assert full.env == {"A": "1"}
    assert full.after == (
        Dependency(3, DependencyKind.OK),
        Dependency(4, DependencyKind.ANY),
        Dependency(5, DependencyKind.NOTOK),
    )
    assert full.signal == SignalSpec(10, 30.0)
    assert full.time_limit == 60.0
    assert (full.gpus, full.gpu_mem, full.retries, full.array_parallel) == (2, 6 * 1024**3, 2, 4)


@pytest.mark.parametrize("missing", ["command", "cwd"])
def test_a_spec_needs_a_command_and_a_cwd(missing: str) -> None:
    data = spec()
    del data[missing]
    with pytest.raises(UsageError, match="a job spec needs 'command' and 'cwd'"):
        validate_spec(data)


def test_an_empty_command_is_refused_with_a_hint() -> None:
    with pytest.raises(UsageError, match="empty command") as caught:
        validate_spec(spec(command=[]))
    assert caught.value.hint is not None and "--" in caught.value.hint


@pytest.mark.parametrize(
    "fields",
    [
        {"gpus": -1},
        {"gpus": 1, "gpus_max": 100_000},
        {"gpu_mem": 0},
        {"retries": -1},
        {"time_limit": -5.0},
        {"array_parallel": 0},
        {"begin": 1e12},
        {"node_count": 0},
        {"signal": [999, 30]},
    ],
    ids=lambda fields: next(iter(fields.items()))[0] if len(fields) == 1 else "gpus_max",
)
def test_an_out_of_range_value_is_refused_with_a_hint(fields: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as caught:
        validate_spec(spec(**fields))
    assert caught.value.hint, caught.value.message


def test_unknown_spec_fields_are_named() -> None:
    with pytest.raises(UsageError) as caught:
        validate_spec(spec(gpu="1", colour="red"))
    assert caught.value.message == "unknown job spec field(s): colour, gpu"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": "1"}, "invalid value for spec.gpus: expected int, got str"),
        ({"command": "true"}, "invalid value for spec.command: expected tuple[str, ...], got str"),
        ({"command": ["sh", 1]}, "invalid value for spec.command[]: expected str, got int"),
        ({"env": ["A=1"]}, "invalid value for spec.env: expected dict[str, Any], got list"),
        ({"hold": 1}, "invalid value for spec.hold: expected bool, got int"),
        ({"after": [3]}, "invalid value for spec.after[]: expected str, got int"),
        ({"begin": "tomorrow"}, "invalid value for spec.begin: expected float | None, got str"),
        ({"gpus": 2**64}, "invalid value for spec.gpus: out of range"),
        ({"signal": [10.5, 1]}, "invalid value for spec.signal[0]: expected int, got float"),
        ({"signal": [10.0, 1]}, "invalid value for spec.signal[0]: expected int, got float"),
    ],
)
def test_spec_field_types_are_checked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        validate_spec(spec(**fields))
    assert caught.value.message == message


@pytest.mark.parametrize("env", [{"A": 1}, {"A": None}, {"A": ["x"]}])
def test_the_environment_maps_strings_to_strings(env: dict[str, Any]) -> None:
    with pytest.raises(UsageError, match="spec.env must map strings to strings"):
        validate_spec(spec(env=env))


@pytest.mark.parametrize("after", ["0", "-1", "x", "1:maybe", "", ":ok"])
def test_a_malformed_dependency_is_refused_with_the_accepted_forms(after: str) -> None:
    with pytest.raises(UsageError, match="invalid job spec") as caught:
        validate_spec(spec(after=[after]))
    assert caught.value.hint == "dependencies look like ID or ID:ok|any|notok"


def test_a_dependency_id_beyond_64_bits_is_refused() -> None:
    with pytest.raises(UsageError, match="spec.after: job id out of range"):
        validate_spec(spec(after=[str(2**63)]))


@pytest.mark.parametrize("signal", [[10], [10, 30, 1], []])
def test_the_signal_is_a_pair(signal: list[int]) -> None:
    with pytest.raises(UsageError, match=r"spec.signal must be \[signal, seconds\]"):
        validate_spec(spec(signal=signal))


@pytest.mark.parametrize("number", [0, -1, 65, 99999])
def test_the_signal_must_exist(number: int) -> None:
    with pytest.raises(UsageError, match=f"no signal number {number}"):
        validate_spec(spec(signal=[number, 30], time_limit=60))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gpus": -1}, "--gpus must be 0 or more, got -1"),
        ({"gpu_mem": 0}, "--gpu-mem must be positive"),
        ({"gpu_mem": -5}, "--gpu-mem must be positive"),
        ({"gpu_mem": 1024, "gpus": 0}, "--gpu-mem needs --gpus 1 or more"),
        ({"gpu_mem_auto": True, "gpus": 0}, "--gpu-mem needs --gpus 1 or more"),
        ({"retries": -1}, "--retries must be 0 or more"),
        ({"time_limit": 0}, "--time must be positive"),
        ({"time_limit": -1.5}, "--time must be positive"),
        ({"array_parallel": 0}, "the array limit after % must be positive"),
        ({"begin": MAX_BEGIN}, "--begin must be before the year 10000"),
        ({"begin": 1e300}, "--begin must be before the year 10000"),
        ({"time_limit": 1e308}, f"--time must be less than {LONGEST}"),
        ({"time_limit": MAX_DURATION}, f"--time must be less than {LONGEST}"),
        (
            {"signal": [10, -5], "time_limit": 3},
            f"--signal: the time before the limit must be 0 or more and less than {LONGEST}, "
            "got -5",
        ),
        (
            {"signal": [10, 1e308]},
            f"--signal: the time before the limit must be 0 or more and less than {LONGEST}, "
            "got 1e+308",
        ),
    ],
)
def test_out_of_range_values_are_refused_in_the_cli_s_terms(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        validate_spec(spec(**fields))
    assert caught.value.message == message


@pytest.mark.parametrize(
    "fields",
    [
        {"gpus": 0},
        {"gpu_mem": 1},
        {"retries": 0},
        {"time_limit": 1e-3},
        {"begin": MAX_BEGIN - 1},
        {"begin": -1e300},
        {"array_parallel": 1},
        {"signal": [15, 0], "time_limit": 10},
        {"time_limit": MAX_DURATION - 1},
        {"signal": [15, MAX_DURATION - 1]},
    ],
)
def test_values_at_the_edge_of_their_range_are_accepted(fields: dict[str, Any]) -> None:
    validate_spec(spec(**fields))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"command": ["echo", "a\0b"]}, "command"),
        ({"cwd": "/tmp\0"}, "cwd"),
        ({"name": "x\0"}, "name"),
        ({"output": "out\0/x"}, "output"),
        ({"error": "\0"}, "error"),
        ({"notify": "echo\0"}, "notify"),
        ({"env": {"A\0": "1"}}, "env"),
        ({"env": {"A": "1\0"}}, "env"),
    ],
)
def test_strings_for_the_os_cannot_hold_nul(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(UsageError) as caught:
        validate_spec(spec(**fields))
    assert caught.value.message == f"spec.{field} contains a NUL character"


def test_the_array_index_is_set_by_the_daemon_never_by_the_request() -> None:
    """The daemon numbers an array's tasks from `Submit.array`; a plain job is no task."""
    with pytest.raises(UsageError) as caught:
        validate_spec(spec(array_index=5))
    assert (
        caught.value.message == "spec.array_index is set by the daemon, for each task of an array"
    )
    assert caught.value.hint == (
        'give the indices as the submit request\'s "array" instead, e.g. "array": [0, 1, 2]'
    )
    assert validate_spec(spec(array_index=None)).array_index is None  # a JobSpec's to_dict()
    assert validate_spec(spec(), array=True).array_index is None


@pytest.mark.parametrize("cwd", [".", "tmp", "../x", ""])
def test_the_working_directory_must_be_absolute(cwd: str) -> None:
    """The daemon runs in /: a relative cwd would be taken from there, not the client's."""
    with pytest.raises(UsageError) as caught:
        validate_spec(spec(cwd=cwd))
    assert caught.value.message == f"spec.cwd must be an absolute path, got {cwd!r}"
    assert caught.value.hint == "send the job's working directory in full, as gpuq submit does"


def test_an_environment_name_cannot_contain_an_equals_sign() -> None:
    with pytest.raises(UsageError, match="a variable name cannot contain '='"):
        validate_spec(spec(env={"A=B": "1"}))
    assert validate_spec(spec(env={"A": "B=C"})).env == {"A": "B=C"}


# -- framing: encode and decode -------------------------------------------------

json_leaves = (
    st.none()
    | st.booleans()
    | st.integers(min_value=INT_RANGE[0], max_value=INT_RANGE[-1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_leaves,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_encode_makes_one_line_that_decodes_to_the_same_value(value: object) -> None:
    line = encode({"id": 1, "value": value})
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert decode(line) == {"id": 1, "value": value}


def test_encode_refuses_what_json_cannot_carry() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode({"id": 1, "result": {"x": float("nan")}})


@pytest.mark.parametrize(
    "line",
    [
        b"{",
        b"not json",
        b'{"id": 1,}',
        b"\xff\xfe\xfd",
        b'{"id": "\xc3\x28"}',
        b'{"id": NaN}',
        b'{"id": Infinity}',
        b'{"id": -Infinity}',
        b'{"x": [1e999]}',
        b'{"id": -1e400}',
        b'{"id": "\\ud800"}',
        b'{"\\udfff": 1}',
        b'["a", ["\\ud83d"]]',
        b'{"id": 1' + b"0" * 5000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        '{"id": 1}'.encode("utf-16"),
        '{"id": 1}'.encode("utf-16-le"),
        '{"id": 1}'.encode("utf-16-be"),
        '{"id": 1}'.encode("utf-32"),
        '{"id": 1}'.encode("utf-32-le"),
        '{"id": 1}'.encode("utf-8-sig"),
    ],
)
def test_decode_refuses_anything_but_strict_json(line: bytes) -> None:
    with pytest.raises(ProtocolError, match="malformed JSON") as caught:
        decode(line)
    assert caught.value.code == "protocol"
    assert caught.value.hint == "send one JSON object per line"


@pytest.mark.parametrize(
    ("line", "value"),
    [
        (b'{"id": "\\ud83d\\ude00"}', {"id": "\U0001f600"}),
        (b'{"id": 1e308}', {"id": 1e308}),
        (b'{"id": -0.0}', {"id": 0.0}),
        (b'{"id": 1' + b"0" * 4000 + b"}", {"id": 10**4000}),
        (b"  [1, 2]  \n", [1, 2]),
        ('{"name": "caf\u00e9"}'.encode(), {"name": "caf\u00e9"}),
    ],
)
def test_decode_accepts_valid_json_at_its_edges(line: bytes, value: object) -> None:
    assert decode(line) == value


def test_the_request_line_limit_is_one_mebibyte() -> None:
    assert MAX_REQUEST_BYTES == 1024 * 1024
    assert MAX_REPLY_BYTES > MAX_REQUEST_BYTES


def test_an_oversized_reply_frame_is_a_protocol_error_not_a_partial_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "MAX_REPLY_BYTES", 1000)
    ours, daemon_end = socket.socketpair()
    with daemon_end, Client(ours, {}) as client:
        daemon_end.sendall(encode({"id": 1, "result": {"data": "x" * 2000}}))
        with pytest.raises(ProtocolError, match="malformed JSON"):
            client.call("status")


def test_a_reply_frame_within_the_limit_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MAX_REPLY_BYTES", 1000)
    ours, daemon_end = socket.socketpair()
    with daemon_end, Client(ours, {}) as client:
        daemon_end.sendall(encode({"id": 1, "result": {"data": "x" * 900}}))
        assert client.call("status") == {"data": "x" * 900}


# -- replies ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "envelope"),
    [
        ({"id": 1, "result": {"a": 1}}, Envelope(1, result={"a": 1})),
        ({"id": None, "error": {"code": "x"}}, Envelope(None, error={"code": "x"})),
        ({"id": "s", "event": {}}, Envelope("s", event={})),
    ],
)
def test_parse_reply_accepts_each_kind_of_reply(
    message: dict[str, Any], envelope: Envelope
) -> None:
    assert parse_reply(message) == envelope


@pytest.mark.parametrize(
    "message",
    [
        {"result": {}},
        {"id": 1},
        {"id": 1, "result": [1]},
        {"id": 1, "error": "boom"},
        [1, {"result": {}}],
        None,
    ],
)
def test_parse_reply_refuses_malformed_replies(message: object) -> None:
    with pytest.raises(ProtocolError, match="malformed reply from daemon"):
        parse_reply(message)


@pytest.mark.parametrize(
    "error",
    [
        UsageError("bad", "fix it"),
        NotFoundError("no job 3"),
        ProtocolError("old client", None),
    ],
)
def test_an_error_reply_carries_code_message_and_hint_back_to_the_same_class(
    error: GpuqError,
) -> None:
    reply = json.loads(encode(error_reply(9, error)))
    assert reply == {
        "id": 9,
        "error": {"code": error.code, "message": error.message, "hint": error.hint},
    }
    again = from_wire(reply["error"])
    assert type(again) is type(error)
    assert (again.message, again.hint) == (error.message, error.hint)


def test_the_protocol_version_is_a_positive_integer() -> None:
    assert isinstance(PROTOCOL_VERSION, int)
    assert PROTOCOL_VERSION >= 1


# -- helpers ------------------------------------------------------------------


def test_parse_states_maps_names_to_states() -> None:
    assert parse_states(("queued", "running")) == {JobState.QUEUED, JobState.RUNNING}
    assert parse_states(()) == frozenset()


def test_parse_states_lists_the_valid_names_on_a_typo() -> None:
    with pytest.raises(UsageError) as caught:
        parse_states(("queued", "runing"))
    assert caught.value.message == "unknown job state 'runing'"
    assert caught.value.hint is not None
    assert all(state.value in caught.value.hint for state in JobState)


def test_an_action_outcome_encodes_every_field() -> None:
    assert ActionOutcome(3, False, "no job 3", code="not_found").to_dict() == {
        "id": 3,
        "ok": False,
        "message": "no job 3",
        "state": None,
        "code": "not_found",
    }
    assert ActionOutcome(4, True, state="held").to_dict()["code"] is None
