"""Lab mode across servers: one queue for the lab, whichever server a user types on.

The head keeps the lab's queue; gpu2 is a member (`[lab] head`), whose lab
daemon forwards its users' requests to the head's over ssh as the lab's
service account gpuq-svc, with the user's identity as its kernel names it
(tests/lab_cluster_harness.py). Every command here is the real CLI, run as
a real user on one of the two servers. Only gpuq-svc may act for another
user or send the node requests that run jobs as any user; the member's own
`gpuq daemon status` stays local. Skips unless root (users, namespaces,
sshd).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from gpuq.errors import ExitCode
from gpuq.protocol import PROTOCOL_VERSION
from tests.daemon_harness import wait_for
from tests.lab_cluster_harness import HEAD, MEMBER, LabCluster, lab_head_and_gpu2
from tests.lab_users import LabUser, as_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="lab mode across servers needs root (users, namespaces, sshd)"
)

CONTROL_JOB = Path(__file__).resolve().parent / "control_job.py"
"""A small deterministic PyTorch loop with gpuq.runner (tests/test_control_runner.py)."""
REPORT = "id -u; id -g; id -G; echo $HOME"
"""A job's account as it sees it: uid, gid, groups and HOME, one a line."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    with lab_head_and_gpu2(tmp_path_factory.mktemp("lab-cluster")) as cluster:
        yield cluster


def submit(lab: LabCluster, server: str, user: LabUser, *args: str) -> int:
    """`gpuq submit -q ARGS` as `user` on `server`; the new job's id."""
    result = lab.gpuq(server, user, "submit", "-q", *args)
    assert result.returncode == 0, f"submit on {server}: {result.stderr}"
    return int(result.stdout)


def listed(lab: LabCluster, server: str, user: LabUser) -> dict[int, dict[str, Any]]:
    """`gpuq ls --json` as `user` on `server`, by job id."""
    jobs: list[dict[str, Any]] = lab.gpuq_json(server, user, "ls")["jobs"]
    return {job["id"]: job for job in jobs}


def test_the_lab_lives_where_the_service_account_and_users_can_reach_it(
    lab: LabCluster,
) -> None:
    """The harness itself: each config readable by all, each socket's directory root's own."""
    for server in (HEAD, MEMBER):
        config = lab.daemon(server).config_path
        assert config.stat().st_mode & 0o777 == 0o644
        socket_dir = lab.socket(server).parent
        info = socket_dir.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o755)
    login = lab.net.run_in(HEAD, lab.net.ssh_command(MEMBER, "id", "-un"))
    assert login.stdout.decode().strip() == lab.svc.name, login.stderr


def test_users_on_either_server_share_the_head_s_one_queue(lab: LabCluster) -> None:
    alices = submit(lab, MEMBER, lab.alice, "--hold", "--name", "typed-on-gpu2", "--", "true")
    bobs = submit(lab, HEAD, lab.bob, "--hold", "--name", "typed-on-head", "--", "true")
    try:
        for server in (HEAD, MEMBER):
            for user in (lab.alice, lab.bob):
                owners = {job_id: job["user"] for job_id, job in listed(lab, server, user).items()}
                assert {alices: lab.alice.name, bobs: lab.bob.name}.items() <= owners.items(), (
                    f"{user.name}'s gpuq ls on {server}"
                )
        at_head = lab.head.job(alices)  # the head's own id for it, asked on the head as root
        assert (at_head["name"], at_head["user"], at_head["spec"]["uid"]) == (
            "typed-on-gpu2",
            lab.alice.name,
            lab.alice.uid,
        )
        shown = lab.gpuq_json(MEMBER, lab.alice, "show", str(alices))["job"]
        assert (shown["id"], shown["state"]) == (alices, "held")
        submitted = lab.audit(action="submit", ok=True, message=f"ids {alices}")
        assert [(e["uid"], e["user"]) for e in submitted] == [(lab.alice.uid, lab.alice.name)], (
            "the head's audit names alice, not the service account"
        )
        assert lab.gpu2.call("status")["jobs"] == {}, "the member keeps no queue of its own"
        gpus = lab.gpuq_json(MEMBER, lab.bob, "gpus")["gpus"]
        assert sorted(gpu["node"] for gpu in gpus) == ["gpu2"] * 3 + ["head"] * 2
    finally:
        lab.gpuq(HEAD, lab.alice, "cancel", str(alices))
        lab.gpuq(HEAD, lab.bob, "cancel", str(bobs))


@pytest.mark.parametrize(("server", "owner"), [(MEMBER, "gpuq-alice"), (HEAD, "gpuq-bob")])
def test_a_job_placed_on_gpu2_runs_there_as_its_owner(
    lab: LabCluster, server: str, owner: str
) -> None:
    user = lab.users[owner]
    job_id = submit(lab, server, user, "--node", MEMBER, "--", "sh", "-c", REPORT)
    waited = lab.gpuq(server, user, "wait", "--json", "--timeout", "300s", str(job_id))
    assert waited.stdout, f"gpuq wait on {server}: {waited.stderr}"
    job: dict[str, Any] = json.loads(waited.stdout)["jobs"][0]
    assert (job["state"], job["node"]) == ("succeeded", MEMBER), job
    for reader in (HEAD, MEMBER):
        logs = lab.gpuq(reader, user, "logs", str(job_id))
        assert logs.returncode == 0, f"gpuq logs on {reader}: {logs.stderr}"
        uid, gid, groups, home = logs.stdout.splitlines()
        assert (int(uid), int(gid), home) == (user.uid, user.gid, user.home), reader
        assert sorted(int(g) for g in groups.split()) == sorted(os.getgrouplist(owner, user.gid))
    hosted_logs = lab.gpu2.config.daemon.log_dir / "hosted" / HEAD / "users" / str(user.uid)
    output = (hosted_logs / f"{job_id}.out").stat()
    assert (output.st_uid, output.st_mode & 0o777) == (user.uid, 0o600)


@pytest.mark.parametrize("node", [MEMBER, HEAD])
def test_a_runner_job_reaches_its_control_socket_and_checkpoints_as_its_owner(
    lab: LabCluster, node: str
) -> None:
    """On either server the owner reaches what is theirs below the daemon's directories.

    (The head's own runtime directory stays open to its users while its
    ssh connections to gpu2 keep their sockets private.)
    """
    argv = [sys.executable, str(CONTROL_JOB), "--step-delay", "0.05"]
    job_id = submit(lab, MEMBER, lab.alice, "--node", node, "--", *argv)
    sample = wait_for(
        lambda: lab.head.call("show", id=job_id)["metrics"], timeout=120, what="relayed metrics"
    )
    assert sample["step"] >= 1, "the runner talked to gpu2's daemon, which relayed it"
    suspended = lab.gpuq(MEMBER, lab.alice, "suspend", str(job_id))
    assert suspended.returncode == 0, suspended.stderr
    job = lab.head.wait_state(job_id, "suspended", timeout=120)
    assert job["reason"].startswith("suspended (checkpoint mode) at step "), job["reason"]
    jobs = lab.gpu2.state_dir / "hosted" / HEAD / "jobs" if node == MEMBER else None
    checkpoints = (jobs or lab.head.state_dir / "jobs") / str(job_id) / "checkpoints"
    info = checkpoints.stat()
    if node == MEMBER:  # the service account's group reads them, to copy them elsewhere
        expected = (lab.alice.uid, lab.svc.gid, 0o750)
    else:
        expected = (lab.alice.uid, lab.alice.gid, 0o700)
    assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == expected
    assert [f.stat().st_uid for f in checkpoints.glob("ckpt-*.pt")] != []
    assert {f.stat().st_uid for f in checkpoints.glob("ckpt-*.pt")} == {lab.alice.uid}
    resumed = lab.gpuq(MEMBER, lab.alice, "resume", str(job_id))
    assert resumed.returncode == 0, resumed.stderr
    done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=300)
    out = lab.gpuq(HEAD, lab.alice, "logs", str(job_id)).stdout
    assert (done["state"], done["node"]) == ("succeeded", node), out
    assert "resumed from step" in out


def test_a_lab_job_moves_between_servers_with_its_checkpoint_and_ends_as_if_never_moved(
    lab: LabCluster,
) -> None:
    """The service account copies the owner's checkpoints; the daemons copy the owner's logs."""
    work = lab.work_dir(lab.alice)
    reference, moved, gate = work / "reference.pt", work / "moved.pt", work / "go"
    plain = lab.gpuq(HEAD, lab.alice, "submit", "-q", "--", *_control(reference))
    assert plain.returncode == 0, plain.stderr
    job_id = submit(lab, MEMBER, lab.alice, "--", *_control(moved, "--gate", f"3={gate}"))
    wait_for(lambda: lab.head.call("show", id=job_id)["metrics"], timeout=120, what="metrics")
    first = lab.head.job(job_id)["node"]
    other = HEAD if first == MEMBER else MEMBER
    for target in (other, first):
        attempts = lab.head.job(job_id)["attempts"]
        moving = lab.gpuq(MEMBER, lab.alice, "migrate", str(job_id), "--to", target)
        assert moving.returncode == 0, moving.stderr
        wait_for(
            partial(_runs_anew, lab, job_id, attempts + 1, target),
            timeout=180,
            what=f"job {job_id} to run on {target} from its checkpoint",
        )
        wait_for(
            lambda: lab.head.call("metrics", id=job_id, since=lab.head.job(job_id)["start_time"])[
                "samples"
            ],
            timeout=120,
            what="a sample of the new attempt",
        )
    gate.touch()
    done = lab.head.wait_state(job_id, "succeeded", "failed", timeout=300)
    events = [event["reason"] for event in lab.head.call("show", id=job_id)["events"]]
    assert done["state"] == "succeeded", "\n".join(events)
    for source, target in ((first, other), (other, first)):
        assert any(r.startswith(f"checkpoint copied from {source} to {target}: ") for r in events)
    assert not [r for r in events if "stays on" in r], "\n".join(events)
    # Its output followed it, though only alice may read it: each stay's, in one log.
    output = lab.gpuq(HEAD, lab.alice, "logs", str(job_id)).stdout
    assert output.count("resumed from step") == 2 and output.count("done at step") == 1, output
    lab.head.wait_state(int(plain.stdout), "succeeded", timeout=300)
    a, b = torch.load(reference), torch.load(moved)
    for key, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][key]), key


def _runs_anew(lab: LabCluster, job_id: int, attempt: int, node: str) -> bool:
    job = lab.head.job(job_id)
    return bool(job["state"] == "running" and job["attempts"] == attempt and job["node"] == node)


def _control(out: Path, *args: str) -> list[str]:
    """tests/control_job.py writing its final model to `out`."""
    return [sys.executable, str(CONTROL_JOB), "--step-delay", "0.05", "--out", str(out), *args]


def test_a_job_s_output_on_gpu2_is_never_read_through_a_link(lab: LabCluster) -> None:
    """gpu2's daemon reads a job's output as root: only from a regular file of the owner."""
    output = lab.work_dir(lab.alice) / "linked.out"
    job_id = submit(lab, MEMBER, lab.alice, "--node", MEMBER, "-o", str(output), "--", "true")
    lab.head.wait_state(job_id, "succeeded", timeout=120)
    secret = lab.base / "root-only"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    output.unlink()
    output.symlink_to(secret)
    logs = lab.gpuq(HEAD, lab.alice, "logs", str(job_id))
    assert logs.returncode == ExitCode.PERMISSION, logs.stdout
    assert "secret" not in logs.stdout
    assert "it is a symbolic link" in logs.stderr


@pytest.mark.parametrize(
    ("args", "verb"),
    [
        (("cancel",), "cancel"),
        (("release",), "release"),
        (("priority", "-5"), "change the priority of"),
        (("logs",), "read the logs of"),
    ],
)
def test_through_gpu2_a_user_may_not_act_on_another_users_job(
    lab: LabCluster, args: tuple[str, ...], verb: str
) -> None:
    job_id = submit(lab, MEMBER, lab.alice, "--hold", "--name", "alices-run", "--", "true")
    try:
        result = lab.gpuq(MEMBER, lab.bob, *args, str(job_id))
        assert f"job {job_id} belongs to gpuq-alice: you (gpuq-bob) may not {verb} it" in (
            result.stderr
        )
        refused = lab.audit(action=args[0], ok=False, target=str(job_id))
        assert [(e["uid"], e["user"]) for e in refused] == [(lab.bob.uid, lab.bob.name)]
        assert "belongs to gpuq-alice" in refused[0]["message"]
        assert lab.head.job(job_id)["state"] == "held"
        assert result.returncode == ExitCode.PERMISSION, result.stderr
        owner = lab.gpuq(MEMBER, lab.alice, "priority", "-7", str(job_id))
        assert owner.returncode == 0, owner.stderr
        assert lab.head.job(job_id)["priority"] == -7, "the owner's own action went through"
    finally:
        cancelled = lab.gpuq(MEMBER, lab.alice, "cancel", str(job_id))
    assert cancelled.returncode == 0, cancelled.stderr
    assert lab.head.job(job_id)["state"] == "cancelled"


_RAW_CLIENT = """
import json, socket, sys
path, version, request = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
sock = socket.socket(socket.AF_UNIX)
sock.connect(path)
lines = [{"id": 0, "method": "hello", "params": {"version": version}}, {"id": 1, **request}]
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


def raw_request(lab: LabCluster, user: LabUser, server: str, request: dict[str, Any]) -> Any:
    """`request` (method, params, envelope fields) written by hand as `user` on `server`.

    It goes on that server's lab socket after the hello; returns the reply to it.
    """
    result = as_user(
        user,
        [
            sys.executable,
            "-c",
            _RAW_CLIENT,
            str(lab.socket(server)),
            str(PROTOCOL_VERSION),
            json.dumps(request),
        ],
    )
    assert result.returncode == 0, result.stderr
    replies = [json.loads(line) for line in result.stdout.splitlines()]
    assert replies and replies[-1].get("id") == 1, replies
    return replies[-1]


@pytest.mark.parametrize("sender", ["gpuq-bob", "gpuq-carol"])
def test_only_the_service_account_may_act_for_another_user(lab: LabCluster, sender: str) -> None:
    user = lab.users[sender]
    name = f"forged-by-{sender}"
    spec = {"command": ["sleep", "60"], "cwd": user.home, "hold": True, "name": name}
    reply = raw_request(
        lab,
        user,
        HEAD,
        {
            "method": "submit",
            "params": {"spec": spec},
            "as": {"uid": lab.alice.uid, "name": lab.alice.name},
        },
    )
    assert "result" not in reply, reply
    assert reply["error"]["code"] == "permission", reply
    assert (
        "only the lab's service account may act for another user" in (reply["error"]["message"])
    ), reply
    everyone = listed(lab, HEAD, lab.carol)
    assert not [job for job in everyone.values() if job["name"] == name], "nothing submitted"


@pytest.mark.parametrize("server", [HEAD, MEMBER])
def test_an_admin_who_is_not_the_service_account_may_not_send_node_requests(
    lab: LabCluster, server: str
) -> None:
    for method, params in (
        ("node.sync", {"head": "forged", "expect": {}}),
        ("node.check", {"head": "forged", "job": 1}),
        (
            "node.output",
            {"head": "forged", "job": 1, "stream": "stdout", "uid": 0, "offset": 0, "data": ""},
        ),
    ):
        reply = raw_request(lab, lab.carol, server, {"method": method, "params": params})
        assert "result" not in reply, reply
        assert reply["error"]["code"] == "permission", (method, reply)


def test_audit_here_shows_what_gpu2_refused_itself_and_the_lab_s_log_does_not(
    lab: LabCluster,
) -> None:
    forged = {"method": "node.check", "params": {"head": "forged", "job": 424242}}
    assert raw_request(lab, lab.carol, MEMBER, forged)["error"]["code"] == "permission"
    own = lab.gpuq_json(MEMBER, lab.carol, "audit", "--here", "--limit", "1000")["entries"]
    lab_wide = lab.gpuq_json(MEMBER, lab.carol, "audit", "--limit", "1000")["entries"]
    refused = [e for e in own if e["action"] == "node.check" and e["target"] == "424242"]
    assert refused and refused[-1]["user"] == lab.carol.name and not refused[-1]["ok"], own
    assert not [e for e in lab_wide if e["target"] == "424242"], "the head never saw it"
    mine = lab.gpuq_json(MEMBER, lab.alice, "audit", "--here", "--limit", "1000")["entries"]
    assert {e["user"] for e in mine} <= {lab.alice.name}, "a user sees only their own"


def test_without_the_head_gpu2_refuses_queue_requests_but_answers_for_itself(
    lab: LabCluster,
) -> None:
    """Last in the module: it stops the head's daemon (and starts it again)."""
    status = lab.gpuq_json(MEMBER, lab.alice, "daemon", "status")
    assert lab.gpu2.process is not None
    assert (status["node"], status["pid"]) == (MEMBER, lab.gpu2.process.pid)
    lab.head.stop()
    try:
        listing = lab.gpuq(MEMBER, lab.alice, "ls")
        assert listing.returncode == ExitCode.UNAVAILABLE, listing.stderr
        assert HEAD in listing.stderr
        status = lab.gpuq_json(MEMBER, lab.alice, "daemon", "status")
        assert (status["node"], status["pid"]) == (MEMBER, lab.gpu2.process.pid)
    finally:
        lab.start(HEAD)
        lab.wait_for_member()
    assert lab.gpuq(MEMBER, lab.alice, "ls").returncode == 0, "served again once the head is back"
