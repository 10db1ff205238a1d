"""Daemon memory when clients hang up mid-line: `python -m bench.bench_hangups`.

Rounds of clients each connect, say hello, send most of a megabyte of a
request line without its newline, and go away. A daemon that kept such
half lines alive (until Python's next full collection) grew by a round's
data every round, without bound. One that drops them keeps, at most, the
allocator's high-water mark of one round. So the first round warms the
daemon up, and what the rounds after it add, per round, is compared with
what a round sends: the ratio is printed beside its target (at most 0.1).
Rounds that end each line with its newline (and read the answer) before
closing are shown beside, for comparison.
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import time
from pathlib import Path

from tests.daemon_harness import DaemonHarness, running_daemon

HELLO = b'{"id": 0, "method": "hello", "params": {"version": 1}}\n'
SIZE = 1_000_000
"""Bytes of each client's half line: most of the 1 MiB a line may hold."""


def rss_mb(pid: int) -> float:
    """The resident memory of process `pid`, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def one_round(daemon: DaemonHarness, clients: int, size: int, whole: bool) -> None:
    """`clients` connections, each sending `size` bytes of one request line, then closing.

    With `whole`, each line gets its end and its answer is read before the close.
    """
    start = b'{"id": 1, "method": "list", "params": {"name": "' + b"a" * size
    connections = []
    for _ in range(clients):
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(str(daemon.runtime_dir / "gpuq.sock"))
        conn.sendall(HELLO)
        conn.recv(4096)
        conn.sendall(start)
        connections.append(conn)
    time.sleep(1.0)  # every half line in the daemon's buffers at once
    if whole:
        for conn in connections:
            conn.sendall(b'"}}\n')
        for conn in connections:
            conn.recv(4096)  # its answer: the line was read whole
    for conn in connections:
        conn.close()
    time.sleep(1.0)  # let the daemon see every close


def growth(daemon: DaemonHarness, pid: int, rounds: int, clients: int, whole: bool) -> float:
    """What each round after the first adds to the daemon's RSS, on average (MB)."""
    one_round(daemon, clients, SIZE, whole)
    warm = rss_mb(pid)
    for _ in range(rounds - 1):
        one_round(daemon, clients, SIZE, whole)
    return (rss_mb(pid) - warm) / (rounds - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: the first only warms the daemon up")
    sent = args.clients * SIZE / 2**20
    with tempfile.TemporaryDirectory() as root, running_daemon(Path(root)) as daemon:
        assert daemon.process is not None
        pid = daemon.process.pid
        whole = growth(daemon, pid, args.rounds, args.clients, whole=True)
        cut = growth(daemon, pid, args.rounds, args.clients, whole=False)
        final = rss_mb(pid)
    ratio = max(cut, 0.0) / sent
    print(
        f"{args.rounds} rounds of {args.clients} clients x {SIZE / 2**20:.2f} MB "
        f"({sent:.0f} MB a round): RSS added per round after the first, lines cut off by a "
        f"hang-up {cut:.1f} MB, lines ended before the close {whole:.1f} MB; final RSS "
        f"{final:.0f} MB; cut-off growth / data a round {ratio:.3f} "
        f"(target <= 0.1: {'met' if ratio <= 0.1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
