"""The multi-server benchmarks run end to end on a tiny scale (their figures are in RESULTS).

bench/bench_remote_start.py and bench/bench_migrate.py build real servers in
network namespaces, so running them needs root; their helpers are checked
everywhere. Whether a run meets its target is the benchmark's verdict, not
this test's: either exit status (0 met, 1 missed) passes, a crash does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.bench_migrate import write_checkpoint_file
from bench.bench_remote_start import Start, percentile, start_of
from gpuq import ckptfile
from gpuq.control import ACK_FILE
from tests.netns_harness import skip_unless_possible

ROOT = Path(__file__).resolve().parents[1]


def bench(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m bench.MODULE ARGV`, outside any gpuq of the caller."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    return subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *argv],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_a_start_is_split_at_the_starting_event() -> None:
    shown = {
        "job": {"node": "gpu2", "submit_time": 100.0, "start_time": 100.25},
        "events": [
            {"time": 100.0, "state": "queued", "reason": "submitted"},
            {"time": 100.125, "state": "starting", "reason": "starting on gpu2: g0, g1, g2"},
            {"time": 100.25, "state": "running", "reason": "started"},
        ],
    }
    assert start_of(shown) == Start("gpu2", 0.125, 0.125)
    assert start_of(shown).total == 0.25


@pytest.mark.parametrize(("share", "expected"), [(0.5, 5.0), (0.9, 9.0), (1.0, 10.0), (0.0, 1.0)])
def test_percentiles_are_nearest_rank(share: float, expected: float) -> None:
    assert percentile([float(v) for v in range(10, 0, -1)], share) == expected


def test_the_checkpoint_written_is_sound_of_the_size_asked_and_acknowledged(tmp_path: Path) -> None:
    path = write_checkpoint_file(tmp_path / "checkpoints", 3 * 2**20 + 5)
    assert path.name == "ckpt-1.pt" and ckptfile.NAME.match(path.name)
    assert path.stat().st_size == 3 * 2**20 + 5
    assert ckptfile.verify(path) is None
    ack = json.loads((path.parent / ACK_FILE).read_text())
    assert ack["step"] == 1 and ack["mode"] == "checkpoint"


@pytest.mark.slow
def test_the_remote_start_bench_prints_both_kinds_and_its_verdict() -> None:
    skip_unless_possible()
    done = bench("bench_remote_start", "--count", "2", "--new-dirs", "1")
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split("  ")[0] for line in lines[1:6]] == [
        "on gpu2 (--gpus 3)",
        "on the head",
        "on gpu2, new directory each",
        "first on gpu2 (not counted)",
        "bridge round trip (status)",
    ]
    assert lines[-1].startswith("remote median ") and "target: remote median < 200 ms" in lines[-1]


@pytest.mark.slow
def test_the_migrate_bench_copies_a_small_checkpoint_both_ways() -> None:
    skip_unless_possible()
    done = bench("bench_migrate", "--size", "1M", "--repeats", "1")
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("1.0M checkpoint, 1 copies of each kind")
    labels = [line[:48].strip() for line in lines[2:]]
    assert labels[:8] == [
        "copy phase (prepare + rsync + commit)",
        "node.receive prepare",
        "rsync (gpuq's argv)",
        "source SHA-256 check, beside rsync",
        "check going on after rsync ended",
        "node.receive commit (lengths, rename)",
        "plain rsync -a, same ssh",
        "SHA-256 of the file here (reference)",
    ]
    assert lines[-1].startswith("copy phase ") and "target <= 1.2x" in lines[-1]
