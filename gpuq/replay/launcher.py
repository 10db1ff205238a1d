"""The command a daemon runs for a trace job: hands the job to the fork server, or runs it.

    python -S launcher.py SOCKET [TRACE JOB ARGUMENTS...]

Run without `site` (`-S`) and importing only the standard library, it
starts in a few tens of milliseconds. It sends its arguments, environment,
working directory and standard streams to the fork server
listening on SOCKET (`gpuq.replay.forkserver`), which forks the trace job
from a process that has already imported Python's numeric stack, torch and
the runner; it forwards SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGCONT to
the job (those that come before the job exists, once it does), and exits
with the job's status (128 + N for signal N), so
the daemon sees this process as the job. The job ends if this process does
(the fork server watches it). Without a fork server there (none started,
or one that has stopped), it runs the trace job itself, in a fresh
interpreter (`python -m gpuq.replay.tracejob`), started the slow way.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGCONT)


class Forwarder:
    """Passes the job's signals on to it; those that come before it exists, once it does."""

    def __init__(self) -> None:
        self.child: int | None = None
        self.pending: list[int] = []
        for signum in FORWARDED:
            signal.signal(signum, self.forward)

    def forward(self, signum: int, frame: object) -> None:
        """The handler: send `signum` to the job, or keep it for when the job runs."""
        if self.child is None:
            self.pending.append(signum)
            return
        try:
            os.kill(self.child, signum)
        except ProcessLookupError:
            pass

    def started(self, child: int) -> None:
        """The job runs as `child`: send it what came before."""
        self.child = child
        for signum in self.pending:
            self.forward(signum, None)
        self.pending.clear()


def run_here(arguments: list[str], forwarder: Forwarder) -> None:
    """Become the trace job in a fresh interpreter (no fork server to ask)."""
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    for early in forwarder.pending:  # what the job would have received: its default action
        os.kill(os.getpid(), early)
    os.execv(sys.executable, [sys.executable, "-m", "gpuq.replay.tracejob", *arguments])


def main(argv: list[str]) -> int:
    """Ask the fork server at `argv[0]` to run the trace job `argv[1:]`; its exit status."""
    forwarder = Forwarder()
    path, arguments = argv[0], argv[1:]
    request = {
        "argv": arguments,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
    }
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.connect(path)
        data = json.dumps(request).encode() + b"\n"
        streams = array.array("i", [0, 1, 2])
        server.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, streams)])
    except OSError:
        server.close()
        run_here(arguments, forwarder)
    reader = server.makefile("rb")
    first = reader.readline()
    if not first:
        print("gpuq trace launcher: the fork server closed the connection", file=sys.stderr)
        return 1
    forwarder.started(int(json.loads(first)["pid"]))
    while True:
        line = reader.readline()
        if not line:
            print("gpuq trace launcher: lost the fork server before the job ended", file=sys.stderr)
            return 1
        status = json.loads(line)
        if "exit" in status:
            return int(status["exit"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
