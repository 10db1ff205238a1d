"""Lab mode: one daemon shared by real users, each acting through the real CLI.

A lab daemon (root, fake GPUs, a private socket path) serves gpuq-alice,
gpuq-bob and gpuq-carol (an admin through the gpuq-admins group). Each
abuse the issue lists is tried as a real user and must be refused with a
clear message and an audit entry. Skips unless root (tests/lab_users.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.errors import ExitCode
from gpuq.protocol import PROTOCOL_VERSION
from tests.daemon_harness import FAKE_TWO_GPUS, DaemonHarness, wait_for
from tests.lab_users import LabUser, as_user, lab_users, shared_dir

MAX_QUEUED = 40


class Lab:
    """The lab daemon under test and its users."""

    def __init__(self, daemon: DaemonHarness, users: dict[str, LabUser], socket: Path) -> None:
        self.daemon = daemon
        self.users = users
        self.socket = socket

    @property
    def alice(self) -> LabUser:
        return self.users["gpuq-alice"]

    @property
    def bob(self) -> LabUser:
        return self.users["gpuq-bob"]

    @property
    def carol(self) -> LabUser:
        return self.users["gpuq-carol"]

    def gpuq(self, user: LabUser, *args: str) -> subprocess.CompletedProcess[str]:
        """The real `gpuq` command, run as `user` against the lab daemon."""
        return as_user(
            user,
            [sys.executable, "-m", "gpuq.cli.entry", *args],
            env={"GPUQ_LAB_SOCKET": str(self.socket)},
        )

    def submit_held(self, user: LabUser, name: str) -> int:
        """A held job of `user`'s (it never starts), by the real CLI; its id."""
        result = self.gpuq(user, "submit", "-q", "--hold", "--name", name, "--", "sleep", "60")
        assert result.returncode == 0, result.stderr
        return int(result.stdout)

    def audit(self, **match: Any) -> list[dict[str, Any]]:
        """The audit entries (read as the admin) whose fields equal `match`."""
        result = self.gpuq(self.carol, "audit", "--json", "--limit", "1000")
        assert result.returncode == 0, result.stderr
        entries: list[dict[str, Any]] = json.loads(result.stdout)["entries"]
        return [e for e in entries if all(e.get(k) == v for k, v in match.items())]


@contextlib.contextmanager
def running_lab(lab_toml: str, gpus_toml: str = FAKE_TWO_GPUS) -> Iterator[Lab]:
    """A lab daemon on a private socket with `lab_toml` added to its [lab] section.

    Its directories are below one that every user may enter, as /var/lib is.
    """
    users = lab_users()
    base = shared_dir("gpuq-lab-")
    socket_path = base / "run" / "gpuq.sock"
    root = base / "daemon"
    root.mkdir(mode=0o755)
    daemon = DaemonHarness(
        root,
        gpus_toml=gpus_toml,
        extra_toml=(
            f'[lab]\nenabled = true\nsocket = "{socket_path}"\nadmins = ["@gpuq-admins"]\n'
            f"{lab_toml}"
        ),
    )
    try:
        daemon.start()
        yield Lab(daemon, users, socket_path)
    finally:
        daemon.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    with running_lab(f"hide_others = true\nmax_queued = {MAX_QUEUED}\n") as lab:
        yield lab


@pytest.fixture
def open_lab() -> Iterator[Lab]:
    """A lab daemon without limits or hiding."""
    with running_lab("") as lab:
        yield lab


def test_the_lab_socket_is_open_to_every_user_and_its_directory_to_none(lab: Lab) -> None:
    assert lab.socket.stat().st_mode & 0o777 == 0o666
    assert lab.socket.parent.stat().st_mode & 0o777 == 0o755
    assert lab.socket.parent.stat().st_uid == 0


def test_a_job_belongs_to_the_user_the_kernel_names_whatever_the_request_says(lab: Lab) -> None:
    forged = {
        "command": ["sleep", "60"],
        "cwd": lab.bob.home,
        "hold": True,
        "uid": lab.alice.uid,
        "user": lab.alice.name,
    }
    reply = raw_request(lab, lab.bob, "submit", {"spec": forged})
    job_id = reply["result"]["ids"][0]
    job = json.loads(lab.gpuq(lab.bob, "show", "--json", str(job_id)).stdout)["job"]
    assert (job["user"], job["spec"]["uid"]) == (lab.bob.name, lab.bob.uid)
    entry = lab.audit(action="submit", message=f"ids {job_id}")
    assert [(e["uid"], e["user"]) for e in entry] == [(lab.bob.uid, lab.bob.name)]


@pytest.mark.parametrize(
    ("args", "verb"),
    [
        (("cancel",), "cancel"),
        (("suspend",), "suspend"),
        (("release",), "release"),
        (("priority", "-5"), "change the priority of"),
        (("logs",), "read the logs of"),
    ],
)
def test_a_user_may_not_act_on_another_users_job(
    lab: Lab, args: tuple[str, ...], verb: str
) -> None:
    job_id = lab.submit_held(lab.alice, "alices-run")
    result = lab.gpuq(lab.bob, *args, str(job_id))
    assert result.returncode == ExitCode.PERMISSION
    assert f"job {job_id} belongs to gpuq-alice: you (gpuq-bob) may not {verb} it" in (
        result.stderr
    )
    action = "priority" if args[0] == "priority" else args[0]
    refused = lab.audit(uid=lab.bob.uid, action=action, ok=False, target=str(job_id))
    assert refused, f"no audit entry for bob's {action} of job {job_id}"
    assert "belongs to gpuq-alice" in refused[-1]["message"]
    job = json.loads(lab.gpuq(lab.alice, "show", "--json", str(job_id)).stdout)["job"]
    assert job["state"] == "held"


def test_a_user_may_lower_but_not_raise_a_priority_past_the_lab_s_limit(lab: Lab) -> None:
    # Priority classes come before fair share: raising one's own would pass every other user.
    raised = lab.gpuq(lab.alice, "submit", "-q", "--hold", "--priority", "1", "--", "true")
    assert raised.returncode == ExitCode.PERMISSION
    assert "priority 1 is above what users may give on this lab daemon (0)" in raised.stderr
    assert "hint: use --priority 0 or lower" in raised.stderr
    job_id = lab.submit_held(lab.alice, "nice")
    assert lab.gpuq(lab.alice, "priority", "-3", str(job_id)).returncode == 0
    refused = lab.gpuq(lab.alice, "priority", "3", str(job_id))
    assert refused.returncode == ExitCode.PERMISSION, refused.stderr
    assert (
        json.loads(lab.gpuq(lab.alice, "show", "--json", str(job_id)).stdout)["job"]["priority"]
        == -3
    )
    assert lab.gpuq(lab.carol, "priority", "50", str(job_id)).returncode == 0  # an admin may
    assert lab.audit(uid=lab.alice.uid, action="submit", ok=False)


def test_the_lab_s_priority_limit_is_configurable() -> None:
    with running_lab("max_priority = 5\n") as lab:
        assert (
            lab.gpuq(lab.bob, "submit", "-q", "--hold", "--priority", "5", "--", "true").returncode
            == 0
        )
        over = lab.gpuq(lab.bob, "submit", "-q", "--hold", "--priority", "6", "--", "true")
        assert over.returncode == ExitCode.PERMISSION
        assert "above what users may give on this lab daemon (5)" in over.stderr


def test_the_owner_and_an_admin_may_act_on_a_job(lab: Lab) -> None:
    mine = lab.submit_held(lab.alice, "mine")
    theirs = lab.submit_held(lab.alice, "theirs")
    assert lab.gpuq(lab.alice, "cancel", str(mine)).returncode == 0
    assert lab.gpuq(lab.carol, "cancel", str(theirs)).returncode == 0
    assert lab.audit(uid=lab.carol.uid, action="cancel", ok=True, target=str(theirs))


def test_other_users_job_names_commands_and_environment_are_hidden(lab: Lab) -> None:
    job_id = lab.submit_held(lab.alice, "secret-project")

    def seen_by(user: LabUser) -> dict[str, Any]:
        result = lab.gpuq(user, "ls", "--json")
        assert result.returncode == 0, result.stderr
        jobs: dict[int, dict[str, Any]] = {
            job["id"]: job for job in json.loads(result.stdout)["jobs"]
        }
        return jobs[job_id]

    by_bob, by_alice, by_carol = seen_by(lab.bob), seen_by(lab.alice), seen_by(lab.carol)
    assert (by_bob["name"], by_bob["spec"]["command"], by_bob["user"]) == (
        "-",
        ["-"],
        "gpuq-alice",
    )
    assert "env" not in by_bob["spec"]
    assert by_alice["name"] == by_carol["name"] == "secret-project"
    assert by_alice["spec"]["command"] == ["sleep", "60"]
    shown = lab.gpuq(lab.bob, "show", "--json", str(job_id))
    assert json.loads(shown.stdout)["job"]["name"] == "-"


def test_a_user_cannot_flood_the_queue_past_their_limit(lab: Lab) -> None:
    user = lab.users["gpuq-bob"]
    waiting = [
        j
        for j in json.loads(lab.gpuq(user, "ls", "--json").stdout)["jobs"]
        if j["user"] == user.name and j["state"] in ("queued", "held")
    ]
    room = MAX_QUEUED - len(waiting)
    filled = lab.gpuq(user, "submit", "-q", "--hold", "--array", f"0-{room - 1}", "--", "true")
    assert filled.returncode == 0, filled.stderr
    result = lab.gpuq(user, "submit", "--hold", "--", "sleep", "60")
    assert result.returncode == ExitCode.PERMISSION
    assert f"would pass the lab's limit of {MAX_QUEUED} (max_queued)" in result.stderr
    assert lab.audit(uid=user.uid, action="submit", ok=False)
    others = lab.gpuq(lab.alice, "submit", "-q", "--hold", "--", "sleep", "60")
    assert others.returncode == 0, "one user's limit must not stop another"
    cancelled = lab.gpuq(user, "cancel", *filled.stdout.split())
    assert cancelled.returncode == 0, cancelled.stderr


def test_only_admins_may_stop_or_reload_the_daemon(lab: Lab) -> None:
    result = lab.gpuq(lab.alice, "daemon", "reload")
    assert result.returncode == ExitCode.PERMISSION
    assert "only the lab's admins may stop or reload the daemon" in result.stderr
    assert lab.audit(uid=lab.alice.uid, action="reload", ok=False)
    assert lab.gpuq(lab.carol, "daemon", "reload").returncode == 0


def test_a_user_reads_their_own_audit_entries_and_an_admin_everyones(lab: Lab) -> None:
    lab.submit_held(lab.alice, "audited")
    lab.submit_held(lab.bob, "audited")
    own = json.loads(lab.gpuq(lab.alice, "audit", "--json").stdout)["entries"]
    assert own and {e["uid"] for e in own} == {lab.alice.uid}
    other = lab.gpuq(lab.alice, "audit", "--user", "gpuq-bob")
    assert other.returncode == ExitCode.PERMISSION
    assert "only the lab's admins may read another user's audit entries" in other.stderr
    bobs = json.loads(lab.gpuq(lab.carol, "audit", "--json", "--user", "gpuq-bob").stdout)
    assert bobs["entries"] and {e["uid"] for e in bobs["entries"]} == {lab.bob.uid}


def test_a_uid_without_an_account_is_refused(lab: Lab) -> None:
    stranger = LabUser("stranger", 54321, 54321, "/")
    result = subprocess.run(
        [
            "setpriv",
            "--reuid=54321",
            "--regid=54321",
            "--clear-groups",
            sys.executable,
            "-c",
            _RAW_CLIENT,
            str(lab.socket),
            "status",
            "{}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout.splitlines()[0])
    assert reply["error"]["code"] == "permission"
    assert f"uid {stranger.uid} has no account on this server" in reply["error"]["message"]


_RAW_CLIENT = """
import json, socket, sys
path, method, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sock = socket.socket(socket.AF_UNIX)
sock.connect(path)
version = int(sys.argv[4]) if len(sys.argv) > 4 else 0
lines = [{"id": 0, "method": "hello", "params": {"version": version}},
         {"id": 1, "method": method, "params": params}]
try:
    sock.sendall("".join(json.dumps(line) + "\\n" for line in lines).encode())
except BrokenPipeError:  # refused at once: the reply is still there to read
    pass
for line in sock.makefile("rb"):
    print(line.decode().strip())
    reply = json.loads(line)
    if reply.get("id") in (1, None) and "event" not in reply:
        break
"""


def raw_request(lab: Lab, user: LabUser, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One request written by hand on the lab socket as `user`; the reply to it."""
    result = as_user(
        user,
        [
            sys.executable,
            "-c",
            _RAW_CLIENT,
            str(lab.socket),
            method,
            json.dumps(params),
            str(PROTOCOL_VERSION),
        ],
    )
    assert result.returncode == 0, result.stderr
    replies = [json.loads(line) for line in result.stdout.splitlines()]
    reply: dict[str, Any] = replies[-1]
    assert reply.get("id") == 1, replies
    return reply


def test_the_personal_daemon_is_chosen_when_no_lab_socket_exists(tmp_path: Path) -> None:
    from gpuq.client import choose_daemon
    from gpuq.config import load_config

    config = tmp_path / "c.toml"
    config.write_text(f'[daemon]\nruntime_dir = "{tmp_path}/run"\n[lab]\nsocket = "{tmp_path}/x"\n')
    choice = choose_daemon(load_config(str(config), environ={}))
    assert (choice.lab, choice.path, choice.notice) == (False, tmp_path / "run/gpuq.sock", None)


def test_both_daemons_running_picks_the_lab_and_says_so(tmp_path: Path) -> None:
    from gpuq.client import choose_daemon
    from gpuq.config import load_config

    (tmp_path / "run").mkdir()
    listeners = []
    for path in (tmp_path / "run/gpuq.sock", tmp_path / "lab.sock"):
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        listeners.append(listener)
    config = tmp_path / "c.toml"
    config.write_text(
        f'[daemon]\nruntime_dir = "{tmp_path}/run"\n[lab]\nsocket = "{tmp_path}/lab.sock"\n'
    )
    try:
        auto = choose_daemon(load_config(str(config), environ={}))
        personal = choose_daemon(load_config(str(config), environ={"GPUQ_DAEMON": "personal"}))
    finally:
        for listener in listeners:
            listener.close()
    assert (auto.lab, auto.path) == (True, tmp_path / "lab.sock")
    assert auto.notice is not None
    assert "your personal daemon" in auto.notice and "GPUQ_DAEMON=personal" in auto.notice
    assert (personal.lab, personal.path, personal.notice) == (
        False,
        tmp_path / "run/gpuq.sock",
        None,
    )


def test_a_lab_socket_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    from gpuq.client import open_lab_socket
    from gpuq.errors import DaemonUnavailable

    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    with pytest.raises(DaemonUnavailable, match="not a directory of root's that only root"):
        open_lab_socket(loose / "gpuq.sock", 1.0)


def test_env_uid_is_not_the_identity(lab: Lab) -> None:
    """A user who sets USER/LOGNAME to someone else's name is still themselves."""
    result = as_user(
        lab.bob,
        [sys.executable, "-m", "gpuq.cli.entry", "submit", "-q", "--hold", "--", "true"],
        env={"GPUQ_LAB_SOCKET": str(lab.socket), "USER": "gpuq-alice", "LOGNAME": "gpuq-alice"},
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(lab.gpuq(lab.carol, "show", "--json", result.stdout.strip()).stdout)["job"]
    assert job["user"] == "gpuq-bob"


def test_three_users_submit_300_jobs_at_once_and_each_runs_as_its_owner(open_lab: Lab) -> None:
    lab = open_lab
    """Acceptance 1: uid, gid, groups and HOME checked from inside every job; logs private.

    Every job runs exactly once: its output holds one line.
    """
    import grp
    import threading

    report = 'echo "$(id -u) $(id -g) $(id -G) $HOME $USER"'
    batches = 4
    per_batch = 25
    submitted: dict[str, list[int]] = {name: [] for name in lab.users}
    failures: list[str] = []

    def submit(user: LabUser) -> None:
        result = lab.gpuq(
            user,
            "submit",
            "--json",
            "--gpus",
            "0",
            "--array",
            f"0-{per_batch - 1}",
            "--",
            "sh",
            "-c",
            report,
        )
        if result.returncode != 0:
            failures.append(result.stderr)
            return
        submitted[user.name].extend(json.loads(result.stdout)["ids"])

    threads = [
        threading.Thread(target=submit, args=(user,))
        for _ in range(batches)
        for user in lab.users.values()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    expected_total = batches * per_batch * len(lab.users)
    assert sum(len(ids) for ids in submitted.values()) == expected_total
    everything = [job_id for ids in submitted.values() for job_id in ids]
    done = lab.gpuq(lab.carol, "wait", "--json", "--timeout", "600s", *map(str, everything))
    jobs = {job["id"]: job for job in json.loads(done.stdout)["jobs"]}
    failed = [
        (j["id"], j["state"], j["reason"]) for j in jobs.values() if j["state"] != "succeeded"
    ]
    assert done.returncode == 0 and not failed, failed[:5]
    assert len(jobs) == expected_total, "every job accounted for"
    for name, ids in submitted.items():
        user = lab.users[name]
        groups = sorted(os.getgrouplist(name, user.gid))
        for job_id in ids:
            job = jobs[job_id]
            assert job["state"] == "succeeded", job
            path = Path(job["stdout"])
            info = path.stat()
            assert (info.st_uid, info.st_mode & 0o777) == (user.uid, 0o600), path
            text = path.read_text()
            if text.count("\n") != 1:  # a job run twice (the spawner once raced its reaper)
                shown = json.loads(lab.gpuq(lab.carol, "show", "--json", str(job_id)).stdout)
                raise AssertionError(f"job {job_id} wrote {text!r}; events {shown['events']}")
            uid, gid, *rest = text.split()
            home, login = rest[-2:]
            assert (int(uid), int(gid)) == (user.uid, user.gid)
            assert sorted(int(g) for g in rest[:-2]) == groups
            assert (home, login) == (user.home, name)
    other = lab.gpuq(lab.bob, "logs", str(submitted["gpuq-alice"][0]))
    assert other.returncode == ExitCode.PERMISSION
    assert grp.getgrnam("gpuq-admins").gr_gid in os.getgrouplist("gpuq-carol", lab.carol.gid)


def test_path_and_ld_preload_games_reach_only_the_users_own_job(lab: Lab) -> None:
    """A planted `sleep` first on PATH, and LD_PRELOAD, act in bob's job as bob, nowhere else."""
    trap = Path(tempfile.mkdtemp(prefix="gpuq-trap-", dir=lab.bob.home))
    os.chown(trap, lab.bob.uid, lab.bob.gid)
    evidence = trap / "ran-as"
    fake = trap / "sleep"
    fake.write_text(f"#!/bin/sh\nid -u >> {evidence}\n")
    fake.chmod(0o755)
    os.chown(fake, lab.bob.uid, lab.bob.gid)
    result = as_user(
        lab.bob,
        [sys.executable, "-m", "gpuq.cli.entry", "submit", "-q", "--gpus", "0", "--", "sleep", "1"],
        env={
            "GPUQ_LAB_SOCKET": str(lab.socket),
            "PATH": f"{trap}:/usr/bin:/bin",
            "LD_PRELOAD": str(trap / "missing.so"),
        },
    )
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    done = json.loads(lab.gpuq(lab.bob, "wait", "--json", job_id).stdout)["jobs"][0]
    assert done["state"] == "succeeded", done
    assert evidence.read_text().split() == [str(lab.bob.uid)]
    assert lab.gpuq(lab.alice, "ls", "--json").returncode == 0, "the daemon serves on"


@pytest.mark.parametrize("kind", ["link to root's file", "root's directory"])
def test_an_output_the_user_may_not_write_fails_the_job_and_spares_the_target(
    lab: Lab, kind: str
) -> None:
    secret = Path(tempfile.mkdtemp(prefix="gpuq-root-")) / "secret"
    secret.write_text("root's\n")
    if kind == "root's directory":
        output, expected = secret.parent / "out.log", "(as user gpuq-bob"
    else:
        trap = Path(tempfile.mkdtemp(prefix="gpuq-trap-", dir=lab.bob.home))
        os.chown(trap, lab.bob.uid, lab.bob.gid)
        output, expected = trap / "out.log", "it is a symbolic link"
        output.symlink_to(secret)
        os.lchown(output, lab.bob.uid, lab.bob.gid)
    result = lab.gpuq(
        lab.bob, "submit", "-q", "--gpus", "0", "--output", str(output), "--", "echo", "pwned"
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(lab.gpuq(lab.bob, "wait", "--json", result.stdout.strip()).stdout)["jobs"][0]
    assert job["state"] == "failed"
    assert expected in job["reason"] and str(output.parent) in job["reason"], job["reason"]
    assert secret.read_text() == "root's\n"
    assert not (secret.parent / "out.log").exists()


def test_both_daemons_running_the_command_uses_the_lab_and_says_so(lab: Lab) -> None:
    own = {
        "GPUQ_STATE_DIR": f"{lab.bob.home}/gq-state",
        "GPUQ_RUNTIME_DIR": f"{lab.bob.home}/gq-run",
    }
    started = as_user(
        lab.bob,
        [sys.executable, "-m", "gpuq.cli.entry", "daemon", "start"],
        env={**own, "GPUQ_DAEMON": "personal"},
    )
    assert started.returncode == 0, started.stderr
    try:
        listed = as_user(
            lab.bob,
            [sys.executable, "-m", "gpuq.cli.entry", "ls"],
            env={**own, "GPUQ_LAB_SOCKET": str(lab.socket)},
        )
        assert listed.returncode == 0, listed.stderr
        assert f"gpuq: using the lab daemon ({lab.socket})" in listed.stderr
        assert "GPUQ_DAEMON=personal" in listed.stderr
    finally:
        as_user(
            lab.bob,
            [sys.executable, "-m", "gpuq.cli.entry", "daemon", "stop"],
            env={**own, "GPUQ_DAEMON": "personal"},
        )


def test_a_root_daemon_never_runs_another_server_s_job_as_root_for_a_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpuq.daemon.executor import LaunchSpec
    from gpuq.daemon.handlers.node import hosted_as
    from gpuq.daemon.identity import Account, Caller

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    service = Caller(Account(1500, 1500, (1500,), "gpuq-svc", "/home/gpuq-svc"), admin=True)
    alice = Account(1001, 1002, (1002,), "gpuq-alice", "/home/gpuq-alice")
    root = Account(0, 0, (0,), "root", "/root")
    spec = LaunchSpec(("true",), "/", {}, "/dev/null", "/dev/null", None, None, 10.0)
    assert hosted_as(spec, service).run_as == service.account
    assert hosted_as(dataclasses.replace(spec, run_as=root), service).run_as == service.account
    assert hosted_as(dataclasses.replace(spec, run_as=alice), service).run_as == alice
    by_root = Caller(root, admin=True)
    assert hosted_as(spec, by_root).run_as is None


def test_a_gpu_held_outside_gpuq_is_avoided_and_its_user_named() -> None:
    users = lab_users()
    bob = users["gpuq-bob"]
    holder = subprocess.Popen(
        ["setpriv", f"--reuid={bob.uid}", f"--regid={bob.gid}", "--init-groups", "sleep", "600"]
    )
    gpus = (
        '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 1\n'
        f'foreign_memory = "30G"\nforeign_pid = {holder.pid}\n'
        '[[gpus.fake]]\nname = "Fake A100"\nmemory = "40G"\ncount = 1\n'
    )
    try:
        with running_lab("", gpus_toml=gpus) as lab:
            result = lab.gpuq(lab.alice, "submit", "-q", "--", "sleep", "30")
            assert result.returncode == 0, result.stderr
            job = lab.daemon.wait_state(int(result.stdout), "running")
            listing = json.loads(lab.gpuq(lab.alice, "gpus", "--json").stdout)["gpus"]
            held = next(gpu for gpu in listing if gpu["memory_foreign"])
            assert job["gpu_uuids"] == [
                next(gpu["uuid"] for gpu in listing if not gpu["memory_foreign"])
            ]
            assert {"pid": holder.pid, "user": "gpuq-bob", "foreign": True}.items() <= (
                held["processes"][0].items()
            )
            text = lab.gpuq(lab.alice, "gpus").stdout
            assert f"GPU 0: also used outside gpuq by gpuq-bob (pid {holder.pid}, 30G)" in text
    finally:
        holder.kill()
        holder.wait()


def test_a_notify_command_runs_as_the_job_s_owner_never_as_root(open_lab: Lab) -> None:
    out = shared_dir("gq-notify-")
    try:
        seen = out / "seen"
        report = (
            f'(id -u; id -g; pwd; echo "$HOME $USER"; grep CapEff /proc/self/status; '
            f'echo "$GPUQ_JOB_STATE $GPUQ_JOB_EXIT_CODE") > {seen}.part && mv {seen}.part {seen}'
        )
        alice = open_lab.alice
        submitted = open_lab.gpuq(
            alice, "submit", "--gpus", "0", "--notify", report, "--", "sh", "-c", "exit 3"
        )
        assert submitted.returncode == 0, submitted.stderr
        wait_for(seen.exists, what="the notify command's report")
        lines = seen.read_text().splitlines()
        assert lines[:2] == [str(alice.uid), str(alice.gid)]
        assert lines[2] == alice.home  # the job's directory, entered as alice
        assert lines[3] == f"{alice.home} {alice.name}"
        assert lines[4] == "CapEff:\t0000000000000000"
        assert lines[5] == "failed 3"
        assert seen.stat().st_uid == alice.uid
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_share_shows_each_user_and_the_lab_s_limits(lab: Lab) -> None:
    lab.submit_held(lab.bob, "waiting")
    shown = lab.gpuq(lab.alice, "share", "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["limits"] == {
        "max_gpus": 0,
        "max_running": 0,
        "max_queued": MAX_QUEUED,
        "max_priority": 0,
    }
    rows = {row["user"]: row for row in document["users"]}
    assert rows[lab.bob.name]["waiting"] >= 1 and rows[lab.bob.name]["share"] == 1
    table = lab.gpuq(lab.alice, "share")
    assert table.returncode == 0 and lab.bob.name in table.stdout


def test_clean_deletes_only_the_logs_gpuq_named_for_the_user_s_own_jobs(lab: Lab) -> None:
    """Bob cannot have the daemon (root) delete alice's log by naming it as his job's output."""
    alice = lab.gpuq(lab.alice, "submit", "-q", "--gpus", "0", "--", "echo", "alice's result")
    assert alice.returncode == 0, alice.stderr
    alice_id = alice.stdout.strip()
    lab.gpuq(lab.alice, "wait", alice_id)
    alice_log = Path(
        json.loads(lab.gpuq(lab.alice, "show", "--json", alice_id).stdout)["job"]["stdout"]
    )
    assert alice_log.read_text() == "alice's result\n"
    bob = lab.gpuq(
        lab.bob, "submit", "-q", "--gpus", "0", "--output", str(alice_log), "--", "echo", "x"
    )
    assert bob.returncode == 0, bob.stderr
    lab.gpuq(lab.bob, "wait", bob.stdout.strip())  # fails: alice's directory is hers alone

    planned = json.loads(lab.gpuq(lab.bob, "clean", "--dry-run", "--json").stdout)
    assert str(alice_log) not in planned["files"]
    cleaned = lab.gpuq(lab.bob, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert alice_log.read_text() == "alice's result\n"


def test_clean_removes_a_link_planted_at_a_default_log_and_never_measures_its_target(
    lab: Lab,
) -> None:
    secret = Path(tempfile.mkdtemp(prefix="gpuq-root-")) / "secret"
    secret.write_bytes(b"s" * 12345)
    bob = lab.gpuq(lab.bob, "submit", "-q", "--gpus", "0", "--", "echo", "x")
    assert bob.returncode == 0, bob.stderr
    lab.gpuq(lab.bob, "wait", bob.stdout.strip())
    job = json.loads(lab.gpuq(lab.bob, "show", "--json", bob.stdout.strip()).stdout)["job"]
    log = Path(job["stdout"])
    as_user(lab.bob, ["sh", "-c", f'rm "{log}" && ln -s "{secret}" "{log}"'])
    assert log.is_symlink()

    planned = json.loads(lab.gpuq(lab.bob, "clean", "--dry-run", "--json").stdout)
    assert str(log) in planned["files"]
    assert planned["bytes"] < 12345
    assert lab.gpuq(lab.bob, "clean").returncode == 0
    assert not log.is_symlink()
    assert secret.read_bytes() == b"s" * 12345
