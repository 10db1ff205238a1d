"""`gpuq migrate`: move a running job to another server (or GPUs of this one)."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuq.cli.common import ConfigOpt, JsonOpt, print_json, run
from gpuq.cli.link import connected
from gpuq.config import load_config


def migrate(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The running job to move.")],
    to: Annotated[
        str,
        typer.Option(
            "--to", metavar="HOST", help="The node: a server of [cluster], or this one's name."
        ),
    ],
    json_out: JsonOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Move a running gpuq.runner job to another node: checkpoint, copy, resume there.

    The job saves a checkpoint at its next iteration boundary and exits; its
    checkpoint is copied to HOST (rsync over ssh, then checked against each
    file's SHA-256) and the job restarts there from it, on GPUs reserved for
    it now. `gpuq show ID` gives the time of each phase. Exit 2 for an
    unknown node, 4 if the job is not running with a connected runner, 5 if
    HOST is down or has too few free GPUs.
    """

    def body() -> None:
        with connected(load_config(config)) as client:
            result = client.call("migrate", id=job_id, to=to)
        if json_out:
            print_json({"migration": result})
            return
        print(f"job {result['id']}: migrating from {result['from']} to {result['to']}")

    run(json_out, body)
