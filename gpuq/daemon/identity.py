"""Who is asking: the caller's identity from the kernel, and the account a job runs as.

A daemon never believes a uid or user name written in a request. The
kernel tells it who is at the other end of the socket (SO_PEERCRED: pid,
uid, gid); the account database (pwd, grp) gives that uid's name, home and
supplementary groups, as a login would. In lab mode the caller is an admin
when `[lab] admins` names the user or one of their groups (`@group`), and
root always is; a personal daemon serves only its own user, who owns every
job on it. Standard library only: the shim imports this module.
"""

from __future__ import annotations

import functools
import grp
import os
import pwd
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


class UnknownAccount(Exception):
    """A uid with no entry in the account database; the message says which."""


@dataclass(frozen=True, slots=True)
class Account:
    """A user as the system knows them: ids, supplementary groups, name, home and shell."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    home: str

    @classmethod
    def of_uid(cls, uid: int) -> Account:
        """The account of `uid` from the account database (raises `UnknownAccount`)."""
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            raise UnknownAccount(f"uid {uid} has no account on this server") from None
        try:
            groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
        except OSError:
            groups = (entry.pw_gid,)
        return cls(uid, entry.pw_gid, groups, entry.pw_name, entry.pw_dir)

    @classmethod
    def current(cls) -> Account:
        """The account this process runs as (its own name even without a pwd entry)."""
        try:
            return cls.of_uid(os.geteuid())
        except UnknownAccount:
            uid = os.geteuid()
            return cls(uid, os.getegid(), tuple(os.getgroups()), str(uid), "/")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (in a job's launch record)."""
        return {
            "uid": self.uid,
            "gid": self.gid,
            "groups": list(self.groups),
            "name": self.name,
            "home": self.home,
        }

    @classmethod
    def from_dict(cls, data: object) -> Account:
        """Decode `to_dict`; ValueError names what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("run_as must be an object")  # noqa: TRY004 - a decoding error
        ids = [data.get("uid"), data.get("gid"), *(data.get("groups") or [])]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ids):
            raise ValueError("run_as needs non-negative integer uid, gid and groups")
        name, home = data.get("name"), data.get("home")
        if not isinstance(name, str) or not name or not isinstance(home, str):
            raise ValueError("run_as needs a name and a home")
        return cls(int(ids[0]), int(ids[1]), tuple(int(g) for g in ids[2:]), name, home)


@dataclass(frozen=True, slots=True)
class Caller:
    """The user a request comes from, and whether they may act on every job."""

    account: Account
    admin: bool

    @property
    def uid(self) -> int:
        """The caller's user id."""
        return self.account.uid

    @property
    def name(self) -> str:
        """The caller's user name."""
        return self.account.name

    def owns(self, uid: int | None) -> bool:
        """True for a job of this user's (a job without an owner belongs to the daemon's user)."""
        return (uid if uid is not None else os.geteuid()) == self.account.uid

    def may_act_on(self, uid: int | None) -> bool:
        """True when this caller may act on a job owned by `uid` (their own, or any as admin)."""
        return self.admin or self.owns(uid)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return int(pid), int(uid), int(gid)


def is_admin(account: Account, admins: Iterable[str]) -> bool:
    """Root, a user `admins` names, or a member of a group it names as `@group`."""
    if account.uid == 0:
        return True
    for entry in admins:
        if entry.startswith("@"):
            try:
                if grp.getgrnam(entry[1:]).gr_gid in account.groups:
                    return True
            except KeyError:
                continue
        elif entry == account.name:
            return True
    return False


def lab_caller(uid: int, admins: Iterable[str]) -> Caller:
    """The caller of a lab daemon with kernel-given `uid` (raises `UnknownAccount`)."""
    account = Account.of_uid(uid)
    return Caller(account, is_admin(account, admins))


@functools.cache
def owner_caller() -> Caller:
    """The only caller of a personal daemon: its own user, who owns every job."""
    return Caller(Account.current(), admin=True)
