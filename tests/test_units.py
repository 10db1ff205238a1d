"""Parsing and formatting of sizes, durations, begin times, signals, arrays and log patterns."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta

import pytest

from gpuq.errors import UsageError
from gpuq.units import (
    MAX_ARRAY_TASKS,
    MAX_INT,
    expand_output_pattern,
    format_duration,
    format_size,
    format_size_at_most,
    parse_array,
    parse_begin,
    parse_duration,
    parse_gpus,
    parse_signal_spec,
    parse_size,
)

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("0", 0),
        ("12k", 12 * KiB),
        ("12K", 12 * KiB),
        ("12KiB", 12 * KiB),
        ("512M", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("6G", 6 * GiB),
        ("6g", 6 * GiB),
        ("6GiB", 6 * GiB),
        ("6 G", 6 * GiB),
        (" 6G ", 6 * GiB),
        ("1.5G", 3 * GiB // 2),
        (".5G", GiB // 2),
        ("2T", 2 * TiB),
        ("100B", 100),
        ("6GB", 6 * 10**9),
        ("6gb", 6 * 10**9),
        ("500MB", 500 * 10**6),
        ("1KB", 1000),
        ("1.0", 1),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "  ", "G", "-1G", "6X", "6GG", "6 G B", "1.5", "six", "1e9", "6G6", "0x10", "1bib", "6Gi"],
)
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert repr(text) in info.value.message
    assert info.value.hint is not None and "512M" in info.value.hint


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (0, "0"),
        (512, "512"),
        (1023, "1023"),
        (KiB, "1.0K"),
        (10 * KiB, "10K"),
        (512 * MiB, "512M"),
        (6 * GiB, "6.0G"),
        (3 * GiB // 2, "1.5G"),
        (15 * GiB, "15G"),
        (MiB - 1, "1.0M"),  # rounds up into the next unit instead of "1024K"
        (80 * GiB, "80G"),
        (3 * TiB, "3.0T"),
        (-2 * GiB, "-2.0G"),
    ],
)
def test_format_size(size: int, expected: str) -> None:
    assert format_size(size) == expected


@pytest.mark.parametrize("size", [1, 1000, 6 * GiB, 40 * GiB, 512 * MiB, 1536 * MiB])
def test_format_size_parses_back_within_rounding(size: int) -> None:
    assert parse_size(format_size(size)) == pytest.approx(size, rel=0.05)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        # Slurm forms; a bare number is minutes.
        ("90", 90 * 60),
        ("1:30", 90),
        ("90:00", 90 * 60),
        ("1:00:00", 3600),
        ("01:02:03", 3723),
        ("1-2", 26 * 3600),
        ("1-02:03", 26 * 3600 + 180),
        ("1-02:03:04", 26 * 3600 + 184),
        ("0-0:0:1", 1),
        # Unit forms.
        ("90s", 90),
        ("15m", 900),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1d2h3m4s", 93784),
        ("1.5h", 5400),
        ("0.5s", 0.5),
        ("2H", 7200),
        (" 2h ", 7200),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        "0",
        "0s",
        "00:00",
        "-5m",
        "5x",
        "h",
        "30m1h",  # units must come largest first
        "1h1h",
        "1:60",
        "1:60:00",
        "1-24",
        "1:2:3:4",
        "1.5:00",
        "soon",
        "11574075d",  # 1e12 seconds and more are a typo
        pytest.param("9" * 400 + "s", id="400-digit-seconds"),  # beyond a float: infinity
    ],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_duration(text)
    assert repr(text) in info.value.message
    assert info.value.hint is not None and "1h30m" in info.value.hint


@pytest.mark.parametrize("text", ["30", " 90 ", "1.5"])
def test_a_bare_number_is_minutes_only_where_slurm_says_so(text: str) -> None:
    """`--time 30` is Slurm's 30 minutes; `wait --timeout 30` would be read as seconds: refused."""
    if "." not in text:  # Slurm's MM is whole minutes
        assert parse_duration(text) == float(text) * 60
    with pytest.raises(UsageError) as caught:
        parse_duration(text, bare_minutes=False)
    number = text.strip()
    assert caught.value.message == f"duration {text!r} has no unit"
    assert caught.value.hint == f"write {number}s for seconds, {number}m for minutes"
    assert parse_duration(f"{number}s", bare_minutes=False) == float(number)
    assert parse_duration("1:30", bare_minutes=False) == 90  # Slurm's MM:SS says what it is


@pytest.mark.parametrize("text", ["10x", "1:60", "1-24", "0s", "11574075d"])
def test_the_hint_offers_slurms_bare_minutes_only_where_they_are_taken(text: str) -> None:
    with pytest.raises(UsageError) as where_taken:
        parse_duration(text)
    assert where_taken.value.hint is not None and "Slurm's MM, MM:SS," in where_taken.value.hint
    with pytest.raises(UsageError) as where_refused:
        parse_duration(text, bare_minutes=False)
    assert where_refused.value.hint == (
        "use 90s, 15m, 2h, 1d, 1h30m, 1.5h, or Slurm's MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"
    )


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, "0s"),
        (0.9, "0s"),
        (45, "45s"),
        (59.99, "59s"),
        (60, "1m00s"),
        (725, "12m05s"),
        (3720, "1h02m"),
        (86399, "23h59m"),
        (86400, "1d00h"),
        (183600, "2d03h"),
        (-45, "-45s"),
    ],
)
def test_format_duration(seconds: float, expected: str) -> None:
    assert format_duration(seconds) == expected


@pytest.mark.parametrize("seconds", [45, 725, 3720, 183600])
def test_format_duration_parses_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


NOW = datetime(2026, 11, 21, 12, 30, 0).timestamp()  # local time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("now+10m", NOW + 600),
        ("+10m", NOW + 600),
        ("now+600", NOW + 600),  # a bare number after + is seconds, as in Slurm
        ("NOW+1h30m", NOW + 5400),
        ("@1700000000", 1_700_000_000),
        ("@1700000000.5", 1_700_000_000.5),
        ("2026-11-21T14:00", datetime(2026, 11, 21, 14, 0).timestamp()),
        ("2026-11-21T14:00:30", datetime(2026, 11, 21, 14, 0, 30).timestamp()),
        ("2026-11-21T14:00:00+00:00", 1795269600),
        ("2026-11-20T08:00", datetime(2026, 11, 20, 8, 0).timestamp()),  # past: allowed
        ("14:00", datetime(2026, 11, 21, 14, 0).timestamp()),  # later today
        ("9:15", datetime(2026, 11, 22, 9, 15).timestamp()),  # passed: tomorrow
        ("12:30", datetime(2026, 11, 22, 12, 30).timestamp()),  # exactly now: tomorrow
        ("23:59:59", datetime(2026, 11, 21, 23, 59, 59).timestamp()),
    ],
)
def test_parse_begin(text: str, expected: float) -> None:
    assert parse_begin(text, NOW) == expected


def test_parse_begin_tomorrow_is_one_calendar_day_later() -> None:
    today_nine = datetime.fromtimestamp(NOW).replace(hour=9, minute=0)
    assert parse_begin("09:00", NOW) == (today_nine + timedelta(days=1)).timestamp()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "later",
        "now+",
        "now+soon",
        "now-5m",
        "+-5m",
        "25:00",
        "12:60",
        "@",
        "@abc",
        "2026-13-01",
    ],
)
def test_parse_begin_rejects(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_begin(text, NOW)
    assert repr(text) in info.value.message
    assert info.value.hint is not None and "now+10m" in info.value.hint


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("USR1@60", (signal.SIGUSR1, 60.0)),
        ("SIGUSR1@60", (signal.SIGUSR1, 60.0)),
        ("usr2@120", (signal.SIGUSR2, 120.0)),
        ("10@90s", (10, 90.0)),
        ("TERM", (signal.SIGTERM, 60.0)),
        ("SIGINT", (signal.SIGINT, 60.0)),
        ("USR1@5m", (signal.SIGUSR1, 300.0)),
        ("USR1@0", (signal.SIGUSR1, 0.0)),
        ("HUP@1.5", (signal.SIGHUP, 1.5)),
    ],
)
def test_parse_signal_spec(text: str, expected: tuple[int, float]) -> None:
    assert parse_signal_spec(text) == expected


@pytest.mark.parametrize("text", ["FOO", "SIGFOO@60", "0", "999@60", "", "@60"])
def test_parse_signal_spec_rejects_unknown_signals_listing_valid_names(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_signal_spec(text)
    assert "unknown signal" in info.value.message
    assert info.value.hint is not None and "USR1" in info.value.hint


@pytest.mark.parametrize(
    "text",
    [
        "USR1@",
        "USR1@soon",
        "USR1@-5",
        "USR1@nan",
        "USR1@1000000000000",
        pytest.param("USR1@" + "9" * 400, id="USR1@400-digits"),
    ],
)
def test_parse_signal_spec_rejects_bad_times(text: str) -> None:
    with pytest.raises(UsageError, match="invalid signal time"):
        parse_signal_spec(text)


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-99", tuple(range(100)), None),
        ("0-99%4", tuple(range(100)), 4),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("7,1,3,1", (1, 3, 7), None),  # sorted, duplicates dropped
        ("0-15:4", (0, 4, 8, 12), None),
        ("0-14:4", (0, 4, 8, 12), None),
        ("5", (5,), None),
        ("1-3,2-4%2", (1, 2, 3, 4), 2),
        (f"0-{MAX_ARRAY_TASKS - 1}", tuple(range(MAX_ARRAY_TASKS)), None),
        ("0-99999:10", tuple(range(0, 100000, 10)), None),
    ],
)
def test_parse_array(text: str, indices: tuple[int, ...], limit: int | None) -> None:
    assert parse_array(text) == (indices, limit)


@pytest.mark.parametrize(
    "text",
    ["", "%4", "a-b", "5-1", "0-9:0", "0-9%0", "0-9%", "0-9%x", "1,,2", "-1", "1-", "0-9:-1"],
)
def test_parse_array_rejects(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_array(text)
    assert repr(text) in info.value.message
    assert info.value.hint is not None and "0-99%4" in info.value.hint


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{MAX_INT + 1}", f"indices go up to {MAX_INT}"),
        (f"0-{MAX_INT + 1}:{MAX_INT}", f"indices go up to {MAX_INT}"),
        (f"0-3%{MAX_INT + 1}", f"invalid array limit '{MAX_INT + 1}'"),
    ],
)
def test_parse_array_refuses_an_index_or_limit_too_large_to_send_saying_which(
    text: str, message: str
) -> None:
    with pytest.raises(UsageError) as info:
        parse_array(text)
    assert repr(text) in info.value.message and message in info.value.message


def test_parse_array_takes_the_largest_index_a_request_carries() -> None:
    assert parse_array(f"{MAX_INT}") == ((MAX_INT,), None)


@pytest.mark.parametrize(
    "text", [f"0-{MAX_ARRAY_TASKS}", "0-999999999999", f"0-{MAX_ARRAY_TASKS - 1},{MAX_ARRAY_TASKS}"]
)
def test_parse_array_refuses_more_than_the_task_limit(text: str) -> None:
    with pytest.raises(UsageError, match="more than 10000 tasks"):
        parse_array(text)


@pytest.mark.parametrize(
    ("pattern", "array_index", "array_id", "expected"),
    [
        ("gpuq-%j.out", None, None, "gpuq-42.out"),
        ("%x-%j.log", None, None, "train-42.log"),
        ("%u/%x.log", None, None, "alice/train.log"),
        ("%A_%a.out", 3, 40, "40_3.out"),
        ("%A_%a.out", None, None, "42_0.out"),  # not an array: %A is the job, %a is 0
        ("100%%-%j", None, None, "100%-42"),
        ("%%j", None, None, "%j"),
        ("plain.log", None, None, "plain.log"),
        ("", None, None, ""),
    ],
)
def test_expand_output_pattern(
    pattern: str, array_index: int | None, array_id: int | None, expected: str
) -> None:
    assert expand_output_pattern(pattern, 42, array_index, array_id, "train", "alice") == expected


@pytest.mark.parametrize(
    ("pattern", "shown"), [("out-%z.log", "%z"), ("%j%", "a trailing %"), ("%J", "%J")]
)
def test_expand_output_pattern_rejects_unknown_placeholders(pattern: str, shown: str) -> None:
    with pytest.raises(UsageError) as info:
        expand_output_pattern(pattern, 1, None, None, "n", "u")
    assert shown in info.value.message
    assert info.value.hint is not None and "%j job id" in info.value.hint


@pytest.mark.parametrize(
    ("text", "expected"), [("2", (2, None)), ("0", (0, None)), ("1-8", (1, 8)), (" 2-4 ", (2, 4))]
)
def test_parse_gpus_reads_a_count_or_a_range(text: str, expected: tuple[int, int | None]) -> None:
    assert parse_gpus(text) == expected


@pytest.mark.parametrize("text", ["", "x", "1-", "-3", "1-2-3", "1.5"])
def test_parse_gpus_refuses_anything_else(text: str) -> None:
    with pytest.raises(UsageError, match="--gpus needs a count or a range"):
        parse_gpus(text)


def test_parse_gpus_refuses_a_count_too_large_to_send_naming_it() -> None:
    with pytest.raises(UsageError) as info:
        parse_gpus("99999999999999999999")
    assert info.value.message == (
        f"--gpus needs a count from 0 to {MAX_INT}, got '99999999999999999999'"
    )
    assert parse_gpus(str(MAX_INT)) == (MAX_INT, None)


@pytest.mark.parametrize("text", ["1-4097", "1-99999999999999999999", "99999999999999999999-2"])
def test_parse_gpus_refuses_a_range_past_the_most_gpus_a_range_may_name(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_gpus(text)
    assert info.value.message == f"--gpus: a range goes up to at most 4096 GPUs, got {text!r}"
    assert parse_gpus("1-4096") == (1, 4096)


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (int(24 * 1024**3 * 0.95), "22.8G"),  # format_size says 23G
        (int(22.99 * 1024**3), "22.9G"),
        (24 * 1024**3, "24.0G"),
        (512 * 1024**2, "512.0M"),
        (1000, "1000"),
    ],
)
def test_a_limit_is_shown_rounded_down_never_above_itself(n: int, shown: str) -> None:
    assert format_size_at_most(n) == shown
    assert parse_size(shown) <= n + 1  # within the float error of n's own making
