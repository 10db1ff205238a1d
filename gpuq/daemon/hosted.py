"""Attempts this daemon runs for other servers' daemons: the far half of a `RemoteNode`.

A head daemon (the one where a user submitted) reaches this one over `ssh
HOST gpuq bridge` and asks it to launch, signal and report attempts of the
head's jobs (the `node.*` requests). Each head gets its own executor below
`<state_dir>/hosted/<head>/jobs/<job id>/` and its own log directory
`<log_dir>/hosted/<head>/`, so the head's job ids never meet this daemon's.

The head is the truth about which attempts should run: each `node.sync`
names the attempts it expects here, and the reply says what each is doing
(starting, running, ended with its outcome, or missing) and which live
attempts it no longer expects, which the head then stops (an attempt it
superseded while this server was cut off). Nothing lives only in memory:
a restarted daemon finds its hosted attempts again from their shims'
records (`recover`). The GPUs lent to hosted attempts are taken out of this
daemon's own scheduling (`lent_gpus`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import os
import pwd
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuq import env as job_env
from gpuq.control import ACK_FILE, OOM_FILE, Ack, Hello, Message, Metrics, to_dict
from gpuq.daemon import incoming, jobfiles
from gpuq.daemon.control import METRICS_INTERVAL, ControlHub
from gpuq.daemon.executor import Executor, LaunchSpec, Outcome, lab_owner
from gpuq.daemon.outputs import (
    USERS_DIR,
    OutputError,
    log_name,
    open_for_reading,
    seek_to,
    tail_offset,
    user_log_dir,
    write_carried,
)
from gpuq.daemon.spawner import Spawned, SpawnerClient
from gpuq.errors import ConflictError, NotFoundError, PermissionDenied, StateError, UsageError
from gpuq.gpus import JobHolding

log = logging.getLogger("gpuq.daemon")

HEAD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
"""A head's node name: it names a directory, so no '/' and no leading '.'."""
MAX_WAIT_SECONDS = 30.0
"""The longest a `node.sync` waits for a change: below any client's timeout."""
RECORDS = (f"{jobfiles.CHECKPOINTS}/{ACK_FILE}", f"{jobfiles.CHECKPOINTS}/{OOM_FILE}")
"""What an ended attempt's report carries of its files: how it checkpointed, or ran out."""
MAX_OUTBOX = 10_000
"""Runner messages kept for a head that does not collect them; the oldest go first."""


def check_head(head: str) -> str:
    """`head` if it can name a directory of its own, else UsageError."""
    if not HEAD_NAME.fullmatch(head):
        raise UsageError(
            f"invalid head node name {head!r}",
            "a node name is letters, digits, '.', '_' and '-', not starting with '.' or '-'",
        )
    return head


@dataclass
class Attempt:
    """One hosted attempt as this daemon knows it."""

    head: str
    job: int
    attempt: int
    gpus: tuple[str, ...]
    pid: int | None = None
    """The shim's pid once it runs."""
    outcome: Outcome | None = None
    """How it ended, once it has."""


class Hosted:
    """The attempts of other daemons' jobs that run here (module docstring)."""

    def __init__(
        self,
        root: Path,
        log_root: Path,
        spawner: SpawnerClient | None,
        control_root: Path | None = None,
        metrics_interval: float | Callable[[], float] = METRICS_INTERVAL,
        service_account: Callable[[], str] = lambda: "",
    ) -> None:
        self.root = root
        self.service_account = service_account
        """The lab's service account (`[lab] service_account`), as the config says now."""
        self.log_root = log_root
        self.spawner = spawner
        self.control_root = control_root or root / "ctl"
        self.metrics_interval = metrics_interval
        self.attempts: dict[tuple[str, int], Attempt] = {}
        self.version = 0
        """Bumped when an attempt starts or ends, or a runner speaks: `node.sync` waits on it."""
        self._changed = asyncio.Event()
        self._executors: dict[str, Executor] = {}
        self._hubs: dict[str, ControlHub] = {}
        self._outbox: dict[str, list[dict[str, Any]]] = {}
        self._dirs_asked: dict[str, frozenset[str]] = {}
        self._owners: dict[tuple[str, int], int] = {}
        """The user each attempt runs as, where not this daemon's own (a lab's job)."""
        self._seq = 0
        self.outbox_id = secrets.token_hex(8)
        """Names this daemon's run: a head that sees it change counts messages afresh."""

    def hub(self, head: str) -> ControlHub:
        """The control sockets of `head`'s attempts; what their runners say waits in its outbox."""
        hub = self._hubs.get(head)
        if hub is None:
            hub = ControlHub(self.control_root / check_head(head), self.metrics_interval)
            hub.listener = _Relay(self, head)
            hub.owner_of = lambda job: self._owners.get((head, job))
            self._hubs[head] = hub
        return hub

    def new_dirs(self, head: str, dirs: tuple[str, ...]) -> bool:
        """True when `head` asks about a directory its previous sync did not name."""
        previous = self._dirs_asked.get(head, frozenset())
        self._dirs_asked[head] = frozenset(dirs)
        return not previous.issuperset(dirs)

    def relay(self, head: str, job: int, message: Message) -> None:
        """Keep a runner's message for `head`'s next sync."""
        self._seq += 1
        outbox = self._outbox.setdefault(head, [])
        outbox.append({"seq": self._seq, "job": job, "message": to_dict(message)})
        del outbox[:-MAX_OUTBOX]
        self._bump()

    def control_send(self, head: str, job: int, attempt: int, message: Message) -> bool:
        """Pass the head's message to the attempt's runner; False if none is connected."""
        record = self.attempts.get((head, job))
        if record is None or record.attempt != attempt or record.outcome is not None:
            return False
        return self.hub(head).send(job, message)

    def executor(self, head: str) -> Executor:
        """The executor of `head`'s attempts (its jobs directory is made on first use)."""
        executor = self._executors.get(head)
        if executor is None:
            executor = Executor(self.root / check_head(head) / "jobs", self.spawner)
            self._executors[head] = executor
        return executor

    def make_log_dir(self, head: str) -> Path:
        """`head`'s directory of default logs here, made if missing (owner only)."""
        path = self.log_root / check_head(head)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def service_ids(self) -> tuple[int, int] | None:
        """(uid, gid) of the lab's service account on a root daemon; None without one."""
        name = self.service_account()
        if not name or os.geteuid() != 0:
            return None
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return entry.pw_uid, entry.pw_gid

    def prepare_incoming(self, head: str, job: int) -> Path:
        """An empty directory for the job's checkpoints arriving from another server; its path.

        On a lab's server the copy arrives as the service account: it may
        pass through the daemon's directories (0711) to that directory, its
        own, and nowhere else.
        """
        job_dir = self.executor(head).jobs_dir / str(job)
        arrived = incoming.prepare(job_dir)
        service = self.service_ids()
        if service is not None:
            self.open_to_users(head)
            for directory in (job_dir.parent, job_dir):
                os.chmod(directory, 0o711, follow_symlinks=False)
            os.chown(arrived, *service, follow_symlinks=False)
        return arrived

    def open_to_users(self, head: str) -> None:
        """Let users pass (0711) through the directories of `head`'s attempts to what is theirs.

        A lab's job runs as its owner (`run_as`): it reaches its own log
        directory, checkpoints and control socket below these by name, and
        can neither list them nor put anything in them. Raises OSError.
        """
        for directory in (
            self.root,
            self.root / check_head(head),
            self.log_root,
            self.make_log_dir(head),
            self.control_root,
        ):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(directory, 0o711, follow_symlinks=False)

    def paths(self, head: str) -> dict[str, str]:
        """Where `head`'s attempts keep their directories, default logs and control sockets."""
        return {
            "jobs_dir": str(self.root / check_head(head) / "jobs"),
            "log_dir": str(self.log_root / head),
            "control_dir": str(self.control_root / head),
        }

    # -- acting on attempts ----------------------------------------------

    async def launch(
        self, head: str, job: int, attempt: int, spec: LaunchSpec, gpus: tuple[str, ...]
    ) -> int:
        """Start the attempt and return its shim's pid; GpuqError says why it cannot run."""
        key = (head, job)
        current = self.attempts.get(key)
        if current is not None and current.outcome is None:
            if current.attempt == attempt and current.pid is not None:
                return current.pid  # the head asked again after losing the reply
            raise ConflictError(
                f"job {job} of {head} already runs here (attempt {current.attempt})",
                "the head stops a superseded attempt before starting another",
            )
        executor = self.executor(head)
        account = spec.run_as if os.geteuid() == 0 else None
        if account is not None and account.uid != 0:
            try:
                self.open_to_users(head)
                logs = self.log_root / head  # made by open_to_users
                if str(logs / USERS_DIR / str(account.uid)) in spec.create_below.values():
                    user_log_dir(logs, account.uid, account.gid)
            except OSError as exc:
                raise StateError(f"cannot prepare the directories of job {job}: {exc}") from exc
            self._owners[key] = account.uid
            service = self.service_ids()
            executor.checkpoint_reader = None if service is None else service[1]
        if job_env.CONTROL_SOCKET in spec.env:  # the head wants to talk to its runner
            environ = dict(spec.env)
            path = self.hub(head).open(job)
            if path is None:
                del environ[job_env.CONTROL_SOCKET]
            else:
                environ[job_env.CONTROL_SOCKET] = str(path)
            spec = dataclasses.replace(spec, env=environ)
        if spec.stdout.startswith(str(self.log_root)) or spec.stderr.startswith(str(self.log_root)):
            self.make_log_dir(head)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Spawned] = loop.create_future()
        record = Attempt(head, job, attempt, gpus)
        self.attempts[key] = record
        try:
            executor.launch(job, spec, answer.set_result)
            spawned = await answer
        except OSError as exc:
            self._drop(key)
            raise StateError(f"cannot write the files of job {job} here: {exc}") from exc
        except RuntimeError as exc:
            self._drop(key)
            raise ConflictError(str(exc)) from exc
        if spawned.pid is None:
            self._drop(key)
            raise StateError(f"the job's supervisor did not start: {spawned.error}")
        record.pid = spawned.pid
        executor.watch(loop, job, spawned.pid, self._on_exit(head), spawned.pidfd)
        self._bump()
        log.info("job %d of %s: attempt %d started (shim %d)", job, head, attempt, spawned.pid)
        return spawned.pid

    def _drop(self, key: tuple[str, int]) -> None:
        """Forget an attempt that never started, and its control socket."""
        del self.attempts[key]
        self.hub(key[0]).close(key[1])
        self._owners.pop(key, None)

    def signal(self, head: str, job: int, attempt: int, signum: int) -> bool:
        """Signal the attempt's process tree; False when it is not that attempt or not running."""
        record = self.attempts.get((head, job))
        if record is None or record.attempt != attempt or record.outcome is not None:
            return False
        return self.executor(head).signal(job, signum)

    def _on_exit(self, head: str) -> Any:
        def ended(job: int, outcome: Outcome) -> None:
            record = self.attempts.get((head, job))
            if record is not None:
                record.outcome = outcome
            self.hub(head).close(job)
            self._owners.pop((head, job), None)
            self._bump()

        return ended

    def _bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_change(self, version: int, timeout: float) -> None:
        """Return once `version` is not the current one, or after `timeout` seconds."""
        if version != self.version or timeout <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), min(timeout, MAX_WAIT_SECONDS))

    # -- reporting -------------------------------------------------------

    def report(self, head: str, expect: Mapping[int, int], acked: int = -1) -> dict[str, Any]:
        """Each expected attempt's state, live attempts `head` no longer expects, runners' news.

        Runners' messages are those after `acked`, the last one the head
        took in. Ended attempts the head no longer expects are forgotten:
        it has recorded them.
        """
        outbox = self._outbox.get(head, [])
        outbox[:] = [item for item in outbox if item["seq"] > acked]
        attempts: dict[str, Any] = {}
        for job, attempt in expect.items():
            attempts[str(job)] = {**self._state_of(head, job, attempt), "attempt": attempt}
        stale = []
        for (owner, job), record in list(self.attempts.items()):
            if owner != head or job in expect:
                continue
            if record.outcome is None:
                stale.append({"job": job, "attempt": record.attempt, "pid": record.pid})
            else:
                del self.attempts[(owner, job)]
        return {
            "attempts": attempts,
            "stale": stale,
            "messages": list(outbox),
            "outbox": self.outbox_id,
            "version": self.version,
        }

    def _state_of(self, head: str, job: int, attempt: int) -> dict[str, Any]:
        record = self.attempts.get((head, job))
        if record is not None and record.attempt == attempt:
            if record.outcome is not None:
                return self._ended(head, job, record.outcome)
            if record.pid is None:
                return {"state": "starting"}
            runner = self.hub(head).runner(job) is not None
            return {"state": "running", "pid": record.pid, "runner": runner}
        if record is not None and record.outcome is None:
            return {"state": "missing", "reason": f"attempt {record.attempt} runs here instead"}
        executor = self.executor(head)
        launch = executor.jobs_dir / str(job) / jobfiles.LAUNCH
        recorded = jobfiles.read_json(launch)
        if recorded is None or _attempt_of(recorded) != attempt:
            return {"state": "missing", "reason": "this server never started that attempt"}
        if executor.has_exit_record(job):  # ended before this daemon last started
            return self._ended(head, job, executor.outcome(job))
        return {"state": "missing", "reason": "its supervisor is gone without a record"}

    def _ended(self, head: str, job: int, outcome: Outcome) -> dict[str, Any]:
        """An ended attempt's report, with the records the head reads of it (`RECORDS`)."""
        job_dir = self.executor(head).jobs_dir / str(job)
        records = {name: jobfiles.read_json(job_dir / name) for name in RECORDS}
        return {
            "state": "ended",
            "outcome": outcome.to_dict(),
            "records": {name: data for name, data in records.items() if data is not None},
        }

    def lent_gpus(self) -> set[str]:
        """GPUs held by live hosted attempts: not this daemon's to place."""
        return {uuid for a in self.attempts.values() if a.outcome is None for uuid in a.gpus}

    def pgids(self) -> dict[int, tuple[str, int]]:
        """Process group -> (head, job) of every live hosted attempt whose command runs."""
        found = {}
        for (head, job), record in self.attempts.items():
            if record.outcome is not None:
                continue
            child = jobfiles.read_json(self.executor(head).jobs_dir / str(job) / jobfiles.CHILD)
            if jobfiles.is_same_process(child):
                assert child is not None
                found[int(child["pgid"])] = (head, job)
        return found

    def holdings(self) -> dict[int, JobHolding]:
        """What hosted attempts hold, for a fake GPU backend (keys below zero: not job ids)."""
        held = {}
        for index, (pgid, (head, job)) in enumerate(sorted(self.pgids().items())):
            record = self.attempts[(head, job)]
            if record.gpus:
                held[-1 - index] = JobHolding(pgid, record.gpus, 0, True)
        return held

    def read(
        self,
        head: str,
        job: int,
        stream: str,
        offset: int,
        limit: int,
        tail: int | None,
        raw: bool = False,
    ) -> dict[str, Any]:
        """Bytes of an attempt's output from `offset` (or its last `tail` lines), as text.

        With `raw`, the bytes as they are, in base64 (a copy of the file).
        """
        if stream not in ("stdout", "stderr"):
            raise UsageError(f"unknown stream {stream!r}", "use stdout or stderr")
        if offset < 0:
            raise UsageError(f"node.read's offset is {offset}", "give 0 or more")
        recorded = jobfiles.read_json(self.executor(head).jobs_dir / str(job) / jobfiles.LAUNCH)
        if recorded is None:
            raise NotFoundError(f"job {job} of {head} never ran here")
        path = str(recorded.get(stream) or "")
        run_as = recorded.get("run_as")
        owner = run_as.get("uid") if isinstance(run_as, dict) else None
        try:
            opened = open_for_reading(path, lab_owner(owner if isinstance(owner, int) else None))
        except OutputError as exc:
            hint = "a job's output is read only from its own files"
            raise PermissionDenied(str(exc), hint) from None
        if opened is None:
            return {"data": "", "offset": offset, "size": 0, "path": path}
        with opened as handle:
            if tail is not None:
                offset = tail_offset(handle, tail)
            reading = seek_to(handle, offset)  # past the end: nothing there yet
            data = handle.read(max(0, min(limit, 4 * 1024 * 1024))) if reading else b""
            size = os.fstat(handle.fileno()).st_size
        return {
            "data": base64.b64encode(data).decode() if raw else data.decode(errors="replace"),
            "offset": offset + len(data),
            "size": size,
            "path": path,
        }

    def put_output(
        self, head: str, job: int, stream: str, uid: int, offset: int, data: bytes
    ) -> int:
        """Write part of a moved lab job's earlier output to its default log here; its length.

        The file is the one the job's attempt here will append to: in the
        user's own directory below `head`'s log directory, the user's and
        private to them (`outputs.write_carried`). Refused while an attempt
        of the job runs here, and for root's or an unknown uid.
        """
        if stream not in ("stdout", "stderr"):
            raise UsageError(f"unknown stream {stream!r}", "use stdout or stderr")
        current = self.attempts.get((head, job))
        if current is not None and current.outcome is None:
            raise ConflictError(
                f"job {job} of {head} runs here: its output is its own",
                "the head copies a job's output before the attempt that appends to it",
            )
        if lab_owner(uid) is None:
            raise PermissionDenied(
                f"uid {uid} does not run its jobs as itself here",
                "only a lab job's output, written by the root daemon for its owner, is copied",
            )
        try:
            account = pwd.getpwuid(uid)
        except KeyError:
            raise NotFoundError(f"uid {uid} has no account on this server") from None
        try:
            self.open_to_users(head)
            directory = user_log_dir(self.log_root / check_head(head), uid, account.pw_gid)
            return write_carried(
                directory, log_name(job, stream), uid, account.pw_gid, data, offset
            )
        except OutputError as exc:
            raise StateError(str(exc), "nothing else was written") from None
        except OSError as exc:
            raise StateError(f"cannot prepare the log directory of job {job}: {exc}") from None

    # -- a restart -------------------------------------------------------

    def recover(self, loop: asyncio.AbstractEventLoop) -> int:
        """Find the hosted attempts still running after this daemon restarted; how many."""
        found = 0
        if not self.root.is_dir():
            return 0
        for head_dir in sorted(self.root.iterdir()):
            if not HEAD_NAME.fullmatch(head_dir.name) or not (head_dir / "jobs").is_dir():
                continue
            executor = self.executor(head_dir.name)
            for job_dir in sorted((head_dir / "jobs").iterdir()):
                if not job_dir.name.isdigit():
                    continue
                job = int(job_dir.name)
                recorded = jobfiles.read_json(job_dir / jobfiles.LAUNCH)
                try:
                    pid = executor.live_shim(job, settle=2.0)
                except RuntimeError:
                    pid = None
                if recorded is None or pid is None:
                    continue
                gpus = tuple(
                    g
                    for g in str(recorded.get("env", {}).get("GPUQ_GPU_UUIDS", "")).split(",")
                    if g
                )
                self.attempts[(head_dir.name, job)] = Attempt(
                    head_dir.name, job, _attempt_of(recorded), gpus, pid
                )
                if job_env.CONTROL_SOCKET in (recorded.get("env") or {}):
                    self.hub(head_dir.name).open(job)  # its runner reconnects by itself
                executor.watch(loop, job, pid, self._on_exit(head_dir.name))
                found += 1
        return found

    def unwatch_all(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop watching (daemon shutdown: the attempts run on, found again by `recover`)."""
        for executor in self._executors.values():
            executor.unwatch_all(loop)
        for hub in self._hubs.values():
            hub.close_all()


class _Relay:
    """The listener of a head's control hub: every runner message goes to its outbox."""

    def __init__(self, hosted: Hosted, head: str) -> None:
        self.hosted, self.head = hosted, head

    def on_hello(self, job_id: int, hello: Hello) -> None:
        """A runner connected: the head learns it at its next sync."""
        self.hosted.relay(self.head, job_id, hello)

    def on_message(self, job_id: int, message: Metrics | Ack) -> None:
        """A sample or an acknowledgement, for the head."""
        self.hosted.relay(self.head, job_id, message)


def _attempt_of(launch: Mapping[str, Any]) -> int:
    return jobfiles.launch_attempt(dict(launch)) or 0
