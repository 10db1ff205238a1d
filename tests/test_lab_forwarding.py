"""Lab members forward users' requests to the head: who a request acts for, and which go.

A member adds `as` (the caller's uid and name from the kernel) to each
request it forwards; the head believes it only from its service account,
and only for an account it has under the same name. These are the rules
as functions; tests/test_lab_cluster.py runs them across real servers.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
from pathlib import Path

import pytest

from gpuq.cli.doctor import check_lab_servers
from gpuq.cli.lab import config_text
from gpuq.config import Config, LabConfig, ServerDecl, default_config, load_config
from gpuq.daemon.connection import acting_for
from gpuq.daemon.forward import NOT_TRUSTED, forwards, said_here, speaking_for
from gpuq.daemon.identity import Account, Caller
from gpuq.errors import NotFoundError, PermissionDenied, ProtocolError
from gpuq.protocol import (
    Audit,
    Cancel,
    DaemonStatus,
    Gpus,
    Hello,
    ListJobs,
    NodeSync,
    Reload,
    Shutdown,
    Submit,
)

ME = pwd.getpwuid(os.getuid())
"""An account this machine has (the one running the tests)."""


def caller(name: str, uid: int = 4242, admin: bool = False) -> Caller:
    return Caller(Account(uid, uid, (uid,), name, "/nonexistent"), admin)


def lab(**keys: object) -> Config:
    base = default_config({})
    return dataclasses.replace(base, lab=LabConfig(enabled=True, **keys))  # type: ignore[arg-type]


SERVICE = caller("gpuq-svc")
MEMBER = lab(service_account="gpuq-svc", head="gpuq-svc@gpu1")


def test_a_request_without_as_acts_for_its_sender() -> None:
    alice = caller("alice")
    assert acting_for(MEMBER, alice, {"method": "list"}) is alice


def test_the_service_account_acts_for_the_user_a_member_names() -> None:
    acting = acting_for(MEMBER, SERVICE, {"as": {"uid": ME.pw_uid, "name": ME.pw_name}})
    assert (acting.uid, acting.name) == (ME.pw_uid, ME.pw_name)


def test_anyone_else_naming_another_user_is_refused() -> None:
    with pytest.raises(PermissionDenied) as refused:
        acting_for(MEMBER, caller("bob"), {"as": {"uid": ME.pw_uid, "name": ME.pw_name}})
    assert refused.value.message == (
        "only the lab's service account may act for another user (you are bob)"
    )


def test_an_admin_is_not_the_service_account() -> None:
    with pytest.raises(PermissionDenied):
        acting_for(MEMBER, caller("carol", admin=True), {"as": {"uid": 0, "name": "root"}})


def test_without_a_service_account_nobody_speaks_for_another() -> None:
    with pytest.raises(PermissionDenied):
        acting_for(lab(), SERVICE, {"as": {"uid": ME.pw_uid, "name": ME.pw_name}})


def test_a_personal_daemon_never_believes_as() -> None:
    personal = default_config({})
    with pytest.raises(PermissionDenied):
        acting_for(personal, SERVICE, {"as": {"uid": ME.pw_uid, "name": ME.pw_name}})


def test_a_uid_named_differently_here_is_refused() -> None:
    with pytest.raises(PermissionDenied) as refused:
        acting_for(MEMBER, SERVICE, {"as": {"uid": ME.pw_uid, "name": "mallory"}})
    assert refused.value.message == (
        f"uid {ME.pw_uid} is {ME.pw_name} here but mallory on the server that sent the request"
    )
    assert "share their accounts" in (refused.value.hint or "")


def test_a_uid_without_an_account_here_is_refused() -> None:
    unused = next(uid for uid in range(60_001, 65_000) if not _has_account(uid))
    with pytest.raises(PermissionDenied) as refused:
        acting_for(MEMBER, SERVICE, {"as": {"uid": unused, "name": "ghost"}})
    assert refused.value.message == f"ghost (uid {unused}) has no account on this server"


@pytest.mark.parametrize(
    "speaking", [{"uid": "0", "name": "root"}, {"uid": True, "name": "x"}, {"uid": 0}, [0], "root"]
)
def test_a_malformed_as_is_a_protocol_error(speaking: object) -> None:
    with pytest.raises(ProtocolError):
        acting_for(MEMBER, SERVICE, {"as": speaking})


def test_a_member_forwards_the_queue_and_keeps_its_own_daemon_s_requests() -> None:
    alice = caller("alice")
    for request in (Submit(spec={"command": ["true"]}), ListJobs(), Cancel(ids=(1,)), Gpus()):
        assert forwards(MEMBER, alice, request)
    for own in (
        Hello(version=1),
        DaemonStatus(),
        Reload(),
        Shutdown(),
        NodeSync(head="h", expect={}),
    ):
        assert not forwards(MEMBER, alice, own)


def test_a_member_answers_audit_here_itself_and_forwards_the_lab_s_audit() -> None:
    alice = caller("alice")
    assert forwards(MEMBER, alice, Audit())
    assert not forwards(MEMBER, alice, Audit(here=True))


def test_the_head_and_a_one_server_lab_forward_nothing() -> None:
    alice = caller("alice")
    assert not forwards(lab(service_account="gpuq-svc"), alice, ListJobs())
    assert not forwards(default_config({}), alice, ListJobs())


def test_the_service_account_s_own_requests_are_never_forwarded() -> None:
    """What the head's bridge asks of a member is the member's to answer (no loop)."""
    assert not forwards(MEMBER, SERVICE, ListJobs())


def test_the_identity_a_member_sends_is_the_kernel_s() -> None:
    assert speaking_for(caller("alice", uid=1001)) == {"uid": 1001, "name": "alice"}


def test_lab_install_writes_a_member_s_keys(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config_text(["@gpuadmin"], "gpuq", "gpuq@gpu1"))
    config = load_config(str(path))
    assert (config.lab.service_account, config.lab.head) == ("gpuq", "gpuq@gpu1")
    assert config.lab.head_command == "gpuq"


def test_lab_install_leaves_the_keys_as_comments_on_a_one_server_lab(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(config_text(["@gpuadmin"]))
    assert (load_config(str(path)).lab.service_account, load_config(str(path)).lab.head) == ("", "")


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_doctor_warns_of_a_lab_with_servers_but_no_service_account() -> None:
    config = dataclasses.replace(
        lab(),
        cluster=dataclasses.replace(default_config({}).cluster, servers=(ServerDecl("gpu2"),)),
    )
    [check] = check_lab_servers(config)
    assert (check.status, check.message) == (
        "warn",
        "[lab] service_account is not set: other servers' lab daemons are refused here",
    )


def test_doctor_warns_of_a_service_account_this_server_does_not_have() -> None:
    [check] = check_lab_servers(lab(service_account="gpuq-nobody-here", head="gpu1"))
    assert check.status == "warn" and "has no account on this server" in check.message


def test_doctor_has_nothing_to_say_about_a_one_server_lab() -> None:
    assert check_lab_servers(lab()) == []
    assert check_lab_servers(default_config({})) == []


def test_doctor_on_the_head_names_its_service_account() -> None:
    config = dataclasses.replace(
        lab(service_account=ME.pw_name),
        cluster=dataclasses.replace(default_config({}).cluster, servers=(ServerDecl("gpu2"),)),
    )
    [check] = check_lab_servers(config)
    assert check.status == "ok" and ME.pw_name in check.message


def test_a_head_that_does_not_trust_this_server_is_named_as_the_cause() -> None:
    refused = PermissionDenied(f"{NOT_TRUSTED} (you are gpuq-svc)", "leave out 'as'")
    said = said_here("gpuq@gpu1", refused)
    assert said.message.startswith("the lab's head gpuq@gpu1 does not take this server's requests")
    assert "[lab] service_account on the head" in (said.hint or "")
    assert said.exit_code == refused.exit_code


def test_the_head_s_other_errors_reach_the_user_as_they_are() -> None:
    for error in (NotFoundError("no job 9"), PermissionDenied("job 3 belongs to alice: ...")):
        assert said_here("gpu1", error) is error
