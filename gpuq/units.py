"""Parse and format the values people type: sizes, durations, times, signals, arrays.

Everything here is pure (the clock is passed in as `now`) and raises
`UsageError` with the bad value in the message and the accepted forms in the
hint, so the CLI, the config loader and `#GPUQ` directives report the same
thing for the same mistake. The formats follow Slurm where Slurm has one.
"""

from __future__ import annotations

import math
import re
import signal

from gpuq.errors import UsageError

_BINARY_UNITS = {"": 1, "b": 1} | {
    unit: 1024 ** (power + 1)
    for power, letter in enumerate("kmgtp")
    for unit in (letter, letter + "ib")
}
_DECIMAL_UNITS = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15}
_SIZE_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)", re.IGNORECASE)
_SIZE_HINT = "give bytes (1024) or a number with a unit: 512M, 6G, 1.5GiB (binary), 6GB (decimal)"
_FORMAT_UNITS = ("K", "M", "G", "T", "P")

_DURATION_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?|\.\d+)([dhms])")
_SLURM_TIME_RE = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_DURATION_HINT = (
    "use 90s, 15m, 2h, 1d, 1h30m, 1.5h, or Slurm's MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"
)
_DURATION_HINT_WITH_UNIT = (
    "use 90s, 15m, 2h, 1d, 1h30m, 1.5h, or Slurm's MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS"
)

_BEGIN_HINT = (
    "use now+10m, +10m, now+600 (seconds), 14:00 (next occurrence), "
    "2026-11-21T14:00[:00] (local time) or @1700000000 (epoch seconds)"
)
_SIGNAL_HINT = "use NAME[@TIME] or NUMBER[@TIME], e.g. USR1@60, SIGUSR1@5m, 10@90s, TERM"
_ARRAY_HINT = "use 0-99, 0-99%4 (at most 4 at once), 1,3,5-7 or 0-15:4 (every 4th)"
MAX_ARRAY_TASKS = 10_000
"""Most tasks one `--array` may create."""
MAX_INT = 2**63 - 1
"""The largest integer a request may carry: SQLite stores signed 64 bits (from -MAX_INT - 1)."""
MAX_GPUS = 4096
"""The most GPUs a GPU range may name (a guard against typos, not a lab's size)."""
MAX_NODES = 256
"""The most servers one multi-node job may span (a guard against typos)."""
DEFAULT_SIGNAL_SECONDS = 60.0
"""Lead time of `--signal NAME` when no `@TIME` is given (as in Slurm)."""
MAX_DURATION = 1e12
"""Durations are shorter than this many seconds (some 31,700 years); a longer one is a typo."""
MAX_DURATION_TEXT = "1e12 seconds (some 31,700 years)"
"""`MAX_DURATION` as error messages say it."""


def parse_size(text: str) -> int:
    """Bytes from a size such as "6G", "6GiB", "6GB", "512M", "1.5G", "12k" or "1024".

    Units are case-insensitive. Single letters and the `iB` forms are binary
    (K = KiB = 1024, G = GiB = 1024**3, as `nvidia-smi` and PyTorch count GPU
    memory); the `B` forms are decimal (KB = 1000, GB = 10**9). A plain number
    is bytes.
    """
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise UsageError(f"invalid size {text!r}", _SIZE_HINT)
    number, unit = match.group(1), match.group(2).lower()
    multiplier = _BINARY_UNITS.get(unit) or _DECIMAL_UNITS.get(unit)
    if multiplier is None:
        raise UsageError(f"invalid size {text!r}: unknown unit {match.group(2)!r}", _SIZE_HINT)
    if multiplier == 1 and not float(number).is_integer():
        raise UsageError(f"invalid size {text!r}: a byte count must be whole", _SIZE_HINT)
    return round(float(number) * multiplier)


def format_size(n: int) -> str:
    """Human-readable binary size, e.g. "512", "6.0G", "512M" (one decimal below 10).

    The result parses back with `parse_size` to within the rounding shown.
    """
    if n < 0:
        return "-" + format_size(-n)
    if n < 1024:
        return str(n)
    value = n / 1024
    for unit in _FORMAT_UNITS[:-1]:
        shown = f"{value:.1f}" if value < 9.95 else f"{value:.0f}"
        if float(shown) < 1024:
            return shown + unit
        value /= 1024
    return f"{value:.1f}{_FORMAT_UNITS[-1]}" if value < 9.95 else f"{value:.0f}{_FORMAT_UNITS[-1]}"


def format_size_at_most(n: int) -> str:
    """`n` in `format_size`'s unit with one decimal, rounded down: a limit never shown above itself.

    "22.8G" for 22.8 GiB where `format_size` says "23G", which reads as room
    for a 23G request that the limit refuses.
    """
    if n < 1024:
        return str(max(n, 0))
    value = n / 1024
    rank = 0
    while value >= 1024 and rank < len(_FORMAT_UNITS) - 1:
        value /= 1024
        rank += 1
    shown = math.floor(value * 10 + 1e-6) / 10  # 22.79999... of 24G * 0.95 is 22.8
    return f"{shown:.1f}{_FORMAT_UNITS[rank]}"  # 22.79999... of 24G * 0.95 is 22.8


def parse_duration(text: str, *, bare_minutes: bool = True) -> float:
    """Seconds from a duration: "90s", "15m", "2h", "1d", "1h30m", "1.5h" or Slurm forms.

    Slurm forms are "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM" and
    "D-HH:MM:SS"; as in Slurm a bare number means minutes (`--time`). Where
    gpuq has no Slurm counterpart (`wait --timeout 30`, which `timeout(1)`
    would read as seconds), `bare_minutes=False` refuses a bare number
    rather than guess, and the hints of its errors leave "MM" out. Unit
    parts must come largest first and at most once. Durations must be
    positive and less than `MAX_DURATION`.
    """
    stripped = text.strip().lower()
    hint = _DURATION_HINT if bare_minutes else _DURATION_HINT_WITH_UNIT  # only forms it takes
    if not bare_minutes and re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", stripped):
        raise UsageError(
            f"duration {text!r} has no unit",
            f"write {stripped}s for seconds, {stripped}m for minutes",
        )
    if stripped and stripped[-1] in _DURATION_UNITS:
        seconds = _parse_unit_duration(text, stripped, hint)
    elif (match := _SLURM_TIME_RE.fullmatch(stripped)) is not None:
        seconds = _parse_slurm_duration(text, match, hint)
    else:
        raise UsageError(f"invalid duration {text!r}", hint)
    if seconds <= 0:
        raise UsageError(f"invalid duration {text!r}: must be positive", hint)
    if seconds >= MAX_DURATION:
        raise UsageError(f"invalid duration {text!r}: must be less than {MAX_DURATION_TEXT}", hint)
    return seconds


def _parse_unit_duration(text: str, stripped: str, hint: str) -> float:
    """Seconds from "1h30m"-style text (units d, h, m, s, largest first)."""
    order = list(_DURATION_UNITS)
    position = 0
    last_rank = -1
    seconds = 0.0
    for match in _DURATION_PART_RE.finditer(stripped):
        rank = order.index(match.group(2))
        if match.start() != position or rank <= last_rank:
            break
        seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position, last_rank = match.end(), rank
    if position != len(stripped):
        raise UsageError(f"invalid duration {text!r}", hint)
    return seconds


def _parse_slurm_duration(text: str, match: re.Match[str], hint: str) -> float:
    """Seconds from a matched Slurm time; minutes and seconds after the first field are < 60."""
    days_text, first, second, third = match.groups()
    if days_text is not None:
        days = int(days_text)
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
        if hours >= 24 or minutes >= 60 or seconds >= 60:
            raise UsageError(f"invalid duration {text!r}: field out of range", hint)
        return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    if third is not None:  # HH:MM:SS
        hours, minutes, seconds = int(first), int(second), int(third)
        out_of_range = minutes >= 60 or seconds >= 60
    else:  # MM or MM:SS; minutes may exceed 59 as in Slurm
        hours, minutes, seconds = 0, int(first), int(second or 0)
        out_of_range = seconds >= 60
    if out_of_range:
        raise UsageError(f"invalid duration {text!r}: field out of range", hint)
    return float((hours * 60 + minutes) * 60 + seconds)


def format_duration(seconds: float) -> str:
    """Compact duration with its two largest units: "45s", "12m05s", "1h02m", "2d03h".

    Fractions of a second are dropped; the result parses back with `parse_duration`.
    """
    if seconds < 0:
        return "-" + format_duration(-seconds)
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _parse_seconds(text: str, error: str, hint: str) -> float:
    """Seconds from a bare number (seconds, unlike `parse_duration`) or a duration."""
    stripped = text.strip()
    if re.fullmatch(r"\d+(?:\.\d*)?|\.\d+", stripped):
        if float(stripped) >= MAX_DURATION:
            raise UsageError(f"{error}: must be less than {MAX_DURATION_TEXT}", hint)
        return float(stripped)
    try:
        return parse_duration(stripped)
    except UsageError:
        raise UsageError(error, hint) from None


def parse_begin(text: str, now: float) -> float:
    """Epoch seconds at which a job may start, from the `--begin` forms.

    "now+10m", "+10m" and "now+600" (a bare number is seconds) are relative to
    `now`; "14:00" or "14:00:30" is the next time the local clock shows it
    (today, or tomorrow if that has passed); "2026-11-21T14:00[:00]" is local
    time unless it carries an offset; "@1700000000" is epoch seconds.
    """
    from datetime import datetime, time, timedelta  # only this parser needs the calendar

    stripped = text.strip()
    lowered = stripped.lower()
    if lowered == "now":
        return now
    if lowered.startswith(("now+", "+")):
        offset = lowered.removeprefix("now").removeprefix("+")
        return now + _parse_seconds(offset, f"invalid begin time {text!r}", _BEGIN_HINT)
    if re.fullmatch(r"@\d+(?:\.\d*)?", stripped):
        return float(stripped[1:])
    if (match := re.fullmatch(r"(\d{1,2}):(\d{2})(?::(\d{2}))?", stripped)) is not None:
        try:
            clock = time(int(match[1]), int(match[2]), int(match[3] or 0))
        except ValueError:
            raise UsageError(f"invalid begin time {text!r}", _BEGIN_HINT) from None
        today = datetime.fromtimestamp(now).date()
        candidate = datetime.combine(today, clock).timestamp()
        if candidate > now:
            return candidate
        return datetime.combine(today + timedelta(days=1), clock).timestamp()
    try:
        return datetime.fromisoformat(stripped).timestamp()
    except ValueError:
        raise UsageError(f"invalid begin time {text!r}", _BEGIN_HINT) from None


def parse_signal_spec(text: str) -> tuple[int, float]:
    """(signal number, seconds before the deadline) from "USR1@60", "SIGUSR1@5m", "10@90s", "TERM".

    Names are case-insensitive with or without "SIG"; the time is seconds
    (bare number) or a duration, and defaults to 60 s.
    """
    name, sep, when = text.strip().partition("@")
    seconds = (
        _parse_seconds(when, f"invalid signal time {when!r} in {text!r}", _SIGNAL_HINT)
        if sep
        else DEFAULT_SIGNAL_SECONDS
    )
    valid = signal.valid_signals()
    if name.isdigit():
        number = int(name)
        if number not in valid or number == 0:
            raise UsageError(f"unknown signal {name!r} in {text!r}", _SIGNAL_HINT)
        return number, seconds
    upper = name.upper()
    full = upper if upper.startswith("SIG") else "SIG" + upper
    member = signal.Signals.__members__.get(full)
    if member is None:
        raise UsageError(
            f"unknown signal {name!r} in {text!r}",
            "known signals include USR1, USR2, TERM, INT, HUP, QUIT, ALRM, CONT",
        )
    return int(member), seconds


def parse_gpus(text: str) -> tuple[int, int | None]:
    """`N` as (N, None), `MIN-MAX` as (MIN, MAX); UsageError otherwise.

    N is at most `MAX_INT` and a range's ends at most `MAX_GPUS`, so a typo
    is refused as `--gpus`, not as a field of the job spec.
    """
    low, dash, high = text.strip().partition("-")
    try:
        first = int(low)
        last = int(high) if dash else None
    except ValueError:
        raise UsageError(
            f"--gpus needs a count or a range, got {text!r}", "e.g. --gpus 2 or --gpus 1-8"
        ) from None
    if last is None and first > MAX_INT:
        raise UsageError(
            f"--gpus needs a count from 0 to {MAX_INT}, got {text!r}", "e.g. --gpus 2 or --gpus 1-8"
        )
    if last is not None and max(first, last) > MAX_GPUS:
        raise UsageError(
            f"--gpus: a range goes up to at most {MAX_GPUS} GPUs, got {text!r}",
            f"give a range such as --gpus 1-8 (MAX up to {MAX_GPUS})",
        )
    return first, last


def parse_array(text: str) -> tuple[tuple[int, ...], int | None]:
    """(task indices sorted and unique, most to run at once or None) from an `--array` spec.

    The spec is comma-separated items "N", "N-M" or "N-M:STEP", optionally
    followed by "%LIMIT"; at most `MAX_ARRAY_TASKS` tasks.
    """
    body, sep, limit_text = text.strip().partition("%")
    limit: int | None = None
    if sep:
        if not limit_text.isdigit() or not 0 < int(limit_text) <= MAX_INT:
            raise UsageError(f"invalid array limit {limit_text!r} in {text!r}", _ARRAY_HINT)
        limit = int(limit_text)
    indices: set[int] = set()
    for item in body.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+)(?::(\d+))?)?\s*", item)
        if match is None:
            raise UsageError(f"invalid array item {item!r} in {text!r}", _ARRAY_HINT)
        start = int(match.group(1))
        stop = int(match.group(2)) if match.group(2) is not None else start
        step = int(match.group(3)) if match.group(3) is not None else 1
        if stop > MAX_INT:
            raise UsageError(
                f"invalid array item {item.strip()!r} in {text!r}: indices go up to {MAX_INT}",
                _ARRAY_HINT,
            )
        if stop < start or step == 0:
            raise UsageError(f"invalid array range {item.strip()!r} in {text!r}", _ARRAY_HINT)
        if (stop - start) // step + 1 > MAX_ARRAY_TASKS:
            raise _too_many_tasks(text)
        indices.update(range(start, stop + 1, step))
        if len(indices) > MAX_ARRAY_TASKS:
            raise _too_many_tasks(text)
    return tuple(sorted(indices)), limit


def _too_many_tasks(text: str) -> UsageError:
    """The error for an array spec over `MAX_ARRAY_TASKS` tasks."""
    return UsageError(
        f"array {text!r} has more than {MAX_ARRAY_TASKS} tasks",
        "split it into several submissions, or use a step (0-99999:10)",
    )


def path_component(text: str) -> str:
    """`text` made safe as one file name: no "/", and never "", "." or ".."."""
    safe = text.replace("/", "_")
    return "_" * max(1, len(safe)) if safe in ("", ".", "..") else safe


def expand_output_pattern(
    pattern: str,
    job_id: int,
    array_index: int | None,
    array_id: int | None,
    name: str,
    user: str,
) -> str:
    """Fill a log file pattern: %j job id, %a array index, %A array id, %x name, %u user, %%.

    For a job outside an array, %a is "0" and %A is the job id, so one pattern
    serves both kinds of job. A name or user can never add a directory level
    or climb out of one: "/" in them becomes "_", and a name that is "." or
    ".." is written with "_" for each dot.
    """
    values = {
        "j": str(job_id),
        "a": str(array_index if array_index is not None else 0),
        "A": str(array_id if array_id is not None else job_id),
        "x": path_component(name),
        "u": path_component(user),
        "%": "%",
    }
    parts: list[str] = []
    position = 0
    while (percent := pattern.find("%", position)) != -1:
        parts.append(pattern[position:percent])
        key = pattern[percent + 1 : percent + 2]
        if key not in values:
            shown = "%" + key if key else "a trailing %"
            raise UsageError(
                f"unknown placeholder {shown} in output pattern {pattern!r}",
                "known: %j job id, %a array index, %A array id, %x job name, %u user, %% a %",
            )
        parts.append(values[key])
        position = percent + 2
    parts.append(pattern[position:])
    return "".join(parts)
