"""Write the database fixtures of released schemas, each with the code that shipped it.

A fixture is what a daemon of that version left on disk: the gpuq of the commit
in `FIXTURES` is checked out into a temporary git worktree and this script runs
again under it (PYTHONPATH=<worktree>), writing jobs through that version's own
`Store`. Next to `schema-<name>.db` it writes `schema-<name>.json`: what that
same old code read back, which tests/test_migrations.py expects today's code to
read from the upgraded database.

Fixtures are frozen: when a schema is released, add its commit to `FIXTURES`
and its hash to migrations.sha256, and generate only the new fixture. The
scenario below may use only the Store methods of every version in `FIXTURES`.

    .venv/bin/python tests/data/make_schema_db.py             # the fixtures not yet written
    .venv/bin/python tests/data/make_schema_db.py --force 0001_initial   # rewrite one

The commits, from `git log -- gpuq/daemon/migrations.py gpuq/daemon/store.py`:

- 0001_initial: 6f2a8f2, the parent of 234f932 (which added 0002), so the last
  commit whose newest migration was 0001.
- 0002_control_channel: 7ce7247, main when the fixtures were made; store.py and
  migrations.py were unchanged since 234f932 added the migration.
- 0003_hardening: f1e007d, the commit that added it (arrays with ids of their
  own, run-time accounting, retry times).
- 0004_live_scheduling: bf88576, the commit that added it (who asked for a
  suspend and why; a table for policies' state).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

FIXTURES: dict[str, str] = {
    "0001_initial": "6f2a8f28bb707caf9eb53b4403d1a80f9f46d80a",
    "0002_control_channel": "7ce72472c687bb0ad440dfe5f587a93a96bdf7f6",
    "0003_hardening": "f1e007d811a8029a266400fdf1701e49cb4476c6",
    "0004_live_scheduling": "bf88576f5485154073fbf86d29f22cd15e9340ed",
}
"""Each released schema (its newest migration) and the commit whose code writes its fixture."""

DATA = Path(__file__).resolve().parent
REPO = DATA.parents[1]
T0 = 1_790_000_000.0
"""Every time written is an offset from this, so a fixture's contents are deterministic."""
GIB = 1 << 30


def main() -> None:
    """Generate the fixtures named on the command line (all of `FIXTURES` by default)."""
    parser = argparse.ArgumentParser(description="Write the fixtures of released schemas.")
    parser.add_argument("schemas", nargs="*", help="schema names (default: all in FIXTURES)")
    parser.add_argument("--force", action="store_true", help="overwrite existing fixtures")
    parser.add_argument("--inside", metavar="COMMIT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        (schema,) = args.schemas
        write_fixture(schema, args.inside)
        return
    for schema in args.schemas or FIXTURES:
        if schema not in FIXTURES:
            parser.error(f"no commit for {schema!r}; add it to FIXTURES (known: {list(FIXTURES)})")
        if (DATA / f"schema-{schema}.db").exists() and not args.force:
            print(f"{schema}: kept (fixtures are frozen; --force rewrites it)")
            continue
        generate_from_commit(schema, FIXTURES[schema])


def generate_from_commit(schema: str, commit: str) -> None:
    """Check `commit` out into a temporary worktree and run this script under its gpuq."""
    with tempfile.TemporaryDirectory(prefix=f"gpuq-{schema}-") as parent:
        worktree = Path(parent) / "src"
        git = ["git", "-C", str(REPO), "worktree"]
        subprocess.run([*git, "add", "--detach", str(worktree), commit], check=True)
        try:
            env = {**os.environ, "PYTHONPATH": str(worktree)}
            argv = [sys.executable, __file__, "--inside", commit, schema]
            subprocess.run(argv, check=True, env=env, cwd=worktree)
        finally:
            subprocess.run([*git, "remove", "--force", str(worktree)], check=True)


def write_fixture(schema: str, commit: str) -> None:
    """Write schema-<schema>.db and .json with the gpuq importable now (the old one)."""
    import gpuq
    from gpuq.daemon.migrations import MIGRATIONS
    from gpuq.daemon.store import Store

    names = [name for name, _ in MIGRATIONS]
    if names[-1] != schema:
        sys.exit(f"{commit} writes schema {names[-1]}, not {schema}")
    print(f"{schema}: writing with {Path(gpuq.__file__).parent} at {commit}")
    db = DATA / f"schema-{schema}.db"
    db.unlink(missing_ok=True)
    store = Store.open(db)
    control_channel = "0002_control_channel" in names
    write_jobs(store, control_channel)
    expected = read_back(store, control_channel)
    store.close()
    compact(db)
    manifest = {"schema": schema, "commit": commit, "migrations": names, **expected}
    text = json.dumps(manifest, indent=1, sort_keys=True)
    (DATA / f"schema-{schema}.json").write_text(text + "\n")


def write_jobs(store: Any, control_channel: bool) -> None:
    """Submit and advance jobs the way that version's daemon did, through its Store.

    `store` is the old version's Store, whose methods may differ from today's.
    """
    from gpuq.daemon.store import NewJob
    from gpuq.models import Dependency, DependencyKind, JobSpec, JobState, SignalSpec

    # Before 0003_hardening an array was named after its first task (`array_first`)
    # and insert_jobs returned the jobs; since, it returns (jobs, the array's own id).
    named_after_first_task = "array_first" in {f.name for f in dataclasses.fields(NewJob)}

    def insert(specs: list[JobSpec], at: float, token: str, array: bool = False) -> list[Any]:
        news = []
        for i, spec in enumerate(specs):
            state, reason = (
                (JobState.HELD, "held at submission")
                if spec.hold
                else (JobState.QUEUED, "submitted")
            )
            extra = {"array_first": array and i == 0} if named_after_first_task else {}
            news.append(NewJob(spec, state, reason, **extra))
        if named_after_first_task:
            return list(store.insert_jobs(news, T0 + at, token))
        jobs, _ = store.insert_jobs(news, T0 + at, token, array=array)
        return list(jobs)

    def submit(spec: JobSpec, at: float, token: str) -> Any:
        return insert([spec], at, token)[0]

    def run(job: Any, at: float, attempt: int, gpus: tuple[str, ...], **changes: Any) -> Any:
        out = f"/home/alice/proj/{job.id}.out"
        job = store.transition(
            job,
            JobState.STARTING,
            "",
            T0 + at,
            start_time=T0 + at,
            attempts=attempt,
            gpu_uuids=gpus,
            node="gpu-box",
            stdout_path=out,
            stderr_path=out,
            **changes,
        )
        return store.transition(job, JobState.RUNNING, "", T0 + at + 1)

    train = JobSpec(
        command=("python", "train.py", "--lr", "0.1"),
        cwd="/home/alice/proj",
        env={"WANDB_MODE": "offline", "API_KEY": "not-a-real-key", "EMPTY": ""},
        name="train",
        user="alice",
        gpus=2,
        time_limit=3600.0,
        retries=1,
        output="%j.out",
        error="%j.err",
        signal=SignalSpec(10, 60.0),
        notify="notify-send done",
    )
    done = run(submit(train, 0, "tok-train"), 5, 1, ("GPU-aaaa", "GPU-bbbb"))
    done = store.transition(done, JobState.SUCCEEDED, "", T0 + 65, end_time=T0 + 65, exit_code=0)
    store.record_memory_peak("train", 12 * GIB, T0 + 65)

    crash = JobSpec(command=("bash", "-c", "exit 3"), cwd="/tmp", user="alice", name="crash")
    failed = run(submit(crash, 10, "tok-crash"), 11, 1, ("GPU-aaaa",))
    store.transition(failed, JobState.FAILED, "exit code 3", T0 + 13, end_time=T0 + 13, exit_code=3)

    sweep = JobSpec(command=("python", "sweep.py"), cwd="/home/alice/proj", name="sweep")
    tasks = [dataclasses.replace(sweep, array_index=i, array_parallel=2) for i in range(3)]
    first, *_ = insert(tasks, 20, "tok-sweep", array=True)
    run(first, 21, 1, ("GPU-bbbb",))

    after = (Dependency(done.id, DependencyKind.OK), Dependency(failed.id, DependencyKind.ANY))
    evaluate = JobSpec(
        command=("python", "eval.py"), cwd="/home/alice/proj", after=after, hold=True
    )
    held = submit(evaluate, 30, "tok-eval")
    store.set_priority(held, 5, T0 + 31)

    share = JobSpec(command=("python", "small.py"), cwd="/srv", gpu_mem=8 * GIB, begin=T0 + 40)
    run(submit(share, 40, "tok-share"), 41, 1, ("GPU-cccc",), gpu_mem_reserved=8 * GIB)

    resumable = JobSpec(command=("python", "resumable.py"), cwd="/srv", name="resumable")
    job = run(submit(resumable, 50, "tok-resumable"), 51, 1, ("GPU-dddd",))
    if control_channel:
        for step in range(3):
            sample = {"time": T0 + 52 + step, "step": step, "step_time": 0.5, "batch_size": 64}
            store.add_sample(job.id, 1, sample)
        store.record_suspend(job.id, 1, "checkpoint", T0 + 55)
    job = store.transition(job, JobState.SUSPENDING, "suspend requested", T0 + 55)
    job = store.transition(job, JobState.SUSPENDED, "checkpointed", T0 + 56)
    if control_channel:
        store.complete_suspend(job.id, 1, T0 + 56)
    job = store.transition(job, JobState.QUEUED, "resumed", T0 + 57)
    job = run(job, 58, 2, ("GPU-aaaa",))
    if control_channel:
        store.add_sample(job.id, 2, {"time": T0 + 60, "step": 3, "step_time": 0.4})
        store.record_suspend(job.id, 2, "park", T0 + 61)

    # A cancelled job that `gpuq clean` deleted: the id high-water mark outlives it.
    gone = submit(JobSpec(command=("true",), cwd="/"), 70, "tok-gone")
    store.transition(gone, JobState.CANCELLED, "cancelled by user", T0 + 71, end_time=T0 + 71)
    store.delete([gone.id])


def read_back(store: Any, control_channel: bool) -> dict[str, Any]:
    """What the old Store returns for everything written, as JSON."""
    jobs = store.jobs()
    expected: dict[str, Any] = {
        "max_job_id": store.max_job_id(),
        "jobs": [with_env(job.to_dict(), store.full_spec(job.id).env) for job in jobs],
        "events": {str(job.id): [e.to_dict() for e in store.events(job.id)] for job in jobs},
        "memory_peaks": {"train": store.memory_peak("train")},
        "tokens": {
            token: store.job_ids_for_token(token)
            for token in ("tok-train", "tok-crash", "tok-sweep", "tok-eval", "tok-share")
        },
    }
    if control_channel:
        expected["samples"] = {str(job.id): store.samples(job.id) for job in jobs}
        suspends = []
        for job in jobs:
            for attempt in range(1, job.attempts + 1):
                record = store.suspend_of(job.id, attempt)
                if record is not None:
                    mode, requested, completed = record.mode, record.requested, record.completed
                    suspends.append([job.id, attempt, mode, requested, completed])
        expected["suspends"] = suspends
    return expected


def with_env(job: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """The job's `--json` object with its environment, which the store keeps apart."""
    job["spec"]["env"] = dict(env)
    return job


def compact(db: Path) -> None:
    """Leave one self-contained file: no WAL or shared-memory side files, no free pages."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("VACUUM")
    conn.close()
    for side in ("-wal", "-shm", "-journal"):
        if Path(f"{db}{side}").exists():
            sys.exit(f"{db}{side} was left behind")


if __name__ == "__main__":
    main()
