"""Lab mode's commands: `gpuq audit`, and `gpuq lab install` for the admin who sets it up."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from gpuq.cli.common import ConfigOpt, JsonOpt, print_json, run
from gpuq.cli.link import say_notice
from gpuq.config import LAB_SOCKET, load_config
from gpuq.errors import ConfigError, PermissionDenied, UsageError

lab_app = typer.Typer(
    help="Set up the lab's system daemon: one gpuq daemon shared by every user of a server.",
    no_args_is_help=True,
)

UNIT_PATH = Path("etc/systemd/system/gpuq.service")
CONFIG_PATH = Path("etc/gpuq/config.toml")


def audit(
    user: Annotated[
        str | None,
        typer.Option(
            "--user",
            "-u",
            metavar="USER",
            help="Only this user's entries (admins only for others').",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", metavar="DURATION", help="Only entries this recent (1h, 7d)."),
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", metavar="N", help="At most this many, newest.")
    ] = 100,
    here: Annotated[
        bool,
        typer.Option(
            "--here",
            help="This server's own log, not the lab's: on a member, the head's node "
            "requests, reloads and what it refused itself.",
        ),
    ] = False,
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Show the lab daemon's audit log: who did what, when, and whether it was allowed.

    Every request that changes something (submit, cancel, suspend, priority,
    logs, clean, ...) is recorded with the caller's uid as the kernel gives
    it, and every refused request too. Admins see everyone's entries; a user
    sees their own. Only a lab daemon keeps one (exit 2 on a personal one).
    On a lab of several servers the head keeps the lab's log, which every
    server shows; `--here` shows the server's own instead.
    """

    def body() -> None:
        from gpuq.cli.render import table
        from gpuq.client import Client
        from gpuq.units import parse_duration

        cutoff = None if since is None else time.time() - parse_duration(since, bare_minutes=False)
        with Client.connect(load_config(config), autostart=False) as client:
            say_notice(client)
            own = {"here": True} if here else {}
            result = client.call("audit", user=user, since=cutoff, limit=limit, **own)
        if json_out:
            print_json(result)
            return
        rows = [
            [
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry["time"])),
                f"{entry['user']}({entry['uid']})",
                entry["action"],
                entry["target"],
                "ok" if entry["ok"] else "refused",
                entry["message"],
            ]
            for entry in result["entries"]
        ]
        print(table(["TIME", "USER", "ACTION", "TARGET", "RESULT", "MESSAGE"], rows))

    run(json_out, body)


def share(json_out: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Show each user's fair share on the lab daemon: share, usage, factor, jobs and GPUs.

    USAGE is GPU time, decayed by [lab] half_life (as Slurm's fair share);
    FACTOR is 2^-(usage/share), both normalized over the users: 1 for a user
    who used nothing, 0.5 for one who used exactly their share. Within a
    priority class, jobs start in order of their user's factor plus the time
    they waited over [lab] aging (PRIORITY: the user's longest-waiting job).
    Only a lab daemon has one (exit 2 on a personal one).
    """

    def body() -> None:
        from gpuq.cli.render import table
        from gpuq.client import Client
        from gpuq.units import format_duration

        with Client.connect(load_config(config), autostart=False) as client:
            say_notice(client)
            result = client.call("share")
        if json_out:
            print_json(result)
            return
        rows = [
            [
                row["user"],
                f"{row['share']:g} ({row['share_norm']:.0%})",
                f"{float(row['usage']) / 3600:.2f} GPU-h ({row['usage_norm']:.0%})",
                f"{row['factor']:.3f}",
                "-" if row["priority"] is None else f"{row['priority']:.3f}",
                str(row["running"]),
                str(row["gpus"]),
                str(row["waiting"]),
            ]
            for row in result["users"]
        ]
        header = ["USER", "SHARE", "USAGE", "FACTOR", "PRIORITY", "RUNNING", "GPUS", "WAITING"]
        print(table(header, rows))
        print(
            f"usage half-life {format_duration(result['half_life'])}; "
            f"waiting {format_duration(result['aging'])} adds 1 to a job's priority",
            file=sys.stderr,
        )

    run(json_out, body)


def unit_text(python: str, config_path: Path) -> str:
    """The systemd unit of the lab daemon.

    `KillMode=process`: stopping or restarting the daemon must not kill the
    jobs (their shims keep them; the daemon adopts them when it is back).
    """
    return f"""[Unit]
Description=gpuq lab daemon: the GPU job queue shared by this server's users
After=network.target

[Service]
Type=simple
ExecStart={python} -m gpuq.daemon --config {config_path}
Restart=on-failure
KillMode=process

[Install]
WantedBy=multi-user.target
"""


_ACCOUNT_EXAMPLE = 'service_account = "gpuq"  # the account the servers log in to each other as'
_HEAD_EXAMPLE = 'head = "gpuq@gpu1"        # on every server but the one keeping the queue'


def config_text(admins: list[str], service_account: str = "", head: str = "") -> str:
    """The lab daemon's starting configuration (docs/configuration.md has every key)."""
    listed = ", ".join(json.dumps(admin) for admin in admins)  # a TOML basic string each
    account = "# " + _ACCOUNT_EXAMPLE
    if service_account:
        account = f"service_account = {json.dumps(service_account)}"
    head_line = "# " + _HEAD_EXAMPLE
    if head:
        head_line = f"head = {json.dumps(head)}"
    return f"""# The gpuq lab daemon (gpuq lab install); every key: docs/configuration.md.
[daemon]
state_dir = "/var/lib/gpuq"
runtime_dir = "/run/gpuq"

[lab]
enabled = true
socket = "{LAB_SOCKET}"
admins = [{listed}]
# hide_others = true         # other users' job names and commands shown as "-"
# max_gpus = 8               # per user; 0: no limit
# max_running = 16
# max_queued = 1000
# max_priority = 0           # the highest --priority users may give (admins: any)
# half_life = "7d"           # fair share: how fast past usage is forgiven
# Several servers (docs/lab.md): one keeps the queue, the others forward to it.
{account}
{head_line}
# [lab.shares]               # a user not named has share 1
# alice = 2
"""


@lab_app.command("install")
def install(
    admins: Annotated[
        list[str] | None,
        typer.Option(
            "--admin",
            metavar="USER|@GROUP",
            help="A user or @group who may act on every job (repeatable).",
        ),
    ] = None,
    root: Annotated[
        Path,
        typer.Option(
            "--root", metavar="DIR", help="Write below this directory instead of / (for packaging)."
        ),
    ] = Path("/"),
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite an existing config file.")
    ] = False,
    service_account: Annotated[
        str,
        typer.Option(
            "--service-account",
            metavar="USER",
            help="The account the lab's servers log in to each other as over ssh.",
        ),
    ] = "",
    head: Annotated[
        str,
        typer.Option(
            "--head",
            metavar="HOST",
            help="This server is a member: the lab's queue is kept on HOST (ssh destination).",
        ),
    ] = "",
    json_out: JsonOpt = False,
) -> None:
    """Install the lab daemon: a systemd unit and /etc/gpuq/config.toml.

    The daemon runs as root, listens on /run/gpuq/gpuq.sock for every local
    user, takes each caller's identity from the kernel, and runs each job as
    the user who submitted it. Then: `systemctl daemon-reload && systemctl
    enable --now gpuq`, and `gpuq doctor --config /etc/gpuq/config.toml`.
    Users' commands then use it by themselves. With several servers, one
    keeps the lab's queue and every other is installed with `--head` naming
    it (docs/lab.md). Exit 9 when not root.
    """

    def body() -> None:
        if root == Path("/") and os.geteuid() != 0:
            raise PermissionDenied(
                "installing the lab daemon needs root", "run it with sudo, or give --root DIR"
            )
        text = config_text(admins or ["@gpuadmin"], service_account, head)
        _check_config(text)
        unit, conf = root / UNIT_PATH, root / CONFIG_PATH
        written = [_write(unit, unit_text(sys.executable, Path("/") / CONFIG_PATH), force=True)]
        written.append(_write(conf, text, force=force))
        if json_out:
            print_json({"unit": str(unit), "config": str(conf), "written": written})
            return
        for path, done in zip((unit, conf), written, strict=True):
            print(f"{'wrote' if done else 'kept'} {path}", file=sys.stderr)
        print(
            "next: systemctl daemon-reload && systemctl enable --now gpuq; "
            f"then gpuq doctor --config {Path('/') / CONFIG_PATH}",
            file=sys.stderr,
        )

    run(json_out, body)


def _check_config(text: str) -> None:
    """Raise the config's own error (ConfigError, with the key) if `text` would not load."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as handle:
        handle.write(text)
        handle.flush()
        try:
            load_config(handle.name)
        except ConfigError as exc:
            message = exc.message.replace(f" in {handle.name}", "").replace(handle.name, "it")
            raise UsageError(message, exc.hint) from None


def _write(path: Path, text: str, *, force: bool) -> bool:
    """Write `text` to `path` (mode 0644, parents made); False if it exists and not `force`."""
    if path.exists() and not force:
        return False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    return True
