"""The state directory's lock: held by one process, read back by others without taking it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq import statelock
from gpuq.errors import DaemonUnavailable, StateError


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
