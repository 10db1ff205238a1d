"""`gpuq submit`'s own option parser: each value is checked under the option's own name.

A value left empty is refused, not taken as no option: a script that writes
`--time "$LIMIT"` with LIMIT unset would otherwise queue a job without the
time limit its author meant, and say nothing.
"""

from __future__ import annotations

import pytest

from gpuq.cli.submit import SUBMIT_OPTIONS, Option, build_spec, parse_submit_args
from gpuq.config import DefaultsConfig
from gpuq.errors import UsageError

TEXT_OPTIONS = [opt for opt in SUBMIT_OPTIONS if opt.kind == "str" and opt.dest != "config"]
INT_OPTIONS = [opt for opt in SUBMIT_OPTIONS if opt.kind == "int"]
HUGE = "99999999999999999999"


@pytest.mark.parametrize("opt", TEXT_OPTIONS, ids=lambda opt: opt.flags[0])
@pytest.mark.parametrize("form", ["separate", "inline"])
def test_an_empty_value_is_refused_with_what_the_option_takes(opt: Option, form: str) -> None:
    flag = opt.flags[0]
    args = [flag, ""] if form == "separate" else [f"{flag}="]
    with pytest.raises(UsageError) as refused:
        parse_submit_args([*args, "--", "true"])
    assert refused.value.message == f"{flag} was given an empty value"
    assert refused.value.hint == f"write {flag} {opt.metavar}, or leave it out"


def test_every_option_that_takes_text_is_checked() -> None:
    assert {opt.flags[0] for opt in TEXT_OPTIONS} >= {"--time", "--gpu-mem", "--array", "--output"}


def test_an_empty_config_means_the_default_one_as_for_every_other_command() -> None:
    values, command = parse_submit_args(["--config", "", "--", "true"])
    assert (values, command) == ({"config": ""}, ["true"])


@pytest.mark.parametrize("value", ["-1", "0", "257", "99999999999999999999"])
@pytest.mark.parametrize("gpus", [[], ["--gpus", "2"]], ids=["default-gpus", "with-gpus"])
def test_a_node_count_out_of_range_is_refused_as_nodes_whether_or_not_gpus_is_given(
    value: str, gpus: list[str]
) -> None:
    with pytest.raises(UsageError) as refused:
        parse_submit_args([*gpus, "--nodes", value, "--", "true"])
    assert refused.value.message == f"--nodes needs an integer from 1 to 256, got {value!r}"


def test_a_node_count_within_range_is_taken() -> None:
    assert parse_submit_args(["--nodes", "256", "--", "true"])[0] == {"node_count": 256}


def test_every_integer_option_has_bounds_within_what_the_daemon_stores() -> None:
    assert {opt.flags[0] for opt in INT_OPTIONS} >= {"--nodes", "--priority", "--retries"}
    for opt in INT_OPTIONS:
        assert opt.bounds is not None
        assert -(2**63) <= opt.bounds[0] <= opt.bounds[1] < 2**63


@pytest.mark.parametrize("opt", INT_OPTIONS, ids=lambda opt: opt.flags[0])
@pytest.mark.parametrize("sign", ["", "-"], ids=["huge", "huge-negative"])
def test_an_integer_past_an_options_bounds_is_refused_naming_the_option_and_value(
    opt: Option, sign: str
) -> None:
    flag = opt.flags[0]
    assert opt.bounds is not None
    low, high = opt.bounds
    with pytest.raises(UsageError) as refused:
        parse_submit_args([flag, sign + HUGE, "--", "true"])
    assert refused.value.message == (
        f"{flag} needs an integer from {low} to {high}, got {sign + HUGE!r}"
    )
    assert refused.value.hint == f"e.g. {flag} 2"


@pytest.mark.parametrize(
    ("args", "values"),
    [
        (["--priority", str(-(2**63))], {"priority": -(2**63)}),
        (["--priority", str(2**63 - 1)], {"priority": 2**63 - 1}),
        (["--retries", "0"], {"retries": 0}),
    ],
)
def test_the_ends_of_an_options_bounds_are_taken(args: list[str], values: dict[str, int]) -> None:
    assert parse_submit_args([*args, "--", "true"])[0] == values


def test_retries_below_zero_are_refused_before_reaching_the_daemon() -> None:
    with pytest.raises(UsageError) as refused:
        parse_submit_args(["--retries", "-1", "--", "true"])
    assert refused.value.message == f"--retries needs an integer from 0 to {2**63 - 1}, got '-1'"


def test_a_gpu_memory_size_too_large_to_send_is_refused_naming_the_option() -> None:
    values, command = parse_submit_args(["--gpu-mem", "99999P", "--", "true"])
    with pytest.raises(UsageError) as refused:
        build_spec(values, command, DefaultsConfig(), 0.0)
    assert refused.value.message == "--gpu-mem needs a size under 8192P, got '99999P'"


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("--gpu", "--gpus"),
        ("--gpumem", "--gpu-mem"),
        ("--priorty", "--priority"),
        ("--nmae", "--name"),
        ("--arry", "--array"),
        ("--gpus-type", "--gpu-type"),
    ],
)
def test_an_unknown_option_suggests_the_known_one_it_looks_like(typo: str, meant: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_submit_args([typo, "1", "--", "true"])
    assert refused.value.message == f"unknown option {typo!r} for gpuq submit"
    assert refused.value.hint == f"did you mean {meant}? (see gpuq submit --help)"


@pytest.mark.parametrize("unknown", ["--lr", "--time-limit", "-x"])
def test_an_unknown_option_like_none_points_to_the_help_alone(unknown: str) -> None:
    with pytest.raises(UsageError) as refused:
        parse_submit_args([unknown, "1", "--", "true"])
    assert refused.value.hint == "see gpuq submit --help"


def test_a_typo_of_an_inline_value_option_is_suggested_too() -> None:
    with pytest.raises(UsageError) as refused:
        parse_submit_args(["--priorty=3", "--", "true"])
    assert refused.value.hint == "did you mean --priority? (see gpuq submit --help)"


def test_the_help_of_time_says_a_bare_number_is_minutes() -> None:
    (time_option,) = [opt for opt in SUBMIT_OPTIONS if opt.dest == "time"]
    assert "A bare number is minutes, as in Slurm (--time 10: 10 minutes)." in time_option.help
