"""Named, ordered schema migrations, each applied once and recorded.

Append new migrations to `MIGRATIONS`; never edit one that has shipped. Each
runs in its own transaction together with its row in `schema_migrations`, so
a crash leaves the database at a clean version.

A migration ships when it lands on main. Then list the SHA-256 of its SQL in
tests/data/migrations.sha256 and add a database written by a commit whose
newest migration it is (tests/data/make_schema_db.py). tests/test_migrations.py
fails if a listed migration changes or lacks a fixture, and upgrades every
fixture with today's code. Migrations after the last listed one are unreleased.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Final

MIGRATIONS: Final[tuple[tuple[str, str], ...]] = (
    (
        "0001_initial",
        """
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            state TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT '',
            priority INTEGER NOT NULL DEFAULT 0,
            name TEXT NOT NULL DEFAULT '',
            user TEXT NOT NULL DEFAULT '',
            spec TEXT NOT NULL,
            env TEXT NOT NULL DEFAULT '{}',
            submit_time REAL NOT NULL,
            start_time REAL,
            end_time REAL,
            exit_code INTEGER,
            signal TEXT,
            gpu_uuids TEXT NOT NULL DEFAULT '',
            gpu_mem_reserved INTEGER,
            node TEXT NOT NULL DEFAULT '',
            attempts INTEGER NOT NULL DEFAULT 0,
            array_id INTEGER,
            stdout_path TEXT NOT NULL DEFAULT '',
            stderr_path TEXT NOT NULL DEFAULT '',
            token TEXT
        );
        CREATE INDEX jobs_by_state ON jobs(state);
        CREATE INDEX jobs_by_token ON jobs(token) WHERE token IS NOT NULL;
        CREATE TABLE job_events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id INTEGER NOT NULL,
            time REAL NOT NULL,
            state TEXT NOT NULL,
            reason TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX job_events_by_job ON job_events(job_id);
        CREATE TABLE memory_peaks (
            name TEXT PRIMARY KEY,
            peak INTEGER NOT NULL,
            updated REAL NOT NULL
        );
        """,
    ),
    (
        "0002_control_channel",
        """
        CREATE TABLE profiles (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            time REAL NOT NULL,
            sample TEXT NOT NULL
        );
        CREATE INDEX profiles_by_job ON profiles(job_id, time);
        CREATE TABLE job_suspends (
            job_id INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            mode TEXT NOT NULL,
            requested REAL NOT NULL,
            completed REAL,
            PRIMARY KEY (job_id, attempt)
        );
        """,
    ),
    (
        "0003_hardening",
        """
        ALTER TABLE jobs ADD COLUMN retry_at REAL;
        ALTER TABLE jobs ADD COLUMN first_start_time REAL;
        ALTER TABLE jobs ADD COLUMN run_seconds REAL NOT NULL DEFAULT 0;
        ALTER TABLE jobs ADD COLUMN running_since REAL;
        UPDATE jobs SET first_start_time = start_time WHERE start_time IS NOT NULL;
        UPDATE jobs SET run_seconds = max(0, end_time - start_time)
            WHERE start_time IS NOT NULL AND end_time IS NOT NULL;
        UPDATE jobs SET running_since = start_time
            WHERE state IN ('running', 'suspending') AND start_time IS NOT NULL;
        CREATE INDEX jobs_by_array ON jobs(array_id) WHERE array_id IS NOT NULL;
        CREATE TABLE arrays (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL DEFAULT '',
            submit_time REAL NOT NULL,
            size INTEGER NOT NULL
        );
        CREATE TABLE meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        """,
    ),
    (
        "0004_live_scheduling",
        """
        ALTER TABLE job_suspends ADD COLUMN purpose TEXT NOT NULL DEFAULT 'user';
        ALTER TABLE job_suspends ADD COLUMN reason TEXT NOT NULL DEFAULT '';
        CREATE TABLE policy_state (
            policy TEXT PRIMARY KEY,
            state TEXT NOT NULL,
            saved REAL NOT NULL
        );
        """,
    ),
    (
        "0005_lab",
        """
        CREATE TABLE audit (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            time REAL NOT NULL,
            uid INTEGER NOT NULL,
            user TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL DEFAULT '',
            ok INTEGER NOT NULL,
            message TEXT NOT NULL DEFAULT ''
        );
        CREATE INDEX audit_by_time ON audit(time);
        CREATE TABLE user_usage (
            user TEXT PRIMARY KEY,
            usage REAL NOT NULL,
            updated REAL NOT NULL
        );
        """,
    ),
    (
        "0006_array_env",
        """
        ALTER TABLE arrays ADD COLUMN env TEXT
        """,
    ),
)


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply every migration not yet recorded; returns the names applied."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at REAL)"
    )
    done = {row[0] for row in conn.execute("SELECT name FROM schema_migrations")}
    applied = []
    for name, sql in MIGRATIONS:
        if name in done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in sql.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)",
                (name, time.time()),
            )
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        applied.append(name)
    return applied
