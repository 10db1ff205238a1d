"""Blocking client for the daemon socket, used by the CLI and scripts.

`Client.connect(config)` finds the daemon of that configuration, starting it
on demand, and sends the version handshake, whose answer is read after the
first request is sent (one round trip per command). `call` sends one request and
returns its result (raising the daemon's error as the matching GpuqError);
`stream` yields a streaming request's events and then its result.

Nothing is sent before the daemon is known to be this user's: the runtime
directory must be a real directory of this user's that nobody else can use
(`gpuq.paths.check_private_dir`), and the process listening on the socket
must run as this user (SO_PEERCRED). Every read has a timeout; the daemon
sends a heartbeat event every `HEARTBEAT_SECONDS` while a long request (a
`wait`, `logs -f`) runs, so the timeout bounds silence, not the request.
Every failure to reach or understand the daemon is a `GpuqError` with a hint.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq import statelock
from gpuq.config import RUNTIME_DIR_ENV, STATE_DIR_ENV, Config
from gpuq.errors import DaemonUnavailable, GpuqError, ProtocolError, StateError, from_wire
from gpuq.paths import check_private_dir, ensure_private_dir, require_socket_or_nothing
from gpuq.wire import (
    HEARTBEAT_EVENT,
    MAX_REPLY_BYTES,
    PROTOCOL_VERSION,
    Envelope,
    decode,
    encode,
    parse_reply,
)

SOCKET_NAME = "gpuq.sock"
LOCK_NAME = statelock.LOCK_NAME
START_TIMEOUT = 15.0
DAEMON_ERROR = "gpuqd: error: "
"""How the daemon's last words start (`gpuq.daemon.__main__`), with a `hint: ` line after."""
DAEMON_ERROR_CODE = "gpuqd: error code: "
"""The line after those: the error's code (`GpuqError.code`), so that it keeps its kind."""


def socket_path(config: Config) -> Path:
    """The socket the daemon of this configuration listens on (a lab daemon's: `[lab] socket`)."""
    return config.lab.socket if config.lab.enabled else config.daemon.runtime_dir / SOCKET_NAME


@dataclass(frozen=True, slots=True)
class DaemonChoice:
    """The daemon a command talks to: its socket, whether it is the lab's, and a note for stderr."""

    path: Path
    lab: bool
    notice: str | None = None


def choose_daemon(config: Config) -> DaemonChoice:
    """The lab's system daemon where its socket exists (or the config says so), else one's own.

    `[client] daemon` (or `$GPUQ_DAEMON`) forces one. When both sockets
    exist the choice comes with a notice saying so and how to pick the other.
    """
    personal = config.daemon.runtime_dir / SOCKET_NAME
    lab = config.lab.socket
    if config.lab.enabled or config.client.daemon == "lab":
        return DaemonChoice(lab, lab=True)
    if config.client.daemon == "personal" or not _is_socket(lab):
        return DaemonChoice(personal, lab=False)
    notice = None
    if _is_socket(personal):
        notice = (
            f"using the lab daemon ({lab}); your personal daemon ({personal}) also runs: "
            'GPUQ_DAEMON=personal (or [client] daemon = "personal") talks to it'
        )
    return DaemonChoice(lab, lab=True, notice=notice)


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def daemon_log_path(config: Config) -> Path:
    """Where a daemon started on demand writes its log."""
    return config.daemon.state_dir / "daemon.log"


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def _daemon_pid_hint(path: Path) -> str:
    """The daemon's pid from its lock file beside the socket, or `PID`."""
    pid, _ = _lock_record(path)
    return pid or "PID"


def _lock_record(path: Path) -> tuple[str, bool]:
    """The pid in the lock file beside the socket ("" if none), and whether it has listened."""
    try:
        words = (path.parent / LOCK_NAME).read_text(errors="replace").split()
    except OSError:
        return "", False
    pid = words[0] if words and words[0].isdigit() else ""
    return pid, bool(pid) and words[1:2] == [statelock.LISTENING]


OTHER_CONFIG_HINT = "gpuq daemon restart starts it on this command's"
"""What to do when `Client.other_config` speaks: the daemon reads its config only at start."""


class ConnectionLost(DaemonUnavailable):
    """The daemon closed or dropped the connection of a request it had not answered.

    A daemon restarting (`gpuq daemon restart`, an upgrade) does that to
    every waiting client; `reconnect` finds it again.
    """


class Client:
    """One connection to the daemon, after a successful hello."""

    def __init__(
        self,
        sock: socket.socket,
        hello: dict[str, Any] | None,
        timeout: float = 10.0,
        path: Path | None = None,
    ) -> None:
        self._sock = sock
        self._file = sock.makefile("rb")
        self._next_id = 1
        self._timeout = timeout
        self._path = path
        self._hello = hello
        self.notice: str | None = None
        """Something the user should know about the daemon chosen (`choose_daemon`)."""
        self.lab = False
        """Whether the daemon is a lab's, which runs the lab's config, not the user's."""

    @property
    def hello(self) -> dict[str, Any]:
        """The daemon's answer to the handshake (pid, version, node).

        The hello is sent on connect but its answer is read only when first
        needed, after the first request has been sent too: a command then
        costs the daemon one round trip, not two.
        """
        if self._hello is None:
            try:
                self._hello = self._read_result(0)
            except DaemonUnavailable as exc:
                if "did not answer" in exc.message:
                    raise _timed_out(self._path, self._timeout) from None
                raise
        return self._hello

    @property
    def greeted(self) -> bool:
        """True once the daemon has answered the handshake on this connection."""
        return self._hello is not None

    @classmethod
    def connect(
        cls, config: Config, *, autostart: bool = True, timeout: float | None = None
    ) -> Client:
        """Connect to the daemon, starting it first if none is running.

        `timeout` (default: the config's `[client] timeout`) bounds every
        wait for the daemon: connecting, and each reply or heartbeat.
        """
        choice = choose_daemon(config)
        seconds = config.client.timeout if timeout is None else timeout
        sock = connect_socket(config, autostart=autostart, timeout=seconds)
        client = cls._greet(sock, seconds, choice.path)
        client.notice = choice.notice
        client.lab = choice.lab
        return client

    def other_config(self, config: Config) -> str | None:
        """What to tell a user whose daemon runs another config file than `config`'s, or None.

        `OTHER_CONFIG_HINT` says what to do about it.

        A daemon started by a command with `--config test.toml` goes on
        serving every later command, which would silently get its GPUs and
        policy. Known once the hello is answered; a lab daemon runs the
        lab's file, and a daemon that predates the key does not say.
        """
        if self._hello is None or self.lab or "config" not in self._hello:
            return None
        theirs = self._hello["config"]
        ours = None if config.source is None else str(config.source)
        if theirs == ours or (theirs is not None and ours is not None and _same_file(theirs, ours)):
            return None
        return (
            f"the daemon runs on {theirs or 'the built-in defaults'}, not on "
            f"{ours or 'the built-in defaults'} as this command does"
        )

    @classmethod
    def _open(cls, path: Path, timeout: float) -> Client:
        """Connect and send the hello; FileNotFoundError/ConnectionRefusedError mean "no daemon".

        Any other failure is a GpuqError (`open_socket`).
        """
        return cls._greet(open_socket(path, timeout), timeout, path)

    @classmethod
    def _greet(cls, sock: socket.socket, timeout: float, path: Path) -> Client:
        """The client on a connected socket, its hello sent (the answer is read when needed)."""
        client = cls(sock, None, timeout, path)
        try:
            client._send(0, "hello", {"version": PROTOCOL_VERSION})
        except BaseException:
            client.close()
            raise
        return client

    def close(self) -> None:
        """Close the connection."""
        self._file.close()
        self._sock.close()

    def interrupt(self) -> None:
        """Shut the connection down from another thread; a read blocked on it returns at once."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one request and return its result; events are discarded."""
        for item in self.stream(method, **params):
            if item[0] == "result":
                return item[1]
        raise ProtocolError("the daemon closed the stream without a result")  # pragma: no cover

    def stream(self, method: str, **params: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ("event", e) for each event, then ("result", r); heartbeats are absorbed."""
        request_id = self._next_id
        self._next_id += 1
        self._send(request_id, method, params)
        _ = self.hello  # the handshake's answer comes first (a version mismatch raises here)
        while True:
            envelope = self._read(request_id)
            if envelope.event is not None:
                if envelope.event.get("type") != HEARTBEAT_EVENT:
                    yield "event", envelope.event
            elif envelope.result is not None:
                yield "result", envelope.result
                return

    def _send(self, request_id: int, method: str, params: dict[str, Any]) -> None:
        try:
            self._sock.sendall(encode({"id": request_id, "method": method, "params": params}))
        except TimeoutError:
            raise _timed_out(None, self._timeout) from None
        except OSError as exc:
            raise ConnectionLost(
                f"lost the connection to the daemon: {exc.strerror or exc}",
                "is it still running? gpuq daemon status",
            ) from None

    def _read_result(self, request_id: int) -> dict[str, Any]:
        envelope = self._read(request_id)
        if envelope.result is None:
            raise ProtocolError("expected a result from the daemon")
        return envelope.result

    def _read(self, request_id: int) -> Envelope:
        try:
            line = self._file.readline(MAX_REPLY_BYTES)
        except TimeoutError:
            raise _timed_out(None, self._timeout) from None
        except OSError as exc:
            raise ConnectionLost(
                f"lost the connection to the daemon: {exc.strerror or exc}",
                "is it still running? gpuq daemon status",
            ) from None
        if not line:
            raise ConnectionLost(
                "the daemon closed the connection", "is it still running? gpuq daemon status"
            )
        try:
            envelope = parse_reply(decode(line))
        except ProtocolError as exc:
            raise ProtocolError(
                f"the daemon sent something that is not a gpuq reply ({exc.message})",
                "is something other than a gpuq daemon listening? gpuq doctor checks the set-up",
            ) from None
        if envelope.error is not None:
            raise from_wire(envelope.error)
        if envelope.id != request_id:
            raise ProtocolError(f"reply for request {envelope.id!r}, expected {request_id}")
        return envelope


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


RECONNECT_SECONDS = 60.0
"""How long a wait or a followed log looks for a daemon that went away (a restart takes seconds)."""


def reconnect(config: Config, lost: ConnectionLost, seconds: float = RECONNECT_SECONDS) -> Client:
    """A new connection, once the daemon that dropped `lost`'s answers again; never starts one.

    Raises DaemonUnavailable, saying so, when no daemon answers within
    `seconds` (it was stopped, not restarted).
    """
    deadline = time.monotonic() + seconds
    while True:
        client = None
        try:
            client = Client.connect(config, autostart=False)
            _ = client.hello  # a daemon still shutting down may take the connection and close it
        except DaemonUnavailable:
            if client is not None:
                client.close()
            if time.monotonic() >= deadline:
                raise DaemonUnavailable(
                    f"{lost.message}, and no daemon answered within {seconds:.0f} s",
                    "is it still running? gpuq daemon status",
                ) from None
            time.sleep(0.2)
            continue
        except BaseException:
            if client is not None:
                client.close()
            raise
        return client


def wait_jobs(
    config: Config,
    ids: list[int],
    *,
    any_job: bool = False,
    timeout: float | None = None,
    on_lost: Callable[[ConnectionLost], None] = lambda _: None,
    client: Client | None = None,
) -> list[dict[str, Any]]:
    """The `wait` request, carried across daemon restarts: the jobs as they ended.

    Jobs outlive their daemon, so a wait does too: when the connection is
    lost, `on_lost` is told (to say so), and the wait goes on on a new one
    with the time it has left. `client`, if given, is used first and closed.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    current = Client.connect(config) if client is None else client
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                jobs: list[dict[str, Any]] = current.call(
                    "wait", ids=ids, any=any_job, timeout=left
                )["jobs"]
            except ConnectionLost as lost:
                if not current.greeted:
                    raise  # refused at the handshake: not a restart
                on_lost(lost)
                current.close()
                current = reconnect(config, lost)
                continue
            return jobs
    finally:
        current.close()


def connect_socket(config: Config, *, autostart: bool = True, timeout: float) -> socket.socket:
    """A connected socket to the daemon of `config`, started first if none runs; nothing sent.

    `Client.connect` sends the handshake on it; `gpuq bridge` relays bytes
    through it, and the client at the bridge's other end sends its own.
    """
    choice = choose_daemon(config)
    if choice.lab:
        return open_lab_socket(choice.path, timeout)
    path = choice.path
    try:
        return open_socket(path, timeout)
    except (FileNotFoundError, ConnectionRefusedError):
        _check_not_squatted(path)
        if not autostart:
            if (held := statelock.holder(config.daemon.state_dir)) is not None:
                # A daemon runs, but not where this command looks, or its socket is gone.
                raise statelock.in_use(
                    config.daemon.state_dir, config.daemon.runtime_dir, held
                ) from None
            raise DaemonUnavailable(
                f"no gpuq daemon is running ({path})", "start one: gpuq daemon start"
            ) from None
    start_daemon(config)
    try:
        return open_socket(path, timeout)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise DaemonUnavailable(
            f"the gpuq daemon started but its socket {path} refuses connections ({exc})",
            f"see {daemon_log_path(config)}; gpuq doctor checks the set-up",
        ) from None


def open_socket(path: Path, timeout: float) -> socket.socket:
    """Connect to the daemon socket at `path`, after checking it is this user's; nothing sent.

    FileNotFoundError and ConnectionRefusedError mean "no daemon". Any other
    failure is a GpuqError: an unsafe runtime directory, a listener that is
    not this user's, a daemon that does not answer.
    """
    if path.parent.exists() or path.parent.is_symlink():
        check_private_dir(path.parent)
    return _connect(
        path,
        timeout,
        _check_listener,
        "the gpuq daemon",
        "is it running? gpuq daemon status; gpuq doctor checks the set-up",
    )


def _connect(
    path: Path,
    timeout: float,
    check: Callable[[socket.socket, Path], None],
    what: str,
    hint: str,
) -> socket.socket:
    """Connect to `path` and `check` its listener; nothing sent.

    FileNotFoundError and ConnectionRefusedError pass through ("no daemon");
    another failure to connect is a DaemonUnavailable naming `what`, with `hint`.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        check(sock, path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        raise
    except TimeoutError:
        sock.close()
        raise _timed_out(path, timeout) from None
    except OSError as exc:
        sock.close()
        raise DaemonUnavailable(
            f"cannot talk to {what} on {path}: {exc.strerror or exc}", hint
        ) from None
    except BaseException:
        sock.close()
        raise
    return sock


def open_lab_socket(path: Path, timeout: float) -> socket.socket:
    """Connect to the lab's system daemon at `path`; nothing sent.

    Its directory must be root's (or this user's) and writable by no one
    else, and the listener must be root (or this user, for a test lab),
    so nobody can stand in for the lab daemon. It is never started here.
    """
    _check_lab_dir(path.parent)
    try:
        return _connect(
            path,
            timeout,
            _check_lab_listener,
            "the lab daemon",
            "ask the lab's admin; gpuq doctor checks the set-up",
        )
    except (FileNotFoundError, ConnectionRefusedError):
        raise DaemonUnavailable(
            f"the lab daemon is not running ({path})",
            "ask the lab's admin (systemctl status gpuq); GPUQ_DAEMON=personal uses your own "
            "daemon instead",
        ) from None


def _check_lab_listener(sock: socket.socket, path: Path) -> None:
    """Refuse a lab socket whose listener is neither root nor this user."""
    uid = peer_uid(sock)
    if uid not in (0, os.getuid()):
        raise DaemonUnavailable(
            f"the process listening on {path} runs as uid {uid}, not as root; "
            "nothing was sent to it",
            "the lab daemon runs as root: tell the lab's admin",
        )


def _check_lab_dir(directory: Path) -> None:
    """Refuse a lab socket directory that someone other than root (or us) could have made."""
    try:
        info = directory.lstat()
    except FileNotFoundError:
        return  # no daemon: connecting says so
    except OSError as exc:
        raise DaemonUnavailable(f"cannot inspect {directory}: {exc.strerror}") from None
    if (
        not stat.S_ISDIR(info.st_mode)
        or info.st_uid not in (0, os.getuid())
        or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise DaemonUnavailable(
            f"{directory} is not a directory of root's that only root can write: "
            "refusing to use a lab socket in it",
            "someone may be standing in for the lab daemon: tell the lab's admin",
        )


def _check_not_squatted(path: Path) -> None:
    """Refuse to start a daemon whose socket path holds something that is not a socket."""
    with contextlib.suppress(OSError):
        require_socket_or_nothing(path, "run the command again")


def _check_listener(sock: socket.socket, path: Path) -> None:
    """Refuse a socket whose listening process is not this user's (before sending anything)."""
    uid = peer_uid(sock)
    if uid != os.getuid():
        raise DaemonUnavailable(
            f"the process listening on {path} runs as uid {uid}, not as you (uid {os.getuid()}); "
            "nothing was sent to it",
            "another user may be trying to intercept your jobs: remove the socket and its "
            "directory (ask an administrator), or set XDG_RUNTIME_DIR or GPUQ_RUNTIME_DIR "
            "to a private directory",
        )


def _timed_out(path: Path | None, timeout: float) -> DaemonUnavailable:
    """The error for a daemon that stopped answering."""
    pid = "PID" if path is None else _daemon_pid_hint(path)
    return DaemonUnavailable(
        f"the gpuq daemon did not answer within {timeout:g}s",
        f"is it stopped (kill -CONT {pid}) or overloaded? gpuq daemon status; "
        "raise [client] timeout in the config to wait longer",
    )


def start_daemon(config: Config) -> int:
    """Start a detached daemon for `config` and wait until it answers.

    Two clients racing to start one is harmless: the loser's daemon finds the
    instance lock taken and exits, and both clients reach the winner.
    """
    ensure_private_dir(config.daemon.state_dir)
    log_path = daemon_log_path(config)
    try:
        log_start = log_path.stat().st_size
    except OSError:
        log_start = 0
    command = [sys.executable, "-m", "gpuq.daemon"]
    if config.source is not None:
        command += ["--config", str(config.source)]
    try:
        log_fd = os.open(
            log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        raise _log_refused(log_path, exc) from None
    try:
        proc = subprocess.Popen(  # noqa: S603
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            start_new_session=True,
            cwd="/",
            env=_daemon_environment(os.environ),
        )
    finally:
        os.close(log_fd)
    path = socket_path(config)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        code = proc.poll()
        if code is not None and code != 0:
            if not _another_daemon_starts(path, proc.pid):
                raise _start_failure(log_path, log_start, code, config.daemon.state_dir)
            if _lock_record(path)[1] and not os.path.exists(path):
                raise _unreachable(path)  # it listened once; its socket is gone
        try:
            with Client._open(path, config.client.timeout) as client:
                _ = client.hello  # answered: the daemon is up
            return proc.pid
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        except GpuqError:
            if proc.poll() is None:
                raise
            continue  # the daemon just failed: report its own error
        time.sleep(0.02)
    if proc.poll() is not None and _another_daemon_starts(path, proc.pid):
        raise _unreachable(path)
    raise DaemonUnavailable(
        f"the gpuq daemon did not answer within {START_TIMEOUT:.0f}s", f"see {log_path}"
    )


def _daemon_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a started daemon gets: its directory overrides made absolute.

    A relative `GPUQ_STATE_DIR` or `GPUQ_RUNTIME_DIR` is relative to where the
    command runs; the daemon runs in `/`, where it would name other
    directories, and so another queue and another socket.
    """
    env = dict(environ)
    for name in (STATE_DIR_ENV, RUNTIME_DIR_ENV):
        if env.get(name):
            env[name] = os.path.abspath(os.path.expanduser(env[name]))
    return env


def _full(directory: Path) -> bool:
    """Whether the filesystem of `directory` has no block left for this user."""
    try:
        info = os.statvfs(directory)
    except OSError:
        return False
    return (info.f_bfree if os.geteuid() == 0 else info.f_bavail) == 0


def _unreachable(path: Path) -> DaemonUnavailable:
    """The error for a daemon that holds the runtime directory's lock but cannot be reached."""
    holder = _daemon_pid_hint(path)
    return DaemonUnavailable(
        f"gpuq daemon {holder} holds {path.parent} but does not answer on {path}",
        f"was its socket removed? stop it (kill {holder}) and run the command again",
    )


def _another_daemon_starts(path: Path, ours: int) -> bool:
    """Whether a daemon other than `ours` holds the instance lock beside the socket.

    Then ours lost a race to start (another command started one at the
    same moment) and the winner, which may not listen yet, is the one to reach.
    """
    holder, _ = _lock_record(path)
    if not holder or int(holder) == ours:
        return False
    try:
        os.kill(int(holder), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _log_refused(log_path: Path, exc: OSError) -> StateError:
    """The state directory's fault that the daemon's log cannot be opened, with what to do."""
    hints = {
        errno.EROFS: "its filesystem is read-only: remount it read-write",
        errno.ENOSPC: f"its filesystem is full: free some space (df -h {log_path.parent})",
        errno.ELOOP: "it is a symbolic link, which gpuq does not follow: move it away",
        errno.EACCES: f"make it writable by you, or move it away (ls -l {log_path})",
    }
    return StateError(
        f"cannot open the daemon log {log_path}: {exc.strerror}",
        hints.get(exc.errno or 0, "is it a symbolic link or not writable? move it away"),
    )


def _start_failure(log_path: Path, start: int, code: int, state_dir: Path) -> GpuqError:
    """Why the daemon this command started exited: its own error and hint, from its log.

    The error keeps its kind (NVML unusable, the state directory unusable)
    where the daemon wrote its code, else it is a DaemonUnavailable. A
    daemon on a full disk cannot write its log either: then the disk is
    looked at here.
    """
    try:
        with open(log_path, "rb") as log:
            log.seek(start)
            lines = log.read(64 * 1024).decode(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    for number in range(len(lines) - 1, -1, -1):
        if lines[number].startswith(DAEMON_ERROR):
            after = lines[number + 1 : number + 3]
            hints = [line.removeprefix("hint: ") for line in after if line.startswith("hint: ")]
            kinds = [
                c.removeprefix(DAEMON_ERROR_CODE) for c in after if c.startswith(DAEMON_ERROR_CODE)
            ]
            error = from_wire(
                {
                    "code": kinds[0] if kinds else DaemonUnavailable.code,
                    "message": "the gpuq daemon could not start: "
                    + lines[number].removeprefix(DAEMON_ERROR),
                    "hint": hints[0] if hints else f"see {log_path}",
                }
            )
            if type(error) is GpuqError:  # an internal error, or a code this client does not know
                return DaemonUnavailable(error.message, error.hint)
            return error
    if not lines and _full(state_dir):
        return StateError(
            f"the gpuq daemon could not start: the filesystem of {state_dir} is full "
            "(the daemon could not even write its log)",
            f"free some space there (df -h {state_dir}), then start again; the queue is intact",
        )
    tail = " | ".join(lines[-3:]) if lines else "(nothing in its log)"
    return DaemonUnavailable(
        f"the gpuq daemon failed to start (exit {code}): {tail}",
        f"see {log_path}; gpuq doctor checks the set-up",
    )


def running_daemon_pid(config: Config) -> int | None:
    """The pid of the daemon answering on this configuration's socket, or None."""
    try:
        with Client._open(socket_path(config), config.client.timeout) as client:
            return int(client.hello.get("pid", 0)) or None
    except (FileNotFoundError, ConnectionRefusedError, GpuqError):
        return None
