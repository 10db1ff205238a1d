"""A migration's copy phase against a plain rsync of the same file: `python -m bench.bench_migrate`.

Run as root: `python -m bench.bench_migrate [--size 1G] [--repeats 3]`.
It builds two servers in network namespaces, each with its own sshd and
daemon (tests/cluster_harness.py), and writes one checkpoint file of
`--size` bytes on the head: a `ckpt-1.pt` with its header made as
`gpuq.runner.checkpoint.write_file` makes it (`gpuq.ckptfile`: magic,
version, length, SHA-256 of a random payload) beside the job's
acknowledgement naming it (`suspended.json`), written and synced before
anything is timed. Then, `--repeats` times and alternating:

- the copy phase of a migration, by the daemon's own steps
  (`gpuq.daemon.transfer.copy` to another server): `node.receive` prepare
  on gpu2's daemon, sent as the head's daemon sends it (a request through
  `ssh gpu2 gpuq bridge`); `rsync` with the argv of
  `gpuq.cluster.ssh.rsync_argv` and the head's cluster config, while a
  thread checks the source file against its SHA-256 header (as the daemon
  does for a checkpoint on the head: `gpuq.ckptfile.verify_dir`); then,
  both done, `node.receive` commit with `checked`, which checks the copy's
  header and length and renames the directory into place. Timed from
  before the prepare to the commit's answer.
- a plain `rsync -a` of the same file to an empty directory on gpu2,
  through the same ssh command line (the same ssh config and shared
  ControlMaster connection), timed the same way.

Target (acceptance 2 of the multi-server issue): the copy phase at most
1.2x the plain rsync (medians); the exit status is 1 when it is missed, or
when a step fails (the session's requests wait `[client] timeout`, 10 s,
as the head daemon's do).
The table splits the copy phase into its steps and gives, for reference,
a SHA-256 of the file here (what the commit's check costs), and the
longest a `status` request to gpu2's daemon waited while copy phases ran
(its event loop serves `node.receive`). Each copy lands in a directory of
its own, removed (untimed) after it; caches are flushed to disk (`sync`)
before each timed copy. Everything lives under one temporary directory on
the disk `tempfile` picks, checked for room first, and removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bench_remote_start import unavailable
from gpuq import ckptfile
from gpuq.control import ACK_FILE, SUSPEND_EXIT_CODE
from gpuq.errors import GpuqError
from gpuq.units import format_size, parse_size

TARGET_RATIO = 1.2
"""Acceptance 2: the copy phase takes at most 1.2x a plain rsync of the same files."""
HEAD = "head"
"""The head's node name in tests/cluster_harness.py, which it gives gpu2's daemon."""
FIRST_JOB = 1000
"""Job ids of the copies (no job of that id exists: `node.receive` needs none running)."""
CHUNK = 16 * 1024 * 1024
PROBE_SECONDS = 0.05


def write_checkpoint_file(directory: Path, size: int) -> Path:
    """A checkpoint directory as a job suspended to it leaves it; the checkpoint's path.

    A sound ``ckpt-1.pt`` of `size` bytes in all, header included, and the
    job's acknowledgement naming it (``suspended.json``, which the commit
    requires), both synced to disk.
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ckpt-1.pt"
    length = max(0, size - ckptfile.HEADER.size)
    digest = hashlib.sha256()
    with path.open("wb") as file:
        file.write(bytes(ckptfile.HEADER.size))
        left = length
        while left:
            chunk = os.urandom(min(CHUNK, left))
            digest.update(chunk)
            file.write(chunk)
            left -= len(chunk)
        file.seek(0)
        file.write(ckptfile.HEADER.pack(ckptfile.MAGIC, ckptfile.VERSION, length, digest.digest()))
        file.flush()
        os.fsync(file.fileno())
    ack = {"mode": "checkpoint", "step": 1, "bytes": path.stat().st_size, "job_id": FIRST_JOB,
           "attempt": 1, "exit_code": SUSPEND_EXIT_CODE}  # fmt: skip
    with (directory / ACK_FILE).open("w", encoding="utf-8") as file:
        json.dump(ack, file)
        file.flush()
        os.fsync(file.fileno())
    return path


@dataclass(frozen=True)
class CopyPhase:
    """One copy by the daemon's steps, in seconds."""

    prepare: float
    rsync: float
    check: float
    """The source's SHA-256 check, beside rsync (not added: it overlaps)."""
    after: float
    """How long the check went on after rsync ended (the copy waits for it)."""
    commit: float
    files: int
    bytes: int

    @property
    def total(self) -> float:
        """Prepare + rsync + what the check took beyond it + commit."""
        return self.prepare + self.rsync + self.after + self.commit


@dataclass
class Figures:
    """Every timed copy of both kinds, and the references."""

    size: int
    copies: list[CopyPhase] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    sha256: float = 0.0
    probe_worst: float = 0.0


class Probe:
    """`status` requests to a daemon in a loop, each timed; `worst` while switched on."""

    def __init__(self, daemon: Any) -> None:
        self._daemon = daemon
        self._on = threading.Event()
        self._stop = threading.Event()
        self.worst = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self._daemon.client() as client:
            while not self._stop.is_set():
                began, during = time.perf_counter(), self._on.is_set()
                client.call("status")
                waited = time.perf_counter() - began
                if during or self._on.is_set():
                    self.worst = max(self.worst, waited)
                self._stop.wait(PROBE_SECONDS)

    @contextmanager
    def running(self) -> Iterator[None]:
        """Probe for the duration of the `with` block (worst counted only while `on`)."""
        self._thread.start()
        try:
            yield
        finally:
            self._stop.set()
            self._thread.join()

    @contextmanager
    def on(self) -> Iterator[None]:
        """Count the waits of requests answered inside the block."""
        self._on.set()
        try:
            yield
        finally:
            self._on.clear()


def _rsync(argv: list[str]) -> float:
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return time.perf_counter() - began


def copy_phase(session: Any, config: Any, source: Path, job_id: int) -> CopyPhase:
    """Prepare, rsync, commit: `gpuq.daemon.transfer.copy` to gpu2, each step timed."""
    from gpuq.cluster.ssh import rsync_argv

    began = time.perf_counter()
    prepared = session.call("node.receive", head=HEAD, job=job_id, phase="prepare")
    rsync_began = time.perf_counter()
    checked: dict[str, Any] = {}

    def check() -> None:
        checked["problems"] = ckptfile.verify_dir(source)
        checked["seconds"] = time.perf_counter() - rsync_began

    checker = threading.Thread(target=check)
    checker.start()
    destination = f"gpu2:{prepared['path']}"
    argv = rsync_argv(str(source), destination, config.cluster, config.daemon.runtime_dir)
    _rsync(argv)
    rsync_ended = time.perf_counter()
    checker.join()
    if checked["problems"]:
        raise RuntimeError(f"the source is unsound: {checked['problems']}")
    commit_began = time.perf_counter()
    result = session.call("node.receive", head=HEAD, job=job_id, phase="commit", checked=True)
    ended = time.perf_counter()
    return CopyPhase(
        rsync_began - began,
        rsync_ended - rsync_began,
        checked["seconds"],
        commit_began - rsync_ended,
        ended - commit_began,
        int(result["files"]),
        int(result["bytes"]),
    )


def plain_rsync(config: Any, source: Path, target: Path) -> float:
    """`rsync -a` of `source`'s files into a new `target` on gpu2, over gpuq's ssh command."""
    import shlex

    from gpuq.cluster.ssh import ssh_argv

    ssh = shlex.join(ssh_argv(config.cluster, config.daemon.runtime_dir))
    return _rsync(["rsync", "-a", "--rsh", ssh, "--", f"{source}/", f"gpu2:{target}/"])


def sha256_seconds(path: Path) -> float:
    """How long `gpuq.ckptfile.verify` takes on `path` here (the commit's check)."""
    began = time.perf_counter()
    problem = ckptfile.verify(path)
    if problem is not None:
        raise RuntimeError(f"the checkpoint written is not sound: {problem}")
    return time.perf_counter() - began


def measure(root: Path, size: int, repeats: int) -> Figures:
    """Build the two servers under `root` and time `repeats` copies of each kind."""
    from gpuq.cluster.remote import SshClient
    from tests.cluster_harness import head_and_gpu2

    figures = Figures(size)
    with head_and_gpu2(root) as cluster:
        source = root / "head" / "checkpoints"
        checkpoint = write_checkpoint_file(source, size)
        figures.sha256 = sha256_seconds(checkpoint)  # also reads the file into the cache
        sent = sum(path.stat().st_size for path in source.iterdir())
        config = cluster.head.config
        [server] = config.cluster.servers
        jobs_dir = cluster.gpu2.state_dir / "hosted" / HEAD / "jobs"
        probe = Probe(cluster.gpu2)
        with cluster.net.inside("head"), SshClient.connect_to(server, config) as session:
            with probe.running():
                for index in range(repeats):
                    target = root / "gpu2" / f"plain-{index}"
                    os.sync()
                    figures.plain.append(plain_rsync(config, source, target))
                    shutil.rmtree(target)
                    os.sync()
                    with probe.on():
                        copy = copy_phase(session, config, source, FIRST_JOB + index)
                    figures.copies.append(copy)
                    if copy.bytes != sent:
                        raise RuntimeError(f"the copy holds {copy.bytes} bytes, not {sent}")
                    shutil.rmtree(jobs_dir / str(FIRST_JOB + index))
        figures.probe_worst = probe.worst
    return figures


def table(figures: Figures) -> str:
    """The figures as a table: medians (and the slowest) of each step, in seconds."""
    copies = figures.copies

    def row(label: str, values: list[float]) -> str:
        median = statistics.median(values)
        rate = format_size(int(figures.size / median)) + "/s" if median > 0 else "-"
        return f"{label:<48} {median:8.3f} {max(values):8.3f} {rate:>10}"

    return "\n".join(
        [
            f"{format_size(figures.size)} checkpoint, {len(copies)} copies of each kind "
            f"(seconds; rate = size / median)",
            f"{'what':<48} {'median':>8} {'max':>8} {'rate':>10}",
            row("copy phase (prepare + rsync + commit)", [c.total for c in copies]),
            row("  node.receive prepare", [c.prepare for c in copies]),
            row("  rsync (gpuq's argv)", [c.rsync for c in copies]),
            row("  source SHA-256 check, beside rsync", [c.check for c in copies]),
            row("  check going on after rsync ended", [c.after for c in copies]),
            row("  node.receive commit (lengths, rename)", [c.commit for c in copies]),
            row("plain rsync -a, same ssh", figures.plain),
            row("SHA-256 of the file here (reference)", [figures.sha256]),
            f"{'longest status wait at gpu2 during copies':<48} {figures.probe_worst:8.3f}",
        ]
    )


def verdict(figures: Figures) -> tuple[str, bool]:
    """The summary line under the table, and whether the target is met."""
    copy = statistics.median(c.total for c in figures.copies)
    plain = statistics.median(figures.plain)
    ratio = copy / plain
    met = ratio <= TARGET_RATIO
    line = (
        f"copy phase {copy:.3f} s vs plain rsync {plain:.3f} s: ratio {ratio:.2f}x; "
        f"target <= {TARGET_RATIO}x: {'met' if met else 'NOT MET'}"
    )
    return line, met


def main() -> None:
    """Parse the options, measure, print the table; exit 1 if the target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--size", default="1G", help="checkpoint size, e.g. 1G or 4M")
    parser.add_argument("--repeats", type=int, default=3, help="copies of each kind")
    args = parser.parse_args()
    size = parse_size(args.size)
    why = unavailable()
    if why is not None:
        print(f"bench_migrate skipped: {why}", file=sys.stderr)
        return
    root = Path(tempfile.mkdtemp(prefix="gq-bench-migrate-"))
    try:
        free = shutil.disk_usage(root).free
        needed = 3 * size + 2**30
        if free < needed:
            sys.exit(
                f"bench_migrate: {format_size(free)} free under {root}; "
                f"{format_size(needed)} needed for a {args.size} checkpoint"
            )
        figures = measure(root, size, args.repeats)
    except GpuqError as exc:  # a step the daemon refused or did not answer in time
        hint = f" (hint: {exc.hint})" if exc.hint else ""
        sys.exit(f"bench_migrate: a copy phase failed: {exc.message}{hint}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(table(figures))
    line, met = verdict(figures)
    print(line)
    if not met:
        sys.exit(1)


if __name__ == "__main__":
    main()
