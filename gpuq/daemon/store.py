"""SQLite state: the daemon's only durable memory.

One connection, owned by the daemon, in WAL mode with `synchronous=NORMAL`
(a killed process loses nothing committed). Every job transition is written
together with its event row in one transaction, before the daemon acts on it
or acknowledges it. Job ids come from AUTOINCREMENT, so an id is never
reused, not even after `gpuq clean` deletes the newest jobs.

The environment of a job is kept in its own column and loaded only when the
job is launched, so the daemon's in-memory view of 10,000 jobs stays small.
An array's tasks share theirs, kept once with the array (a task's own column
then holds `""`): 10,000 tasks from a shell with a megabyte of variables
would otherwise write ten gigabytes.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuq.daemon.migrations import migrate
from gpuq.errors import StateError
from gpuq.models import Job, JobEvent, JobSpec, JobState

_ARRAY_ENV = ""
"""A task's env column when its environment is its array's (`arrays.env`)."""
MAX_SAMPLES_PER_JOB = 2000
"""Metrics samples kept per job; older ones are thinned beyond this."""
_COLUMNS = (
    "id, state, reason, spec, submit_time, start_time, end_time, exit_code, signal, "
    "gpu_uuids, gpu_mem_reserved, node, attempts, array_id, stdout_path, stderr_path, "
    "retry_at, first_start_time, run_seconds, running_since"
)
_MUTABLE = frozenset(
    {
        "reason",
        "start_time",
        "end_time",
        "exit_code",
        "signal",
        "gpu_uuids",
        "gpu_mem_reserved",
        "node",
        "attempts",
        "stdout_path",
        "stderr_path",
        "retry_at",
        "first_start_time",
        "run_seconds",
        "running_since",
    }
)


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to insert: its spec (with environment), state and reason."""

    spec: JobSpec
    state: JobState
    reason: str


@dataclass(frozen=True, slots=True)
class ArrayInfo:
    """An array: its own id (from the same sequence as job ids), name, time and size."""

    id: int
    name: str
    submit_time: float
    size: int


@dataclass(frozen=True, slots=True)
class SuspendRecord:
    """The latest suspend asked of one attempt: its mode, when, and when it was done.

    `purpose` is who asked: "user" (`gpuq suspend`), or "policy" for a
    preemption by the scheduler, whose job is queued again once its
    checkpoint is saved; `reason` is the policy's reason.
    """

    mode: str
    requested: float
    completed: float | None
    purpose: str = "user"
    reason: str = ""


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One request to a lab daemon: who (kernel-given uid), when, what, on what, and the outcome."""

    id: int
    time: float
    uid: int
    user: str
    action: str
    target: str
    ok: bool
    message: str

    def to_dict(self) -> dict[str, Any]:
        """The documented `gpuq audit --json` object."""
        return {
            "id": self.id,
            "time": self.time,
            "uid": self.uid,
            "user": self.user,
            "action": self.action,
            "target": self.target,
            "ok": self.ok,
            "message": self.message,
        }


class Store:
    """Typed access to jobs, their events, metrics samples, suspends and memory peaks."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path, id_floor: int = 0, now: float = 0.0) -> Store:
        """Open (creating and migrating) the database at `path`, and prove it is writable.

        Ids continue above `id_floor` (the high-water mark kept outside the
        database), so a database made afresh never hands out an old id.
        """
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StateError(f"cannot open the state database {path}: {exc}") from exc
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            migrate(conn)
            store = cls(conn, path)
            with store._transaction():
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('opened', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                    (repr(now),),
                )
                store._raise_id_floor(id_floor)
        except (sqlite3.Error, StateError) as exc:
            conn.close()
            text = str(exc)
            read_only = _read_only(path)
            if read_only or "readonly" in text or "read-only" in text:
                raise StateError(
                    f"the state database {path} is read-only ({read_only or text})",
                    "make it and its directory writable by you (ls -l; chmod u+w), "
                    "or remount the filesystem read-write, or choose another state_dir",
                ) from None
            if "disk is full" in text or "disk I/O error" in text:
                raise StateError(
                    f"cannot open the state database {path}: {text}",
                    f"free some space where it lives (df -h {path.parent}), then start again; "
                    "the queue is intact, do not move the database away",
                ) from None
            raise StateError(
                f"cannot open the state database {path}: {text}",
                "check the state directory (gpuq doctor); "
                "move a corrupt file aside to start afresh",
            ) from None
        return store

    def close(self) -> None:
        """Close the connection (checkpointing the WAL)."""
        self._conn.close()

    # -- writes ---------------------------------------------------------

    def insert_jobs(
        self, jobs: Sequence[NewJob], now: float, token: str | None, *, array: bool = False
    ) -> tuple[list[Job], int | None]:
        """Insert jobs in one transaction; returns them and the array's id (with `array`).

        An array gets an id of its own from the job id sequence, before its
        tasks, so `gpuq cancel 32` can name the whole array while each task
        keeps its own id.
        """
        out: list[Job] = []
        with self._transaction():
            array_id: int | None = None
            shared = jobs[0].spec.env if array and jobs else None
            if array:
                array_id = self._reserve_id()
                self._conn.execute(
                    "INSERT INTO arrays (id, name, submit_time, size, env) VALUES (?,?,?,?,?)",
                    (
                        array_id,
                        jobs[0].spec.name if jobs else "",
                        now,
                        len(jobs),
                        None if shared is None else json.dumps(dict(shared)),
                    ),
                )
            env_json, env_of = "", None
            for new in jobs:
                lean = replace(new.spec, env={})
                spec_json = _encode_spec(lean)[0]
                if new.spec.env is shared:
                    env_json, env_of = _ARRAY_ENV, None  # the array's, stored once
                elif new.spec.env is not env_of:
                    env_of, env_json = new.spec.env, json.dumps(dict(new.spec.env))
                cur = self._conn.execute(
                    "INSERT INTO jobs (state, reason, priority, name, user, spec, env, "
                    "submit_time, array_id, token) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        new.state.value,
                        new.reason,
                        new.spec.priority,
                        new.spec.name,
                        new.spec.user,
                        spec_json,
                        env_json,
                        now,
                        array_id,
                        token,
                    ),
                )
                job_id = int(cur.lastrowid or 0)
                self._event(job_id, now, new.state, new.reason)
                out.append(
                    Job(job_id, lean, new.state, new.reason, submit_time=now, array_id=array_id)
                )
        return out, array_id

    def transition(self, job: Job, state: JobState, reason: str, now: float, **changes: Any) -> Job:
        """Move `job` to `state`, recording the reason; returns the new Job."""
        bad = set(changes) - _MUTABLE
        if bad:  # pragma: no cover - a programming error
            raise ValueError(f"not mutable: {bad}")
        updated = replace(job, state=state, reason=reason, **changes)
        with self._transaction():
            self._conn.execute(
                "UPDATE jobs SET state=?, reason=?, start_time=?, end_time=?, exit_code=?, "
                "signal=?, gpu_uuids=?, gpu_mem_reserved=?, node=?, attempts=?, "
                "stdout_path=?, stderr_path=?, retry_at=?, first_start_time=?, "
                "run_seconds=?, running_since=? WHERE id=?",
                (
                    state.value,
                    reason,
                    updated.start_time,
                    updated.end_time,
                    updated.exit_code,
                    updated.signal,
                    ",".join(updated.gpu_uuids),
                    updated.gpu_mem_reserved,
                    updated.node,
                    updated.attempts,
                    updated.stdout_path,
                    updated.stderr_path,
                    updated.retry_at,
                    updated.first_start_time,
                    updated.run_seconds,
                    updated.running_since,
                    job.id,
                ),
            )
            self._event(job.id, now, state, reason)
        return updated

    def set_priority(self, job: Job, priority: int, now: float) -> Job:
        """Change a job's priority (its spec is otherwise immutable)."""
        spec = replace(job.spec, priority=priority)
        full = self.full_spec(job.id)
        spec_json, _ = _encode_spec(replace(full, priority=priority))
        with self._transaction():
            self._conn.execute(
                "UPDATE jobs SET priority=?, spec=? WHERE id=?", (priority, spec_json, job.id)
            )
            self._event(job.id, now, job.state, f"priority set to {priority}")
        return replace(job, spec=spec)

    def delete(self, ids: Iterable[int]) -> None:
        """Remove finished jobs and their history."""
        rows = [(i,) for i in ids]
        with self._transaction():
            self._conn.executemany("DELETE FROM job_events WHERE job_id=?", rows)
            self._conn.executemany("DELETE FROM profiles WHERE job_id=?", rows)
            self._conn.executemany("DELETE FROM job_suspends WHERE job_id=?", rows)
            self._conn.executemany("DELETE FROM jobs WHERE id=?", rows)
            self._conn.execute(
                "DELETE FROM arrays WHERE id NOT IN "
                "(SELECT array_id FROM jobs WHERE array_id IS NOT NULL)"
            )

    def record_memory_peak(self, name: str, peak: int, now: float) -> None:
        """Remember the largest GPU memory a job called `name` used."""
        with self._transaction():
            self._conn.execute(
                "INSERT INTO memory_peaks (name, peak, updated) VALUES (?,?,?) "
                "ON CONFLICT(name) DO UPDATE SET peak=max(peak, excluded.peak), "
                "updated=excluded.updated",
                (name, peak, now),
            )

    def add_sample(
        self, job_id: int, attempt: int, sample: dict[str, Any], keep: int = MAX_SAMPLES_PER_JOB
    ) -> None:
        """Store one metrics sample of a job; past `keep`, thin the oldest ones.

        Thinning drops every other one of the oldest `keep` samples, so a long
        job keeps its whole history at a resolution that falls with age.
        """
        with self._transaction():
            self._conn.execute(
                "INSERT INTO profiles (job_id, attempt, time, sample) VALUES (?,?,?,?)",
                (job_id, attempt, float(sample["time"]), json.dumps(sample)),
            )
            (count,) = self._conn.execute(
                "SELECT count(*) FROM profiles WHERE job_id=?", (job_id,)
            ).fetchone()
            if count > keep:
                oldest = self._conn.execute(
                    "SELECT id FROM profiles WHERE job_id=? ORDER BY time, id LIMIT ?",
                    (job_id, keep),
                ).fetchall()
                self._conn.executemany("DELETE FROM profiles WHERE id=?", oldest[1::2])

    def samples(
        self, job_id: int, since: float = 0.0, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """A job's metrics samples taken after `since`, oldest first (the newest `limit`)."""
        newest = "SELECT id, time, sample FROM profiles WHERE job_id=? AND time>? "
        newest += "ORDER BY time DESC, id DESC LIMIT ?"
        rows = self._conn.execute(
            f"SELECT sample FROM ({newest}) ORDER BY time, id",
            (job_id, since, -1 if limit is None else limit),
        )
        return [json.loads(row[0]) for row in rows]

    def most_gpus_sampled(self, job_id: int) -> int:
        """The most GPUs the job held while its runner sent samples (0 if none said)."""
        (most,) = self._conn.execute(
            "SELECT max(json_extract(sample, '$.gpus')) FROM profiles WHERE job_id=?", (job_id,)
        ).fetchone()
        return int(most or 0)

    def latest_sample(self, job_id: int) -> dict[str, Any] | None:
        """The newest metrics sample of a job, or None."""
        found = self.samples(job_id, limit=1)
        return found[0] if found else None

    def record_suspend(
        self,
        job_id: int,
        attempt: int,
        mode: str,
        now: float,
        purpose: str = "user",
        reason: str = "",
    ) -> None:
        """Remember that a suspend of `mode` was asked of this attempt (intent first)."""
        with self._transaction():
            self._conn.execute(
                "INSERT INTO job_suspends (job_id, attempt, mode, requested, purpose, reason) "
                "VALUES (?,?,?,?,?,?) "
                "ON CONFLICT(job_id, attempt) DO UPDATE SET mode=excluded.mode, "
                "requested=excluded.requested, completed=NULL, purpose=excluded.purpose, "
                "reason=excluded.reason",
                (job_id, attempt, mode, now, purpose, reason),
            )

    def complete_suspend(self, job_id: int, attempt: int, now: float) -> None:
        """Mark the attempt's suspend as done (the job reached `suspended`)."""
        with self._transaction():
            self._conn.execute(
                "UPDATE job_suspends SET completed=? WHERE job_id=? AND attempt=?",
                (now, job_id, attempt),
            )

    def suspend_of(self, job_id: int, attempt: int) -> SuspendRecord | None:
        """The latest suspend asked of this attempt of a job, or None."""
        row = self._conn.execute(
            "SELECT mode, requested, completed, purpose, reason FROM job_suspends "
            "WHERE job_id=? AND attempt=?",
            (job_id, attempt),
        ).fetchone()
        if row is None:
            return None
        return SuspendRecord(str(row[0]), float(row[1]), row[2], str(row[3]), str(row[4]))

    def checkpoint_restarts(self, job_id: int, before_attempt: int) -> int:
        """How many attempts before `before_attempt` ended in a checkpoint suspend."""
        (count,) = self._conn.execute(
            "SELECT count(*) FROM job_suspends WHERE job_id=? AND attempt<? "
            "AND mode='checkpoint' AND completed IS NOT NULL",
            (job_id, before_attempt),
        ).fetchone()
        return int(count)

    # -- reads ----------------------------------------------------------

    def save_policy_state(self, policy: str, saved: str, now: float) -> None:
        """Keep the memory of `policy` (its spec, options included), JSON text."""
        with self._transaction():
            self._conn.execute(
                "INSERT INTO policy_state (policy, state, saved) VALUES (?,?,?) "
                "ON CONFLICT(policy) DO UPDATE SET state=excluded.state, saved=excluded.saved",
                (policy, saved, now),
            )

    def add_audit(
        self, now: float, uid: int, user: str, action: str, target: str, ok: bool, message: str
    ) -> None:
        """Record one request in the audit log (committed before the reply is sent)."""
        with self._transaction():
            self._conn.execute(
                "INSERT INTO audit (time, uid, user, action, target, ok, message) "
                "VALUES (?,?,?,?,?,?,?)",
                (now, uid, user, action, target[:500], int(ok), message[:2000]),
            )

    def audit(
        self, *, uid: int | None = None, since: float | None = None, limit: int = 1000
    ) -> list[AuditEntry]:
        """The newest `limit` audit entries (of `uid` only, and from `since`), oldest first."""
        where: list[str] = []
        args: list[float] = []
        if uid is not None:
            where.append("uid=?")
            args.append(uid)
        if since is not None:
            where.append("time>=?")
            args.append(since)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        rows = self._conn.execute(
            "SELECT id, time, uid, user, action, target, ok, message FROM audit "  # noqa: S608
            f"{clause} ORDER BY id DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [
            AuditEntry(int(r[0]), float(r[1]), int(r[2]), r[3], r[4], r[5], bool(r[6]), r[7])
            for r in reversed(rows)
        ]

    def prune_audit(self, before: float) -> int:
        """Drop audit entries older than `before`; returns how many."""
        with self._transaction():
            cur = self._conn.execute("DELETE FROM audit WHERE time < ?", (before,))
        return int(cur.rowcount)

    def user_usage(self) -> dict[str, tuple[float, float]]:
        """Each user's decayed GPU-seconds of usage and when it was last updated."""
        rows = self._conn.execute("SELECT user, usage, updated FROM user_usage").fetchall()
        return {str(r[0]): (float(r[1]), float(r[2])) for r in rows}

    def save_user_usage(self, usage: dict[str, float], now: float) -> None:
        """Replace the users' decayed usage, all as of `now`, in one transaction."""
        with self._transaction():
            self._conn.execute("DELETE FROM user_usage")
            self._conn.executemany(
                "INSERT INTO user_usage (user, usage, updated) VALUES (?,?,?)",
                [(user, value, now) for user, value in sorted(usage.items())],
            )

    def policy_state(self, policy: str) -> str | None:
        """The memory last kept for `policy`, or None."""
        row = self._conn.execute(
            "SELECT state FROM policy_state WHERE policy=?", (policy,)
        ).fetchone()
        return None if row is None else str(row[0])

    def memory_peak(self, name: str) -> int | None:
        """The learned memory peak of jobs called `name`, if any ran."""
        row = self._conn.execute("SELECT peak FROM memory_peaks WHERE name=?", (name,)).fetchone()
        return None if row is None else int(row[0])

    def job_ids_for_token(self, token: str) -> list[int]:
        """Ids already created by a submission with this idempotency token."""
        rows = self._conn.execute("SELECT id FROM jobs WHERE token=? ORDER BY id", (token,))
        return [int(r[0]) for r in rows]

    def get(self, job_id: int) -> Job | None:
        """One job (without its environment), or None."""
        row = self._conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if row is None else _row_to_job(row)

    def full_spec(self, job_id: int) -> JobSpec:
        """A job's spec including its environment (for launching)."""
        row = self._conn.execute(
            "SELECT jobs.spec, jobs.env, arrays.env FROM jobs "
            "LEFT JOIN arrays ON arrays.id = jobs.array_id WHERE jobs.id=?",
            (job_id,),
        ).fetchone()
        if row is None:
            raise StateError(f"job {job_id} vanished from the database")
        data = json.loads(row[0])
        data["env"] = json.loads(row[2] if row[1] == _ARRAY_ENV and row[2] is not None else row[1])
        return JobSpec.from_dict(data)

    def events(self, job_id: int) -> list[JobEvent]:
        """A job's transitions in order."""
        rows = self._conn.execute(
            "SELECT time, state, reason FROM job_events WHERE job_id=? ORDER BY id", (job_id,)
        )
        return [JobEvent(job_id, t, JobState(s), r) for t, s, r in rows]

    def jobs(self, states: Iterable[JobState] | None = None, ids: Sequence[int] = ()) -> list[Job]:
        """Jobs in id order, filtered by state and/or id."""
        sql = f"SELECT {_COLUMNS} FROM jobs"
        args: list[object] = []
        where = []
        if states is not None:
            names = [s.value for s in states]
            where.append(f"state IN ({','.join('?' * len(names))})")
            args.extend(names)
        if ids:
            where.append(f"id IN ({','.join('?' * len(ids))})")
            args.extend(ids)
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [_row_to_job(r) for r in self._conn.execute(sql + " ORDER BY id", args)]

    def max_job_id(self) -> int:
        """The highest id ever handed out, to a job or an array (AUTOINCREMENT's mark)."""
        row = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name='jobs'").fetchone()
        return 0 if row is None else int(row[0])

    def array(self, array_id: int) -> ArrayInfo | None:
        """The array with this id, or None (also for arrays made before arrays had ids)."""
        row = self._conn.execute(
            "SELECT id, name, submit_time, size FROM arrays WHERE id=?", (array_id,)
        ).fetchone()
        return None if row is None else ArrayInfo(int(row[0]), str(row[1]), row[2], int(row[3]))

    def array_task_ids(self, array_id: int) -> list[int]:
        """The ids of an array's tasks, in order."""
        rows = self._conn.execute("SELECT id FROM jobs WHERE array_id=? ORDER BY id", (array_id,))
        return [int(row[0]) for row in rows]

    def array_state(self, array_id: int) -> JobState | None:
        """An array as one dependency: queued until every task ended, then succeeded or failed.

        None if no array has this id.
        """
        if self.array(array_id) is None:
            return None
        terminal = [s.value for s in JobState if s.is_terminal]
        marks = ",".join("?" * len(terminal))
        total, ended, succeeded = self._conn.execute(
            f"SELECT count(*), sum(state IN ({marks})), sum(state='succeeded') "
            "FROM jobs WHERE array_id=?",
            (*terminal, array_id),
        ).fetchone()
        if not total or ended < total:
            return JobState.QUEUED
        return JobState.SUCCEEDED if succeeded == total else JobState.FAILED

    def _reserve_id(self) -> int:
        """Take the next id of the job sequence without a job row (for an array)."""
        self._raise_id_floor(0)
        self._conn.execute("UPDATE sqlite_sequence SET seq = seq + 1 WHERE name='jobs'")
        return self.max_job_id()

    def _raise_id_floor(self, floor: int) -> None:
        """Make the next id at least `floor` + 1 (inside a transaction)."""
        if self._conn.execute("SELECT 1 FROM sqlite_sequence WHERE name='jobs'").fetchone():
            self._conn.execute(
                "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name='jobs'", (floor,)
            )
        else:
            self._conn.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', "
                "max(?, (SELECT coalesce(max(id), 0) FROM jobs)))",
                (floor,),
            )

    # -- internals ------------------------------------------------------

    def _event(self, job_id: int, now: float, state: JobState, reason: str) -> None:
        self._conn.execute(
            "INSERT INTO job_events (job_id, time, state, reason) VALUES (?,?,?,?)",
            (job_id, now, state.value, reason),
        )

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)


def _read_only(path: Path) -> str:
    """Why the database at `path` cannot be written, if the filesystem or modes say so."""
    try:
        if os.statvfs(path.parent).f_flag & os.ST_RDONLY:
            return "its filesystem is mounted read-only"
    except OSError:
        return ""
    for target in (path, path.parent):
        if target.exists() and not os.access(target, os.W_OK):
            return f"{target} is not writable"
    return ""


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as error:
                raise StateError(f"cannot write state: {error}", "is the disk full?") from error
        else:
            self._conn.execute("ROLLBACK")


def _encode_spec(spec: JobSpec) -> tuple[str, str]:
    data = spec.to_dict()
    env = data.pop("env")
    return json.dumps(data), json.dumps(env)


def _row_to_job(row: Sequence[Any]) -> Job:
    (
        job_id,
        state,
        reason,
        spec_json,
        submit_time,
        start_time,
        end_time,
        exit_code,
        signal,
        gpu_uuids,
        gpu_mem_reserved,
        node,
        attempts,
        array_id,
        stdout_path,
        stderr_path,
        retry_at,
        first_start_time,
        run_seconds,
        running_since,
    ) = row
    return Job(
        id=job_id,
        spec=JobSpec.from_dict(json.loads(spec_json)),
        state=JobState(state),
        reason=reason,
        submit_time=submit_time,
        start_time=start_time,
        end_time=end_time,
        exit_code=exit_code,
        signal=signal,
        gpu_uuids=tuple(u for u in gpu_uuids.split(",") if u),
        gpu_mem_reserved=gpu_mem_reserved,
        node=node,
        attempts=attempts,
        array_id=array_id,
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        retry_at=retry_at,
        first_start_time=first_start_time,
        run_seconds=float(run_seconds or 0.0),
        running_since=running_since,
    )
