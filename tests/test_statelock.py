"""The state directory's lock: held by one process, read back by others without taking it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq import statelock
from gpuq.errors import DaemonUnavailable, StateError
from tests.daemon_harness import mounted_tmpfs


def test_the_holder_is_this_process_with_its_socket(tmp_path: Path) -> None:
    fd = statelock.take(tmp_path, tmp_path / "run", tmp_path / "run" / "gpuq.sock")
    try:
        assert statelock.holder(tmp_path) == statelock.Holder(
            os.getpid(), tmp_path / "run" / "gpuq.sock"
        )
    finally:
        os.close(fd)


def test_a_second_taker_is_told_where_the_holder_listens(tmp_path: Path) -> None:
    fd = statelock.take(tmp_path, Path("/run/a"), Path("/run/a/gpuq.sock"))
    try:
        # flock locks belong to the open file: another open of it conflicts, as another daemon's.
        with pytest.raises(DaemonUnavailable) as refused:
            statelock.take(tmp_path, Path("/tmp/gpuq-0"), Path("/tmp/gpuq-0/gpuq.sock"))
    finally:
        os.close(fd)
    assert refused.value.message == (
        f"the state directory {tmp_path} is in use by another gpuq daemon "
        f"(pid {os.getpid()}, socket /run/a/gpuq.sock)"
    )
    assert refused.value.hint is not None
    assert "this shell's (/tmp/gpuq-0" in refused.value.hint
    assert refused.value.hint.endswith("reach it with GPUQ_RUNTIME_DIR=/run/a gpuq ...")


def test_a_lock_left_by_a_process_that_exited_names_no_holder(tmp_path: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (tmp_path / statelock.LOCK_NAME).write_text(f"{gone.stdout.strip()} /run/a/gpuq.sock\n")
    assert statelock.holder(tmp_path) is None
    os.close(statelock.take(tmp_path, Path("/run/b"), Path("/run/b/gpuq.sock")))


@pytest.mark.parametrize("text", ["", "garbage", "12x /s"])
def test_an_unreadable_or_empty_lock_file_names_no_holder(tmp_path: Path, text: str) -> None:
    (tmp_path / statelock.LOCK_NAME).write_text(text)
    assert statelock.holder(tmp_path) is None
    assert statelock.holder(tmp_path / "missing") is None


def test_a_link_planted_at_the_lock_is_refused_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    (tmp_path / statelock.LOCK_NAME).symlink_to(target)
    with pytest.raises(StateError, match="cannot open the lock"):
        statelock.take(tmp_path, tmp_path, tmp_path / "gpuq.sock")
    assert target.read_text() == "keep\n"


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs of its own, which a test remounts read-only (root only)."""
    with mounted_tmpfs(tmp_path / "ro", "size=1m,mode=700") as mounted:
        yield mounted


def _remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def test_no_lock_can_be_made_on_a_read_only_filesystem(read_only_mount: Path) -> None:
    _remount_read_only(read_only_mount)
    with pytest.raises(StateError, match="is on a read-only filesystem: cannot make its lock"):
        statelock.take(read_only_mount, read_only_mount, read_only_mount / "gpuq.sock")


def test_a_lock_already_there_is_taken_read_only_and_still_keeps_a_second_taker_out(
    read_only_mount: Path,
) -> None:
    os.close(statelock.take(read_only_mount, Path("/run/a"), Path("/run/a/gpuq.sock")))
    _remount_read_only(read_only_mount)
    fd = statelock.take(read_only_mount, Path("/run/b"), Path("/run/b/gpuq.sock"))
    try:
        with pytest.raises(DaemonUnavailable, match="in use by another gpuq daemon"):
            statelock.take(read_only_mount, Path("/run/c"), Path("/run/c/gpuq.sock"))
    finally:
        os.close(fd)
