"""Lab mode: a job runs as its owner, and its files belong to the owner.

A root daemon hands the shim the job's account (`LaunchSpec.run_as`). The
job then has exactly the owner's uid, gid and groups, their HOME, USER and
LOGNAME, and no capabilities; the shim opens its outputs with the owner's
permissions (a link to root's file, another user's file, a directory the
owner cannot write and a working directory the owner cannot enter are all
refused with the reason); default logs and checkpoints live in directories
private to the owner; and a job's control socket hears its owner but no
other user. The tests with real users need root (`tests/lab_users.py`) and
skip without it; the record's encoding and the readers are tested anyway.
"""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpuq.control import CONTROL_VERSION
from gpuq.daemon import jobfiles
from gpuq.daemon.control import ControlHub
from gpuq.daemon.executor import Executor, LaunchSpec, lab_owner, run_as_for
from gpuq.daemon.identity import Account, UnknownAccount
from gpuq.daemon.outputs import (
    USERS_DIR,
    OutputError,
    open_for_reading,
    tail_offset,
    user_log_dir,
)
from gpuq.daemon.spawner import Spawned, SpawnerClient
from tests.lab_users import LabUser, as_user, lab_users, shared_dir, user_dir

ALICE, BOB = "gpuq-alice", "gpuq-bob"
ACCOUNT = {"uid": 1001, "gid": 1001, "groups": [1001, 27], "name": "ann", "home": "/home/ann"}


def launch_spec(**changes: Any) -> LaunchSpec:
    """A launch record for `true`, with `changes`."""
    fields: dict[str, Any] = {
        "command": ("true",),
        "cwd": "/",
        "env": {},
        "stdout": "/dev/null",
        "stderr": "/dev/null",
        "time_limit": None,
        "signal": None,
        "kill_grace": 2.0,
        **changes,
    }
    return LaunchSpec(**fields)


# -- the launch record (no root needed) ------------------------------------------------


def test_run_as_survives_the_round_trip_through_the_launch_record() -> None:
    account = Account.from_dict(ACCOUNT)
    spec = launch_spec(run_as=account)
    decoded = LaunchSpec.from_dict(spec.to_dict())
    assert decoded == spec
    assert decoded.run_as == account
    assert spec.to_dict()["run_as"] == ACCOUNT


def test_a_launch_record_without_run_as_runs_as_the_daemon_s_user() -> None:
    record = launch_spec().to_dict()
    assert record["run_as"] is None
    del record["run_as"]  # a record from a daemon of before lab mode
    assert LaunchSpec.from_dict(record).run_as is None


@pytest.mark.parametrize(
    "run_as",
    [
        "alice",
        1001,
        [],
        {**ACCOUNT, "uid": -1},
        {**ACCOUNT, "uid": "1001"},
        {**ACCOUNT, "gid": True},
        {**ACCOUNT, "groups": 27},
        {**ACCOUNT, "groups": "27"},
        {**ACCOUNT, "groups": [1001, "wheel"]},
        {**ACCOUNT, "name": ""},
        {**ACCOUNT, "home": None},
        {"uid": 1001},
    ],
)
def test_a_bad_run_as_is_refused_with_a_value_error(run_as: object) -> None:
    record = {**launch_spec().to_dict(), "run_as": run_as}
    with pytest.raises(ValueError, match="run_as"):
        LaunchSpec.from_dict(record)


def test_only_a_root_daemon_runs_jobs_as_their_owners(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert lab_owner(1001) is None
    assert run_as_for(1001) is None  # a personal daemon: as before
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert lab_owner(1001) == 1001
    assert lab_owner(0) is None  # root's own job
    assert lab_owner(None) is None  # a job from before lab mode: the daemon's user
    assert run_as_for(None) is None


def test_an_owner_without_an_account_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(UnknownAccount, match="uid 3999999 has no account on this server"):
        run_as_for(3999999)


# -- reading a job's output back (no root needed) ------------------------------------------


def test_the_daemon_reads_back_only_a_regular_file_of_the_job_s_user(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_bytes(b"one\ntwo\nthree\n")
    handle = open_for_reading(str(log), os.geteuid())
    assert handle is not None
    with handle:
        assert tail_offset(handle, 1) == len(b"one\ntwo\n")
        handle.seek(0)
        assert handle.read() == b"one\ntwo\nthree\n"
    with pytest.raises(OutputError, match=r"belongs to uid \d+, not to the job's user"):
        open_for_reading(str(log), os.geteuid() + 1)
    link = tmp_path / "link.out"
    link.symlink_to(log)
    with pytest.raises(OutputError, match="symbolic link"):
        open_for_reading(str(link), None)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="not a regular file"):
        open_for_reading(str(fifo), None)  # and never blocks on a FIFO
    assert open_for_reading(str(tmp_path / "missing.out"), None) is None
    assert open_for_reading("/dev/null", None) is None  # nothing to read


def test_tail_offset_still_takes_a_path(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_bytes(b"a\nb\nc\n")
    assert tail_offset(str(log), 2) == 2


def test_a_record_behind_a_symbolic_link_is_not_read(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    real.write_text('{"step": 3}')
    (tmp_path / "ack.json").symlink_to(real)
    assert jobfiles.read_json(real) == {"step": 3}
    assert jobfiles.read_json(tmp_path / "ack.json") is None


# -- real users (root) --------------------------------------------------------------------


@pytest.fixture
def users() -> dict[str, LabUser]:
    """The test users (skips unless root)."""
    return lab_users()


@pytest.fixture
def lab() -> Iterator[Path]:
    """A state directory as a lab daemon keeps it: root's, others may only pass through."""
    base = Path(tempfile.mkdtemp(prefix="gq-lab-", dir="/tmp"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write in (sticky, like /tmp)."""
    path = shared_dir("gq-shared-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def job_spec(
    user: LabUser,
    command: Sequence[str],
    cwd: Path,
    stdout: Path,
    *,
    stderr: Path | None = None,
    below: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> LaunchSpec:
    """A launch record running `command` as `user`, the submitter's HOME and USER root's."""
    return launch_spec(
        command=tuple(command),
        cwd=str(cwd),
        env={"PATH": "/usr/bin:/bin", "HOME": "/root", "USER": "root", "LOGNAME": "root"}
        | dict(env or {}),
        stdout=str(stdout),
        stderr=str(stderr or stdout),
        create_below=dict(below or {}),
        run_as=Account.of_uid(user.uid),
    )


def run_attempt(jobs_dir: Path, spec: LaunchSpec, job_id: int = 1) -> dict[str, Any]:
    """Run one attempt as the daemon does (executor, spawner, shim); its exit record."""

    async def launch() -> Spawned:
        spawner = SpawnerClient()
        spawner.start()
        try:
            loop = asyncio.get_running_loop()
            spawner.attach(loop)
            answer: asyncio.Future[Spawned] = loop.create_future()
            Executor(jobs_dir, spawner).launch(job_id, spec, answer.set_result)
            return await asyncio.wait_for(answer, 30)
        finally:
            spawner.close()

    spawned = asyncio.run(launch())
    assert spawned.pid is not None and spawned.pidfd is not None, spawned.error
    try:
        ready, _, _ = select.select([spawned.pidfd], [], [], 60)
        assert ready, "the shim did not end"
    finally:
        os.close(spawned.pidfd)
    record = jobfiles.read_json(jobs_dir / str(job_id) / jobfiles.EXIT)
    assert record is not None
    return record


def owner_and_mode(path: Path) -> tuple[int, int]:
    """(uid, permission bits) of `path` itself."""
    info = os.lstat(path)
    return info.st_uid, stat.S_IMODE(info.st_mode)


IDENTITY = (
    'id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"; '
    'grep -E "^Cap(Eff|Prm|Amb):" /proc/self/status; '
    'echo saved > "$GPUQ_CHECKPOINT_DIR/ckpt"; echo to-stderr >&2'
)


def test_a_job_runs_as_its_owner_with_no_capabilities_and_private_files(
    users: dict[str, LabUser], lab: Path
) -> None:
    alice = users[ALICE]
    account = Account.of_uid(alice.uid)
    jobs_dir = lab / "jobs"
    logs = user_log_dir(lab / "logs", alice.uid, alice.gid)
    assert logs == lab / "logs" / USERS_DIR / str(alice.uid)
    stdout, stderr = logs / "1.out", logs / "1.err"
    checkpoints = jobs_dir / "1" / jobfiles.CHECKPOINTS
    spec = job_spec(
        alice,
        ["sh", "-c", IDENTITY],
        Path(alice.home),
        stdout,
        stderr=stderr,
        below={str(stdout): str(logs), str(stderr): str(logs)},
        env={"GPUQ_CHECKPOINT_DIR": str(checkpoints)},
    )
    record = run_attempt(jobs_dir, spec)
    assert record["returncode"] == 0, (record, stderr.read_text())
    lines = stdout.read_text().splitlines()
    assert lines[0] == str(alice.uid)
    assert lines[1] == str(alice.gid)
    assert sorted(int(g) for g in lines[2].split()) == sorted({alice.gid, *account.groups})
    assert lines[3] == f"{alice.home} {alice.name} {alice.name}"
    assert sorted(lines[4:]) == [
        "CapAmb:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
    ]
    assert stderr.read_text() == "to-stderr\n"
    # The outputs and their directory are the owner's, and only theirs.
    assert owner_and_mode(stdout) == (alice.uid, 0o600)
    assert owner_and_mode(stderr) == (alice.uid, 0o600)
    assert os.stat(stdout).st_gid == alice.gid
    assert owner_and_mode(logs) == (alice.uid, 0o700)
    assert owner_and_mode(logs.parent) == (0, 0o711)
    # Checkpoints are the owner's to write; the daemon's records stay root's.
    assert owner_and_mode(checkpoints) == (alice.uid, 0o700)
    assert owner_and_mode(checkpoints / "ckpt") == (alice.uid, 0o644)
    assert owner_and_mode(jobs_dir / "1") == (0, 0o711)
    assert owner_and_mode(jobs_dir) == (0, 0o711)
    assert owner_and_mode(jobs_dir / "1" / jobfiles.LAUNCH) == (0, 0o600)


def test_the_owner_s_log_directory_is_never_reached_through_a_link(lab: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chowning a directory to another user needs root")
    target = lab / "elsewhere"
    target.mkdir()
    (lab / "logs" / USERS_DIR).mkdir(parents=True)
    (lab / "logs" / USERS_DIR / "12345").symlink_to(target)
    with pytest.raises(OSError, match="Not a directory|symbolic links"):
        user_log_dir(lab / "logs", 12345, 12345)
    assert owner_and_mode(target)[0] == 0  # left alone
    os.chown(lab / "logs" / USERS_DIR, 12345, 12345, follow_symlinks=False)
    with pytest.raises(OSError, match="not to the daemon"):
        user_log_dir(lab / "logs", 12345, 12345)


def test_an_output_link_to_root_s_file_is_refused(
    users: dict[str, LabUser], lab: Path, shared: Path
) -> None:
    alice = users[ALICE]
    mine = user_dir(shared, alice)
    secret = shared / "root-file"
    secret.write_text("root's\n")
    (mine / "out.log").symlink_to(secret)
    record = run_attempt(lab / "jobs", job_spec(alice, ["echo", "x"], mine, mine / "out.log"))
    assert record["start_failed"] is True
    assert "it is a symbolic link" in record["error"]
    assert secret.read_text() == "root's\n"


def test_an_output_file_of_root_s_is_refused_even_when_writable(
    users: dict[str, LabUser], lab: Path, shared: Path
) -> None:
    alice = users[ALICE]
    mine = user_dir(shared, alice)
    planted = mine / "out.log"
    planted.write_text("root's\n")
    planted.chmod(0o666)
    record = run_attempt(lab / "jobs", job_spec(alice, ["echo", "x"], mine, planted))
    assert record["start_failed"] is True
    assert f"it belongs to uid 0, not to the job's user (uid {alice.uid})" in record["error"]
    assert planted.read_text() == "root's\n"


def test_an_output_in_a_directory_the_owner_cannot_write_is_refused(
    users: dict[str, LabUser], lab: Path, shared: Path
) -> None:
    alice = users[ALICE]
    roots = shared / "roots"
    roots.mkdir(mode=0o755)
    record = run_attempt(lab / "jobs", job_spec(alice, ["echo", "x"], shared, roots / "out.log"))
    assert record["start_failed"] is True
    assert f"cannot open the job's output file {roots / 'out.log'}" in record["error"]
    assert "Permission denied" in record["error"]
    assert f"as user {ALICE} (uid {alice.uid})" in record["error"]
    assert not (roots / "out.log").exists()
    # Nor does the shim create a missing directory there for the owner.
    nested = roots / "logs" / "out.log"
    spec = job_spec(alice, ["echo", "x"], roots, nested, below={str(nested): str(roots)})
    record = run_attempt(lab / "jobs", spec, job_id=2)
    assert record["start_failed"] is True
    assert "cannot create the directory" in record["error"]
    assert not (roots / "logs").exists()


def test_a_working_directory_the_owner_cannot_enter_fails_the_start(
    users: dict[str, LabUser], lab: Path, shared: Path
) -> None:
    alice = users[ALICE]
    mine = user_dir(shared, alice)
    closed = shared / "closed"
    closed.mkdir(mode=0o700)
    record = run_attempt(lab / "jobs", job_spec(alice, ["true"], closed, mine / "out.log"))
    assert record["start_failed"] is True
    assert f"cannot enter the working directory {str(closed)!r}" in record["error"]
    assert "Permission denied" in record["error"]
    assert f"as user {ALICE}" in record["error"]


CONNECT = """
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(sys.argv[1])
except PermissionError:
    print("refused"); sys.exit()
hello = {"type": "hello", "version": int(sys.argv[3]), "job_id": int(sys.argv[2]),
         "attempt": 1, "pid": 1, "features": []}
sock.settimeout(10)
try:
    sock.sendall(json.dumps(hello).encode() + b"\\n")
    line = sock.makefile("rb").readline()
except (BrokenPipeError, ConnectionResetError):  # the daemon hung up first
    line = b""
print(json.loads(line)["type"] if line else "closed")
"""


def test_a_job_s_control_socket_hears_its_owner_and_no_other_user(
    users: dict[str, LabUser], lab: Path
) -> None:
    alice, bob = users[ALICE], users[BOB]

    def knock(user: LabUser, path: Path) -> str:
        argv = [sys.executable, "-c", CONNECT, str(path), "7", str(CONTROL_VERSION)]
        result = as_user(user, argv)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    async def scenario() -> None:
        hub = ControlHub(lab / "ctl")
        hub.owner_of = lambda job_id: alice.uid if job_id == 7 else None
        path = hub.open(7)
        assert path is not None
        try:
            assert owner_and_mode(path) == (alice.uid, 0o600)
            assert owner_and_mode(lab / "ctl") == (0, 0o711)
            assert await asyncio.to_thread(knock, bob, path) == "refused"
            assert await asyncio.to_thread(knock, alice, path) == "welcome"
            path.chmod(0o666)  # the owner may open up the file: the peer check still holds
            assert await asyncio.to_thread(knock, bob, path) == "closed"
        finally:
            hub.close_all()
        assert not path.exists()

    asyncio.run(scenario())
