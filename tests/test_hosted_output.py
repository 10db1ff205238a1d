"""A lab member writes a moved job's earlier output into its owner's log directory (`node.output`).

The head reads a lab job's log where it ran and has the server it moves to
write it where its next attempt appends: the daemon there, as root, makes
the file its owner's and private, and writes nothing else. Root only (the
daemon writes for another user): skips elsewhere.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from gpuq.daemon.hosted import Attempt, Hosted
from gpuq.errors import ConflictError, NotFoundError, PermissionDenied, UsageError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="writes a file for another user")

NOBODY = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else -1


def hosted(tmp_path: Path) -> Hosted:
    return Hosted(tmp_path / "hosted", tmp_path / "logs" / "hosted", None)


def test_the_output_lands_where_the_attempt_here_appends_as_its_owner_s(tmp_path: Path) -> None:
    here = hosted(tmp_path)
    assert here.put_output("head", 3, "stdout", NOBODY, 0, b"step 1\n") == 7
    assert here.put_output("head", 3, "stdout", NOBODY, 7, b"step 2\n") == 14
    here.put_output("head", 3, "stderr", NOBODY, 0, b"")
    mine = tmp_path / "logs" / "hosted" / "head" / "users" / str(NOBODY)
    assert (mine / "3.out").read_bytes() == b"step 1\nstep 2\n"
    for path in (mine / "3.out", mine / "3.err"):
        info = path.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (NOBODY, 0o600)
    assert (mine.stat().st_uid, mine.stat().st_mode & 0o777) == (NOBODY, 0o700)


def test_root_s_and_unknown_uids_get_no_output_written(tmp_path: Path) -> None:
    here = hosted(tmp_path)
    with pytest.raises(PermissionDenied):
        here.put_output("head", 3, "stdout", 0, 0, b"x")
    with pytest.raises(NotFoundError, match="no account"):
        here.put_output("head", 3, "stdout", 3_999_999, 0, b"x")
    assert not (tmp_path / "logs" / "hosted" / "head" / "users" / "0").exists()


def test_a_running_attempt_s_output_is_its_own(tmp_path: Path) -> None:
    here = hosted(tmp_path)
    here.attempts[("head", 3)] = Attempt("head", 3, 2, ())
    with pytest.raises(ConflictError):
        here.put_output("head", 3, "stdout", NOBODY, 0, b"x")


@pytest.mark.parametrize(("head", "stream"), [("head", "stdin"), ("../etc", "stdout")])
def test_a_bad_stream_or_head_is_refused(tmp_path: Path, head: str, stream: str) -> None:
    with pytest.raises(UsageError):
        hosted(tmp_path).put_output(head, 3, stream, NOBODY, 0, b"x")
