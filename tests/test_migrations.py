"""Every released schema's database upgrades to today's schema and reads back intact.

tests/data/schema-<name>.db was written through the `Store` of the commit that
shipped migration <name> (tests/data/make_schema_db.py names the commits), and
schema-<name>.json holds what that old code read back. Each fixture is copied,
opened with today's `Store.open` (which applies every migration since) and read
through today's API.

The rule: a migration listed in tests/data/migrations.sha256 has shipped. It
must keep that hash (never edit a shipped migration; append a new one), the
listed migrations must stay the first entries of `MIGRATIONS`, and each has a
fixture of the schema it made. Migrations appended after the last listed one
are unreleased and need neither yet; once one lands on main, add both.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.daemon.migrations import MIGRATIONS, migrate
from gpuq.daemon.store import NewJob, Store
from gpuq.models import JobSpec, JobState

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("schema-*.db"))
NAMES = [name for name, _ in MIGRATIONS]


def shipped_hashes() -> dict[str, str]:
    """Migration name -> SHA-256 of its SQL, for every shipped migration, in order."""
    hashes = {}
    for line in (DATA / "migrations.sha256").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split()
            hashes[name] = digest
    return hashes


def schema_of(db: Path) -> str:
    """The newest migration of the schema a fixture was written with."""
    return db.stem.removeprefix("schema-")


def expected_of(db: Path) -> dict[str, Any]:
    """What the old code read back from the fixture it had just written."""
    data: dict[str, Any] = json.loads(db.with_suffix(".json").read_text())
    return data


def recorded_migrations(path: Path) -> dict[str, float]:
    """The rows of schema_migrations, read without writing to the file."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT name, applied_at FROM schema_migrations"))
    finally:
        conn.close()


def schema_objects(path: Path) -> set[tuple[str, str, str, str | None]]:
    """Every table and index with the SQL that made it."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return set(conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"))
    finally:
        conn.close()


def assert_kept(new: dict[str, Any], old: dict[str, Any], where: str) -> None:
    """Every field the old code read back reads back the same today (new fields are free)."""
    for key, value in old.items():
        assert key in new, f"{where}: {key} is gone"
        if isinstance(value, dict):
            assert_kept(new[key], value, f"{where}.{key}")
        else:
            assert new[key] == value, f"{where}.{key}: {new[key]!r} != {value!r}"


@pytest.fixture(params=FIXTURES, ids=schema_of)
def source(request: pytest.FixtureRequest) -> Path:
    """One released schema's database in tests/data."""
    path: Path = request.param
    return path


@pytest.fixture
def fixture_db(source: Path, tmp_path: Path) -> Path:
    """A copy of the fixture under test (the original stays untouched)."""
    copy = tmp_path / "gpuq.db"
    shutil.copyfile(source, copy)
    return copy


@pytest.fixture
def upgraded(fixture_db: Path) -> Iterator[Store]:
    """The fixture opened, and so upgraded, by today's Store."""
    store = Store.open(fixture_db)
    yield store
    store.close()


@pytest.fixture
def expected(source: Path) -> dict[str, Any]:
    """The old code's reading of the fixture under test."""
    return expected_of(source)


def test_no_shipped_migration_was_edited() -> None:
    shipped = shipped_hashes()
    assert NAMES[: len(shipped)] == list(shipped), (
        f"shipped migrations {list(shipped)} must stay the first entries of MIGRATIONS, "
        "in order: never edit a shipped migration; append a new one"
    )
    for name, sql in MIGRATIONS[: len(shipped)]:
        digest = hashlib.sha256(sql.encode()).hexdigest()
        assert digest == shipped[name], (
            f"migration {name} changed since it shipped (sha256 {digest}, shipped "
            f"{shipped[name]}): never edit a shipped migration; append a new one"
        )


def test_every_released_schema_has_a_fixture() -> None:
    shipped = list(shipped_hashes())
    fixtures = [schema_of(db) for db in FIXTURES]
    assert sorted(fixtures) == sorted(shipped), (
        "each shipped migration in tests/data/migrations.sha256 needs a fixture of its "
        "schema (tests/data/make_schema_db.py), and each fixture a shipped migration"
    )
    for db in FIXTURES:
        made_with = shipped[: shipped.index(schema_of(db)) + 1]
        assert sorted(recorded_migrations(db)) == sorted(made_with)
        assert expected_of(db)["migrations"] == made_with
        assert not Path(f"{db}-wal").exists() and not Path(f"{db}-shm").exists()


@pytest.mark.parametrize("db", FIXTURES, ids=schema_of)
def test_the_fixture_holds_what_daemons_write(db: Path) -> None:
    """A finished job, a job with environment, an array, a dependency, a cleaned id."""
    expected = expected_of(db)
    jobs = expected["jobs"]
    assert any(job["state"] == "succeeded" and job["exit_code"] == 0 for job in jobs)
    assert any(job["spec"]["env"] for job in jobs)
    arrays = [job["array_id"] for job in jobs if job["array_id"] is not None]
    assert any(arrays.count(array_id) >= 2 for array_id in arrays)
    assert any(job["spec"]["after"] for job in jobs)
    assert expected["max_job_id"] > max(job["id"] for job in jobs)
    if "0002_control_channel" in expected["migrations"]:
        assert any(expected["samples"].values())
        assert expected["suspends"]


def test_every_migration_is_recorded(fixture_db: Path, upgraded: Store) -> None:
    before = recorded_migrations(fixture_db)
    upgraded.close()
    after = recorded_migrations(fixture_db)
    assert sorted(after) == sorted(NAMES)
    assert {name: after[name] for name in before} == before  # old rows untouched


def test_the_upgraded_schema_is_a_fresh_one(
    fixture_db: Path, upgraded: Store, tmp_path: Path
) -> None:
    upgraded.close()
    Store.open(tmp_path / "fresh.db").close()
    assert schema_objects(fixture_db) == schema_objects(tmp_path / "fresh.db")


def test_jobs_read_back_as_written(upgraded: Store, expected: dict[str, Any]) -> None:
    old_jobs = expected["jobs"]
    assert [job.id for job in upgraded.jobs()] == [job["id"] for job in old_jobs]
    for old in old_jobs:
        job = upgraded.get(old["id"])
        assert job is not None
        assert job.spec.env == {}  # the environment stays in its own column
        new = job.to_dict(with_env=True)
        new["spec"]["env"] = dict(upgraded.full_spec(job.id).env)
        assert_kept(new, old, f"job {job.id}")
        assert job.state is JobState(old["state"])
    for state in JobState:
        in_state = [job["id"] for job in old_jobs if job["state"] == state.value]
        assert [job.id for job in upgraded.jobs([state])] == in_state


def test_arrays_keep_their_tasks(upgraded: Store, expected: dict[str, Any]) -> None:
    array_ids = {job["array_id"] for job in expected["jobs"]} - {None}
    assert array_ids
    for array_id in array_ids:
        tasks = [job for job in upgraded.jobs() if job.array_id == array_id]
        assert [t.spec.array_index for t in tasks] == list(range(len(tasks)))
        if "0003_hardening" in expected["migrations"]:
            assert array_id == tasks[0].id - 1  # an id of its own, just before its tasks'
            info = upgraded.array(array_id)
            assert info is not None and info.size == len(tasks)
            assert upgraded.array_task_ids(array_id) == [t.id for t in tasks]
        else:  # named after its first task, that id stays the task's
            assert array_id == tasks[0].id and upgraded.array(array_id) is None


def test_events_read_back_as_written(upgraded: Store, expected: dict[str, Any]) -> None:
    for job_id, old_events in expected["events"].items():
        assert [event.to_dict() for event in upgraded.events(int(job_id))] == old_events


def test_peaks_and_tokens_read_back(upgraded: Store, expected: dict[str, Any]) -> None:
    for name, peak in expected["memory_peaks"].items():
        assert upgraded.memory_peak(name) == peak
    for token, ids in expected["tokens"].items():
        assert upgraded.job_ids_for_token(token) == ids


def test_samples_and_suspends_read_back(upgraded: Store, expected: dict[str, Any]) -> None:
    if "samples" not in expected:  # the schema predates them: the new tables start empty
        expected = {**expected, "samples": {str(job["id"]): [] for job in expected["jobs"]}}
        expected["suspends"] = []
        jobs = upgraded.jobs()
        assert all(
            upgraded.suspend_of(j.id, a) is None for j in jobs for a in range(1, j.attempts + 1)
        )
    for job_id, samples in expected["samples"].items():
        assert upgraded.samples(int(job_id)) == samples
    for job_id, attempt, mode, requested, completed in expected["suspends"]:
        record = upgraded.suspend_of(job_id, attempt)
        assert record is not None
        assert (record.mode, record.requested, record.completed) == (mode, requested, completed)


def test_a_new_job_gets_an_id_above_every_old_one(
    upgraded: Store, expected: dict[str, Any]
) -> None:
    assert upgraded.max_job_id() == expected["max_job_id"]
    spec = JobSpec(command=("true",), cwd="/", env={"NEW": "1"})
    (job,), _ = upgraded.insert_jobs([NewJob(spec, JobState.QUEUED, "submitted")], 2e9, None)
    assert job.id == expected["max_job_id"] + 1
    assert upgraded.full_spec(job.id).env == {"NEW": "1"}
    upgraded.add_sample(job.id, 1, {"time": 2e9, "step": 1})
    assert upgraded.latest_sample(job.id) == {"time": 2e9, "step": 1}


def test_opening_again_changes_nothing(
    fixture_db: Path, upgraded: Store, expected: dict[str, Any]
) -> None:
    upgraded.close()
    recorded = recorded_migrations(fixture_db)
    store = Store.open(fixture_db)
    try:
        assert [job.id for job in store.jobs()] == [job["id"] for job in expected["jobs"]]
    finally:
        store.close()
    assert recorded_migrations(fixture_db) == recorded
    conn = sqlite3.connect(fixture_db, isolation_level=None)
    try:
        assert migrate(conn) == []
    finally:
        conn.close()
