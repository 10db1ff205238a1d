"""The queue as `gpuq top` shows it: rows, filtering, sorting and diffs.

Pure code over the documented job objects (docs/json-schema.md), with `now`
passed in, so it is tested without Textual. `QueueModel` holds every job the
daemon reported and answers, for a batch of changed jobs, which visible rows
to add, update or remove, so the table never redraws 5,000 rows for one
event.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

from gpuq import textsafe
from gpuq.errors import UsageError
from gpuq.units import format_duration, format_size

Job = dict[str, Any]

COLUMNS: Final = (
    "id",
    "state",
    "user",
    "name",
    "gpus",
    "memory",
    "node",
    "time",
    "priority",
    "reason",
)
"""Column keys of the queue table, in display order."""
NODE_COLUMN: Final = "node"
"""Shown only where jobs may run on several servers (see `gpuq.tui.app`)."""
COLUMN_TITLES: Final = {
    "id": "ID",
    "state": "STATE",
    "user": "USER",
    "name": "NAME",
    "gpus": "GPUS",
    "memory": "MEM",
    "node": "NODE",
    "time": "TIME",
    "priority": "PRIO",
    "reason": "REASON",
}
TIME_COLUMN: Final = COLUMNS.index("time")

STATE_ORDER: Final = (
    "running",
    "suspending",
    "starting",
    "suspended",
    "queued",
    "held",
    "failed",
    "lost",
    "cancelled",
    "succeeded",
)
"""The default sort: what is running first, then what waits, then what ended."""
FINISHED_STATES: Final = frozenset({"succeeded", "failed", "cancelled", "lost"})
PENDING_STATES: Final = frozenset({"queued", "held"})
ACTIVE_STATES: Final = frozenset({"starting", "running", "suspending", "suspended"})
_STATE_RANK: Final = {state: rank for rank, state in enumerate(STATE_ORDER)}


def job_name(job: Job) -> str:
    """The job's name, with its array index as `name[3]`."""
    name = str(job["name"])
    if job.get("array_index") is not None:
        name = f"{name}[{job['array_index']}]"
    return name


def gpus_cell(job: Job) -> str:
    """GPUs asked for: `2`, `1x6.0G`, `1xauto`, `1-8` (adaptive; `4/1-8` holding 4), or `-`."""
    if job["gpus"] == 0:
        return "-"
    if job.get("gpu_mem") is not None:
        return f"{job['gpus']}x{format_size(job['gpu_mem'])}"
    if job.get("spec", {}).get("gpu_mem_auto"):
        return f"{job['gpus']}xauto"
    if job.get("gpus_max") is not None:
        held = len(job.get("gpu_uuids") or ())
        asked = f"{job['gpus']}-{job['gpus_max']}"
        return f"{held}/{asked}" if held else asked
    return str(job["gpus"])


def memory_cell(job: Job) -> str:
    """GPU memory the job holds per GPU: its reservation, `whole`, or `-`."""
    if job["gpus"] == 0:
        return "-"
    reserved = job.get("gpu_mem_reserved")
    if reserved is not None:
        return format_size(reserved)
    if job.get("gpu_uuids") and job["state"] in ACTIVE_STATES:
        return "whole"
    return "-"


def node_cell(job: Job) -> str:
    """The server the job runs or ran on; empty while it waits (even after an earlier attempt)."""
    if job["state"] in PENDING_STATES:
        return ""
    return str(job.get("node") or "")


def node_fact(job: Job) -> str:
    """The detail view's server: the current attempt's, or `- (last ran on gpu2)` while waiting."""
    node = str(job.get("node") or "")
    if not node:
        return "-"
    return node_cell(job) or f"- (last ran on {node})"


def elapsed(job: Job, now: float) -> float:
    """Seconds run for a started job, seconds waited for a pending one, else 0."""
    if job.get("start_time") is not None:
        end = float(job.get("end_time") or now)
        return max(0.0, end - float(job["start_time"]))
    if job.get("end_time") is not None:
        return 0.0
    return max(0.0, now - float(job["submit_time"]))


def time_cell(job: Job, now: float) -> str:
    """The TIME column: run time, or waiting time for a pending job."""
    if job.get("start_time") is None and job.get("end_time") is not None:
        return "-"
    return format_duration(elapsed(job, now))


def row_cells(job: Job, now: float) -> tuple[str, ...]:
    """One queue-table row, in `COLUMNS` order.

    The user's text (user, name, reason) is shown through `textsafe.visible`,
    so a control character cannot reach the terminal or break the row.
    """
    return (
        str(job["id"]),
        str(job["state"]),
        textsafe.visible(str(job["user"])),
        textsafe.visible(job_name(job)),
        gpus_cell(job),
        memory_cell(job),
        textsafe.visible(node_cell(job)),
        time_cell(job, now),
        str(job["priority"]),
        textsafe.visible(str(job.get("reason") or "")),
    )


SortKey = Callable[[Job, float], Any]
SORT_KEYS: Final[dict[str, SortKey]] = {
    "id": lambda job, now: job["id"],
    "state": lambda job, now: (_STATE_RANK.get(job["state"], 99), -job["priority"], job["id"]),
    "user": lambda job, now: (job["user"], job["id"]),
    "name": lambda job, now: (job_name(job), job["id"]),
    "gpus": lambda job, now: (job["gpus"], job.get("gpu_mem") or 0, job["id"]),
    "memory": lambda job, now: (job.get("gpu_mem_reserved") or job.get("gpu_mem") or 0, job["id"]),
    "node": lambda job, now: (node_cell(job), job["id"]),
    "time": lambda job, now: (elapsed(job, now), job["id"]),
    "priority": lambda job, now: (job["priority"], job["id"]),
    "reason": lambda job, now: (str(job.get("reason") or ""), job["id"]),
}
"""How each column sorts; ties break on the job id so the order is stable."""


@dataclass(frozen=True, slots=True)
class JobFilter:
    """A parsed filter: `state:running,queued user:ana name:bert gpu:1 node:gpu2 words`.

    Each `key:value` term must hold; a value list separated by commas means
    any of them. Bare words must each appear in the id, name, user, state or
    reason (case-insensitive).
    """

    states: frozenset[str] = frozenset()
    users: frozenset[str] = frozenset()
    names: tuple[str, ...] = ()
    gpus: frozenset[int] = frozenset()
    words: tuple[str, ...] = ()
    text: str = ""
    nodes: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: str) -> JobFilter:
        """Parse filter text; raises UsageError naming the known keys."""
        try:
            terms = shlex.split(text)
        except ValueError as exc:
            raise UsageError(f"filter: {exc}", "close the quote") from exc
        states: set[str] = set()
        users: set[str] = set()
        names: list[str] = []
        gpus: set[int] = set()
        nodes: set[str] = set()
        words: list[str] = []
        for term in terms:
            key, sep, value = term.partition(":")
            if not sep:
                words.append(term.lower())
                continue
            values = [v for v in value.split(",") if v]
            if key in ("state", "s"):
                unknown = sorted(set(values) - set(STATE_ORDER))
                if unknown:
                    raise UsageError(
                        f"filter: unknown state {', '.join(unknown)}",
                        f"states: {', '.join(STATE_ORDER)}",
                    )
                states.update(values)
            elif key in ("user", "u"):
                users.update(values)
            elif key in ("name", "n"):
                names.extend(v.lower() for v in values)
            elif key in ("gpus", "gpu", "g"):
                if not all(v.isdigit() for v in values):
                    raise UsageError(f"filter: gpus takes numbers, got {value!r}", "e.g. gpus:1,2")
                gpus.update(int(v) for v in values)
            elif key == "node":
                nodes.update(values)
            else:
                raise UsageError(
                    f"filter: unknown key {key!r}", "keys: state:, user:, name:, gpus:, node:"
                )
        return cls(
            frozenset(states),
            frozenset(users),
            tuple(names),
            frozenset(gpus),
            tuple(words),
            text,
            frozenset(nodes),
        )

    def matches(self, job: Job) -> bool:
        """Whether `job` passes every term of this filter."""
        if self.states and job["state"] not in self.states:
            return False
        if self.users and job["user"] not in self.users:
            return False
        if self.gpus and job["gpus"] not in self.gpus:
            return False
        if self.nodes and node_cell(job) not in self.nodes:
            return False
        if self.names:
            name = job_name(job).lower()
            if not any(n in name for n in self.names):
                return False
        if self.words:
            haystack = " ".join(
                (str(job["id"]), job_name(job), job["user"], job["state"], job.get("reason") or "")
            ).lower()
            if not all(word in haystack for word in self.words):
                return False
        return True


@dataclass(frozen=True, slots=True)
class RowChanges:
    """What the table must do after a batch of job updates."""

    added: tuple[int, ...] = ()
    updated: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    reorder: bool = False

    @property
    def empty(self) -> bool:
        """True when nothing visible changed."""
        return not (self.added or self.updated or self.removed or self.reorder)


@dataclass
class QueueModel:
    """Every known job, and which of them the table shows, in what order.

    The set of shown ids and each job's sort key are cached and updated per
    changed job, so a burst of events costs in proportion to the burst, not
    to the thousands of jobs held.
    """

    jobs: dict[int, Job] = field(default_factory=dict)
    job_filter: JobFilter = field(default_factory=JobFilter)
    show_finished: bool = False
    sort_column: str = "state"
    reverse: bool = False
    _keys: dict[int, Any] = field(default_factory=dict, repr=False)
    _keys_column: str = field(default="", repr=False)
    _visible: set[int] = field(default_factory=set, repr=False)
    _visible_view: tuple[JobFilter, bool] | None = field(default=None, repr=False)
    _counts: dict[str, int] | None = field(default=None, repr=False)
    nodes: set[str] = field(default_factory=set)
    """Every server a known job ran on (it only grows): several mean a NODE column."""

    def is_visible(self, job: Job) -> bool:
        """Whether the table shows `job` under the current filter."""
        state = job["state"]
        if not self.show_finished and state in FINISHED_STATES:
            if state not in self.job_filter.states:
                return False
        return self.job_filter.matches(job)

    def _visible_ids(self) -> set[int]:
        view = (self.job_filter, self.show_finished)
        if self._visible_view != view:
            self._visible = {i for i, job in self.jobs.items() if self.is_visible(job)}
            self._visible_view = view
        return self._visible

    def visible_ids(self, now: float) -> list[int]:
        """Ids of the shown jobs, sorted."""
        ids = self._visible_ids()
        if self.sort_column == "time":
            return sorted(ids, key=lambda i: self.sort_key(i, now), reverse=self.reverse)
        keys, make, jobs = self._column_keys(), SORT_KEYS[self.sort_column], self.jobs
        for job_id in [i for i in ids if i not in keys]:
            keys[job_id] = make(jobs[job_id], now)
        return sorted(ids, key=keys.__getitem__, reverse=self.reverse)

    def _column_keys(self) -> dict[int, Any]:
        if self._keys_column != self.sort_column:
            self._keys.clear()
            self._keys_column = self.sort_column
        return self._keys

    def sort_key(self, job_id: int, now: float) -> Any:
        """The sort key of one job under the current sort column."""
        if self.sort_column == "time":  # changes with `now`: never cached
            return SORT_KEYS["time"](self.jobs[job_id], now)
        self._column_keys()
        key = self._keys.get(job_id)
        if key is None:
            key = self._keys[job_id] = SORT_KEYS[self.sort_column](self.jobs[job_id], now)
        return key

    def replace(self, jobs: Iterable[Job]) -> None:
        """Forget everything and take this full job list."""
        self.jobs = {job["id"]: job for job in jobs}
        self.nodes = {str(job.get("node") or "") for job in self.jobs.values()} - {""}
        self._keys.clear()
        self._counts = None
        self._visible_view = None

    def apply(self, jobs: Iterable[Job], now: float) -> RowChanges:
        """Merge changed job objects and say which visible rows change.

        `reorder` is set when a shown job's sort key moved or rows were added,
        so the table only re-sorts when the order can have changed.
        """
        visible = self._visible_ids()
        added: list[int] = []
        updated: list[int] = []
        removed: list[int] = []
        reorder = False
        for job in jobs:
            job_id = job["id"]
            old = self.jobs.get(job_id)
            old_key = self.sort_key(job_id, now) if old is not None else None
            self.jobs[job_id] = job
            if job.get("node"):
                self.nodes.add(str(job["node"]))
            self._count(old, -1)
            self._count(job, 1)
            self._keys.pop(job_id, None)
            was = job_id in visible
            now_visible = self.is_visible(job)
            if old is not None and was and now_visible:
                if row_cells(old, now) != row_cells(job, now):
                    updated.append(job_id)
                    reorder = reorder or old_key != self.sort_key(job_id, now)
            elif now_visible:
                visible.add(job_id)
                added.append(job_id)
                reorder = True
            elif was:
                visible.discard(job_id)
                removed.append(job_id)
        return RowChanges(tuple(added), tuple(updated), tuple(removed), reorder)

    def sync(self, jobs: list[Job], now: float) -> RowChanges:
        """Take a full job list after a (re)connect: apply it and drop the jobs it lacks."""
        visible = self._visible_ids()
        fresh = {job["id"] for job in jobs}
        gone = [job_id for job_id in self.jobs if job_id not in fresh]
        for job_id in gone:
            self._count(self.jobs.pop(job_id), -1)
            self._keys.pop(job_id, None)
        removed = tuple(job_id for job_id in gone if job_id in visible)
        visible.difference_update(gone)
        changes = self.apply(jobs, now)
        return RowChanges(
            changes.added, changes.updated, changes.removed + removed, changes.reorder
        )

    def counts(self) -> dict[str, int]:
        """Jobs per state, over every known job (kept up to date per changed job)."""
        if self._counts is None:
            counts: dict[str, int] = {}
            for job in self.jobs.values():
                counts[job["state"]] = counts.get(job["state"], 0) + 1
            self._counts = counts
        return {state: n for state, n in self._counts.items() if n}

    def _count(self, job: Job | None, delta: int) -> None:
        if job is not None and self._counts is not None:
            state = job["state"]
            self._counts[state] = self._counts.get(state, 0) + delta


def summary_line(counts: dict[str, int]) -> str:
    """`3 running · 12 queued · 1 held` in lifecycle order, zero counts left out."""
    parts = [f"{counts[state]} {state}" for state in STATE_ORDER if counts.get(state)]
    return " · ".join(parts) or "no jobs"


def ago(stamp: float | None, now: float) -> str:
    """`3h02m ago`, or `-` for no time; relative so it reads the same in any time zone."""
    if stamp is None:
        return "-"
    return f"{format_duration(max(0.0, now - stamp))} ago"


def job_facts(job: Job, now: float, sizing: str | None = None) -> list[tuple[str, str]]:
    """The detail view's (label, value) lines for a job's spec and state.

    `sizing` is why a running adaptive job has the GPUs it has (`show`'s note), shown after them.

    Values are shown through `textsafe.visible`: commands, paths and reasons are user text.
    """
    spec = job.get("spec", {})
    gpus = gpus_cell(job)
    if job.get("gpu_uuids"):
        gpus += " on " + ", ".join(job["gpu_uuids"])
    exit_text = "-" if job.get("exit_code") is None else str(job["exit_code"])
    if job.get("signal"):
        exit_text += f" ({job['signal']})"
    facts = [
        ("State", f"{job['state']}" + (f" ({job['reason']})" if job.get("reason") else "")),
        ("Command", shlex.join(spec.get("command", []))),
        ("Directory", str(spec.get("cwd", ""))),
        ("User", str(job["user"])),
        ("GPUs", gpus),
        *([("Sizing", sizing)] if sizing else []),
        ("Memory", memory_cell(job)),
        ("Node", node_fact(job)),
        ("Priority", str(job["priority"])),
        ("Submitted", ago(job.get("submit_time"), now)),
        ("Started", ago(job.get("start_time"), now)),
        ("Ended", ago(job.get("end_time"), now)),
        ("Run time", time_cell(job, now)),
        ("Exit code", exit_text),
        ("Attempts", f"{job.get('attempts', 0)} (retries allowed: {spec.get('retries', 0)})"),
        ("Output", job.get("stdout") or "-"),
    ]
    if spec.get("after"):
        facts.append(("After", ", ".join(spec["after"])))
    if spec.get("time_limit") is not None:
        facts.append(("Time limit", format_duration(spec["time_limit"])))
    if job.get("array_index") is not None:
        facts.append(("Array", f"task {job['array_index']} of array {job['array_id']}"))
    return [(label, textsafe.visible(value)) for label, value in facts]
