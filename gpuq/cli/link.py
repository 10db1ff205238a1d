"""How a command tells its user which daemon it talks to, without typer.

`gpuq submit`'s fast path runs without typer, and the other commands
through it: both say the daemon's notice (a lab's daemon chosen, say) and
warn when the daemon runs on another config file than the command's
(one started by `gpuq ls --config test.toml` goes on serving every later
command, with that file's GPUs and policy).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuq.client import Client
    from gpuq.config import Config


def say_notice(client: Client) -> None:
    """Say on stderr which daemon a command talks to, where that is not obvious."""
    if client.notice:
        print(f"gpuq: {client.notice}", file=sys.stderr)


def warn_other_config(client: Client, config: Config) -> None:
    """Warn on stderr if the daemon runs on another config file than `config`'s.

    Says nothing until the daemon has answered the hello, which it does
    with the first request's answer.
    """
    from gpuq.client import OTHER_CONFIG_HINT

    if (other := client.other_config(config)) is not None:
        print(f"gpuq: warning: {other} ({OTHER_CONFIG_HINT})", file=sys.stderr)


@contextlib.contextmanager
def connected(config: Config, *, autostart: bool = True, notice: bool = True) -> Iterator[Client]:
    """A client of `config`'s daemon, its notice said; a daemon on another file is warned of.

    The warning comes once the command has its answer (the hello's answer
    arrives with the first request's) or its error: a "no GPUs" that
    comes from a test config's daemon then says so.
    """
    from gpuq.client import Client

    client = Client.connect(config, autostart=autostart)
    if notice:
        say_notice(client)
    try:
        yield client
    finally:
        client.close()
        warn_other_config(client, config)


def opened(config: Config) -> Client:
    """A client its caller closes, for a command that may block for long (a wait, a followed log).

    Its hello is read first, so that the notice and the warning come
    before the wait, not hours later when it ends.
    """
    from gpuq.client import Client

    client = Client.connect(config)
    say_notice(client)
    try:
        _ = client.hello  # read now, rather than with the first request's answer
    except BaseException:
        client.close()
        raise
    warn_other_config(client, config)
    return client
