"""A job's output files: where they go, what gpuq creates, and how large they grow.

Placeholders never add a directory level (`--name ../../x` with `%x` stays
where the pattern says); missing directories are created only below the
job's working directory; an absolute pattern's directory must exist; and
`[logs] max_size` keeps a chatty job's log under its limit, with a marker
where output was dropped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.daemon.outputs import (
    LogLimit,
    OutputError,
    Outputs,
    default_logs,
    open_output,
    write_carried,
)
from gpuq.units import expand_output_pattern, path_component
from tests.daemon_harness import DaemonHarness, running_daemon

ENDED = ("succeeded", "failed", "cancelled", "lost")


@pytest.mark.parametrize(
    ("output", "error", "named"),
    [
        (None, None, {"stdout": "7.out", "stderr": "7.err"}),
        ("run.log", None, {}),  # stderr goes to the user's file too
        (None, "errors.log", {"stdout": "7.out"}),
        ("run.log", "errors.log", {}),
    ],
)
def test_gpuq_names_only_the_logs_the_user_did_not(
    output: str | None, error: str | None, named: dict[str, str]
) -> None:
    logs = Path("/var/log/gpuq")
    assert default_logs(logs, 7, None, output, error) == {s: logs / n for s, n in named.items()}
    own = logs / "users" / "1001"  # a lab job's, in its owner's directory
    assert default_logs(logs, 7, 1001, output, error) == {s: own / n for s, n in named.items()}


@pytest.mark.parametrize(
    ("name", "component"),
    [
        ("train", "train"),
        ("../../x", ".._.._x"),
        ("..", "__"),
        (".", "_"),
        ("a/b", "a_b"),
        ("/etc/cron.d/job", "_etc_cron.d_job"),
    ],
)
def test_a_name_becomes_one_harmless_path_component(name: str, component: str) -> None:
    assert path_component(name) == component
    assert "/" not in expand_output_pattern("logs/%x.out", 1, None, None, name, "me")[5:]


def test_a_hostile_name_stays_in_the_directory_its_pattern_names(daemon: DaemonHarness) -> None:
    job_id = daemon.submit(["echo", "hello"], gpus=0, name="../../escaped", output="logs/%x-%j.out")
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "succeeded", job
    written = daemon.root / "logs" / f".._.._escaped-{job_id}.out"
    assert job["stdout"] == str(written)
    assert written.read_text() == "hello\n"
    assert not (daemon.root.parent.parent / f"escaped-{job_id}.out").exists()


def test_missing_directories_below_the_working_directory_are_created(
    daemon: DaemonHarness,
) -> None:
    job_id = daemon.submit(["echo", "deep"], gpus=0, output="runs/%j/out.log")
    assert daemon.wait_state(job_id, *ENDED)["state"] == "succeeded"
    assert (daemon.root / "runs" / str(job_id) / "out.log").read_text() == "deep\n"


def test_an_absolute_pattern_in_a_missing_directory_is_refused_at_submit(
    daemon: DaemonHarness,
) -> None:
    missing = daemon.root / "nowhere" / "deeper"
    result = daemon.cli("submit", "--gpus", "0", "--output", f"{missing}/out.log", "--", "true")
    assert result.returncode == 2, result.stderr
    assert f"the directory {missing} of output pattern" in result.stderr
    assert f"mkdir -p {missing}" in result.stderr
    assert not missing.exists()


@pytest.mark.parametrize("pattern", ["runs", "runs/", "{root}/runs", "logs/"])
def test_an_output_pattern_naming_a_directory_is_refused_at_submit(
    daemon: DaemonHarness, pattern: str
) -> None:
    (daemon.root / "runs").mkdir()
    pattern = pattern.format(root=daemon.root)
    result = daemon.cli("submit", "--gpus", "0", "--output", pattern, "--", "true")
    assert result.returncode == 2, result.stderr
    assert f"output pattern {pattern!r} names a directory, not a file" in result.stderr
    assert "%x-%j.out" in result.stderr
    assert daemon.call("list")["jobs"] == []


def test_a_directory_outside_the_working_directory_is_never_created(
    daemon: DaemonHarness,
) -> None:
    outside = daemon.root.parent / f"outside-{os.getpid()}"
    job_id = daemon.submit(["echo", "x"], gpus=0, output=f"../{outside.name}/%j/out.log")
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed"
    assert "only below the job's working directory" in job["reason"]
    assert not outside.exists()


def test_a_symlink_at_the_output_path_fails_the_job_and_is_left_alone(
    daemon: DaemonHarness,
) -> None:
    target = daemon.root / "someone-elses.txt"
    target.write_text("untouched\n")
    (daemon.root / "out.log").symlink_to(target)
    job_id = daemon.submit(["echo", "appended"], gpus=0, output="out.log")
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed"
    assert job["exit_code"] is None
    assert "it is a symbolic link" in job["reason"]
    assert target.read_text() == "untouched\n"


OTHER_UID = 54321
"""A uid of nobody on this machine: the planter of links, as root can make them."""
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="planting another uid's link needs root")


def shared_directory(root: Path) -> Path:
    """A directory anyone may write to, as /tmp or a lab's scratch space (mode 1777)."""
    shared = root / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


@needs_root
@pytest.mark.parametrize(
    ("pattern", "create_below"),
    [("logs/1.out", True), ("logs/sub/1.out", True), ("logs/1.out", False)],
    ids=["relative", "to-be-created-below", "absolute"],
)
def test_a_link_another_user_planted_in_a_shared_directory_is_never_followed(
    tmp_path: Path, pattern: str, create_below: bool
) -> None:
    secret = tmp_path / "secret"  # the job user's: where the planter wants the output to go
    secret.mkdir()
    shared = shared_directory(tmp_path)
    (shared / "logs").symlink_to(secret)
    os.lchown(shared / "logs", OTHER_UID, OTHER_UID)
    below = str(shared) if create_below else None
    with pytest.raises(OutputError) as caught:
        open_output(str(shared / pattern), below)
    assert caught.value.args[0].startswith(
        f"refusing to write the job's output to {shared / pattern.rpartition('/')[0]}: logs is "
        f"a symbolic link that uid {OTHER_UID} made in a directory anyone may write to"
    )
    assert list(secret.iterdir()) == []  # nothing written there, no directory made


def test_links_that_may_be_trusted_are_followed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    shared = shared_directory(tmp_path)
    (shared / "mine").symlink_to(real)  # the job user's own link, even in a shared directory
    (shared / "up").symlink_to("../real")  # relative, climbing out
    private = tmp_path / "private"  # nobody else may write here: any link is the owner's doing
    private.mkdir()
    (private / "theirs").symlink_to(real)
    if os.geteuid() == 0:
        os.lchown(private / "theirs", OTHER_UID, OTHER_UID)
    for path, below in [
        (shared / "mine" / "a.out", str(shared)),
        (shared / "up" / "new" / "b.out", str(shared)),
        (private / "theirs" / "c.out", None),
    ]:
        os.close(open_output(str(path), below))
    assert sorted(str(p.relative_to(real)) for p in real.rglob("*.out")) == [
        "a.out",
        "c.out",
        "new/b.out",
    ]


def test_a_loop_of_links_is_an_error_not_a_hang(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OutputError, match="too many levels of symbolic links"):
        open_output(str(tmp_path / "a" / "1.out"), None)


@needs_root
def test_a_job_whose_output_dir_is_a_planted_link_fails_and_writes_nothing(
    daemon: DaemonHarness,
) -> None:
    secret = daemon.root / "secret"
    secret.mkdir()
    (secret / "1.out").write_text("mine\n")
    shared = shared_directory(daemon.root)
    (shared / "logs").symlink_to(secret)
    os.lchown(shared / "logs", OTHER_UID, OTHER_UID)
    job_id = daemon.submit(["echo", "appended"], gpus=0, output="logs/1.out", cwd=str(shared))
    job = daemon.wait_state(job_id, *ENDED)
    assert job["state"] == "failed" and "made in a directory anyone may write to" in job["reason"]
    assert (secret / "1.out").read_text() == "mine\n"


def test_dev_null_is_a_fine_output(daemon: DaemonHarness) -> None:
    job_id = daemon.submit(["echo", "gone"], gpus=0, output="/dev/null")
    assert daemon.wait_state(job_id, *ENDED)["state"] == "succeeded"


def test_a_fifo_at_the_output_path_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="cannot open"):
        open_output(str(fifo), None)


# -- the size limit ------------------------------------------------------------------


def trimmed(tmp_path: Path, limit: int, sizes: list[int]) -> bytes:
    """Append blocks of these sizes to a log, checking the limit after each; the log's bytes."""
    path = tmp_path / "job.log"
    fd = open_output(str(path), None)
    try:
        limit_check = LogLimit(Outputs(fd, fd), limit)
        for n, size in enumerate(sizes):
            os.write(fd, bytes([ord("a") + n % 26]) * size)
            limit_check.check()
    finally:
        os.close(fd)
    return path.read_bytes()


def test_a_log_under_the_limit_is_untouched(tmp_path: Path) -> None:
    assert trimmed(tmp_path, 8192, [4000, 4000]) == b"a" * 4000 + b"b" * 4000


def test_a_log_over_the_limit_keeps_its_head_and_tail_with_a_marker(tmp_path: Path) -> None:
    data = trimmed(tmp_path, 8192, [4000, 4000, 4000])
    assert len(data) <= 8192
    head, marker, tail = data.partition(b"\n[gpuq: ")
    assert head == b"a" * 1024  # the first eighth
    assert marker
    note, _, kept = tail.partition(b"]\n")
    assert note.startswith(b"8928 bytes of output dropped here (8928 in all)")
    assert b"[logs] max_size" in note
    assert kept == b"c" * 2048  # the last quarter


def test_repeated_trims_keep_the_first_head_and_count_all_that_was_dropped(
    tmp_path: Path,
) -> None:
    data = trimmed(tmp_path, 8192, [6000] * 6)
    assert len(data) <= 8192
    assert data.startswith(b"a" * 1024 + b"\n[gpuq: ")
    assert data.endswith(b"f" * 2048)
    assert data.count(b"[gpuq: ") == 1


def test_a_chatty_job_s_log_stays_under_max_size(tmp_path: Path) -> None:
    with running_daemon(tmp_path, extra_toml='[logs]\nmax_size = "64K"') as daemon:
        job_id = daemon.submit(
            [
                "sh",
                "-c",
                "i=0; while [ $i -lt 40 ]; do head -c 20000 /dev/zero | tr '\\0' x;"
                " echo; i=$((i+1)); sleep 0.1; done; echo the-end",
            ],
            gpus=0,
        )
        assert daemon.wait_state(job_id, *ENDED, timeout=60)["state"] == "succeeded"
        log = Path(daemon.job(job_id)["stdout"]).read_bytes()
        assert len(log) <= 64 * 1024
        assert b"bytes of output dropped here" in log
        assert log.endswith(b"the-end\n")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonHarness]:
    with running_daemon(tmp_path) as harness:
        yield harness


# -- a moved lab job's earlier output, written by the daemon for its owner --


def _me() -> tuple[int, int]:
    return os.getuid(), os.getgid()


def test_a_carried_log_is_a_new_private_file_of_the_owner_s(tmp_path: Path) -> None:
    uid, gid = _me()
    assert write_carried(tmp_path, "7.out", uid, gid, b"step 1\n", 0) == 7
    assert write_carried(tmp_path, "7.out", uid, gid, b"step 2\n", 7) == 14
    info = (tmp_path / "7.out").stat()
    assert (tmp_path / "7.out").read_bytes() == b"step 1\nstep 2\n"
    assert (info.st_uid, info.st_mode & 0o777) == (uid, 0o600)


def test_a_carried_log_replaces_an_earlier_stay_s_from_its_start(tmp_path: Path) -> None:
    (tmp_path / "7.out").write_bytes(b"what the job wrote here before it moved away\n")
    uid, gid = _me()
    write_carried(tmp_path, "7.out", uid, gid, b"", 0)
    assert (tmp_path / "7.out").read_bytes() == b""


def test_a_link_planted_at_a_carried_log_is_replaced_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's file\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "7.out").symlink_to(victim)
    uid, gid = _me()
    write_carried(logs, "7.out", uid, gid, b"the job's output\n", 0)
    assert victim.read_bytes() == b"someone else's file\n"
    assert not (logs / "7.out").is_symlink()
    assert (logs / "7.out").read_bytes() == b"the job's output\n"


def test_a_carried_log_changed_between_two_parts_is_not_appended_to(tmp_path: Path) -> None:
    uid, gid = _me()
    write_carried(tmp_path, "7.out", uid, gid, b"first part\n", 0)
    with open(tmp_path / "7.out", "ab") as handle:
        handle.write(b"written meanwhile\n")
    with pytest.raises(OutputError, match="changed while"):
        write_carried(tmp_path, "7.out", uid, gid, b"second part\n", 11)
    os.link(tmp_path / "7.out", tmp_path / "second-name")
    with pytest.raises(OutputError, match="changed while"):
        write_carried(tmp_path, "7.out", uid, gid, b"second part\n", 29)


def test_a_carried_log_is_never_written_through_a_linked_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    uid, gid = _me()
    with pytest.raises(OutputError, match="cannot use the directory"):
        write_carried(tmp_path / "linked", "7.out", uid, gid, b"x", 0)
    assert not (tmp_path / "real" / "7.out").exists()
