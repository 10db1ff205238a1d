"""`node.read`: part of a hosted attempt's output, from an offset, for the head's `gpuq logs`.

The head asks from the offset it has read up to; an offset at or past the
end of the file reads nothing and keeps its place, however large, and a
negative one is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.daemon import jobfiles
from gpuq.daemon.hosted import Hosted
from gpuq.errors import UsageError


def hosted_with_output(tmp_path: Path, text: bytes) -> tuple[Hosted, Path]:
    """A node that ran job 3 of `head`, whose stdout holds `text`."""
    here = Hosted(tmp_path / "hosted", tmp_path / "logs", None)
    output = tmp_path / "3.out"
    output.write_bytes(text)
    job_dir = here.executor("head").jobs_dir / "3"
    job_dir.mkdir(parents=True)
    jobfiles.write_json(job_dir / jobfiles.LAUNCH, {"stdout": str(output)})
    return here, output


def test_the_output_is_read_from_the_offset(tmp_path: Path) -> None:
    here, output = hosted_with_output(tmp_path, b"hello\n")
    assert here.read("head", 3, "stdout", 1, 1024, None) == {
        "data": "ello\n",
        "offset": 6,
        "size": 6,
        "path": str(output),
    }


@pytest.mark.parametrize("offset", [6, 1000, 2**62, 2**63 - 1])
def test_an_offset_at_or_past_the_end_reads_nothing_and_keeps_its_place(
    tmp_path: Path, offset: int
) -> None:
    here, output = hosted_with_output(tmp_path, b"hello\n")
    assert here.read("head", 3, "stdout", offset, 1024, None) == {
        "data": "",
        "offset": offset,
        "size": 6,
        "path": str(output),
    }


def test_a_negative_offset_is_refused(tmp_path: Path) -> None:
    here, _ = hosted_with_output(tmp_path, b"hello\n")
    with pytest.raises(UsageError) as caught:
        here.read("head", 3, "stdout", -1, 1024, None)
    assert (caught.value.message, caught.value.hint) == (
        "node.read's offset is -1",
        "give 0 or more",
    )
