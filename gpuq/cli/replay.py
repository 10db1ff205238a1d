"""`gpuq replay`: run a simulator workload on the live daemon and report what `gpuq sim` reports.

Each job of the workload runs as a trace job (`gpuq.replay.tracejob`): it
behaves like the simulator's application, with time compressed by
`--speedup`, under the daemon's policy, on its GPUs (fake ones work). Where
the daemon's policy runs adaptive jobs (pollux, gpuq), the jobs are
submitted as the simulator runs them, adaptive (`--gpus 1-MAX`), and each
trace job picks its batch by goodput and reports its model through
gpuq.runner, as the simulator's job does. The command submits the jobs at
their arrival times, waits for all of them and prints the simulator's
table for the live run, times in simulated seconds, so the two can be
compared line by line: `gpuq sim --nodes 1 --gpus-per-node G` is the same
cluster as a daemon with G GPUs.

The daemon's policy and its time constants are real time: to compare with
the simulator at `--speedup S`, set `scheduler.interval` to 60/S seconds
(the simulator's tick) and divide the policy's own times by S: for pollux
and gpuq `restart_penalty` = 30/S, for gandiva `quantum` = 300/S (a turn of
5 simulated minutes), for tiresias `thresholds_gpu_hours` = 16/S
(`gpuq.replay.timescale` gives the section). Trace jobs start through a
fork server this command runs for the length of the replay, so that an
attempt starts in a fraction of a second rather than after an import of
torch; a job still running when the replay is interrupted finishes under
it.

Workloads are named as for `gpuq sim` (`gpuq.workloads.WORKLOAD_FORMS`);
gen: ones are drawn for the daemon's GPUs, lab: ones (the generator's lab
variant) for one server of 8. `--first N` replays only the first N jobs to
arrive.

Progress (jobs submitted and ended) is shown on stderr, one line
rewritten in place on a terminal, else a line each time a job is submitted
or ends, and never with `--json`; `--json` prints `{"schema_version", "workload", "settings",
"results": {policy: summary}}` as `gpuq sim --json` does. Exit status 0
when every job succeeded; a job that fails or is cancelled stops the
replay with its reason (exit 1); Ctrl-C stops waiting (exit 130), and
the jobs already submitted keep running: it names them and the `gpuq
cancel` that ends them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from typing import Annotated

import typer

from gpuq.cli.common import ConfigOpt
from gpuq.cli.errors import render_error
from gpuq.cli.link import connected
from gpuq.cli.sim import Progress, results_table
from gpuq.errors import GpuqError, UsageError
from gpuq.models import JSON_SCHEMA_VERSION
from gpuq.workloads import WORKLOAD_FORMS


def replay_command(
    workload: Annotated[
        str,
        typer.Argument(
            metavar="WORKLOAD",
            help=f"The workload, as for gpuq sim: {WORKLOAD_FORMS}.",
        ),
    ],
    speedup: Annotated[
        float,
        typer.Option("--speedup", metavar="FACTOR", help="Simulated seconds per real second."),
    ] = 60.0,
    restart_penalty: Annotated[
        float,
        typer.Option(
            "--restart-penalty",
            metavar="SECONDS",
            help="Simulated seconds each (re)start costs, as in sim.",
        ),
    ] = 30.0,
    first: Annotated[
        int | None, typer.Option("--first", metavar="N", help="Replay only the first N jobs.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Replay a workload on the live daemon with trace jobs; report it as gpuq sim does.

    Each job behaves like the simulator's application, time compressed by
    --speedup, so the table (simulated seconds) compares with gpuq sim
    --nodes 1 --gpus-per-node G on a daemon with G GPUs. Jobs already
    submitted keep running if the replay is interrupted.
    """
    try:
        from gpuq.config import load_config
        from gpuq.replay.forkserver import ForkServer
        from gpuq.replay.run import ReplaySettings, replay
        from gpuq.sim.run import check_workload, resolve_workload

        settings = ReplaySettings(speedup=speedup, restart_penalty=restart_penalty)
        settings.check()
        if first is not None and first < 1:
            raise UsageError(
                f"--first must be at least 1, got {first}",
                "--first N replays the workload's first N jobs; leave it out for all",
            )
        check_workload(workload)  # before the daemon is reached (or started)
        with connected(load_config(config)) as client:
            gpus = int(client.call("status").get("gpus", 0))
            if gpus < 1:
                raise UsageError(
                    "the daemon has no GPUs to replay a workload on",
                    hint="declare fake GPUs ([[gpus.fake]] in the config) to replay without any",
                )
            jobs = resolve_workload(workload, gpus, gpus)[: first or None]
            progress = Progress(enabled=not json_out, in_place=sys.stderr.isatty())
            try:
                with ForkServer() as server:
                    result = replay(
                        client,
                        jobs,
                        replace(settings, fork_server=str(server.path)),
                        lambda p: progress.show(
                            f"replay: {p.submitted} of {p.total} jobs submitted, {p.ended} done"
                        ),
                    )
            finally:
                progress.clear()
    except GpuqError as error:
        raise typer.Exit(render_error(error, json_out)) from None
    except KeyboardInterrupt as stop:
        _say_interrupted(getattr(stop, "ids", None))
        raise typer.Exit(130) from None
    results = {f"{result.policy} (live)": result.summary()}
    if json_out:
        document = {
            "schema_version": JSON_SCHEMA_VERSION,
            "workload": workload,
            "settings": {k: v for k, v in asdict(settings).items() if k != "fork_server"}
            | {"gpus": gpus, "jobs": len(jobs)},
            "results": results,
        }
        print(json.dumps(document, indent=2))
    else:
        print(results_table(results))


def _say_interrupted(ids: tuple[int, ...] | None) -> None:
    """Name on stderr the jobs an interrupted replay leaves running, and how to cancel them.

    `ids` is None when the interrupt came before the replay began (or after it ended).
    """
    from gpuq.cli.submit import task_ranges

    if ids is None:
        print("gpuq: replay interrupted: jobs it submitted keep running", file=sys.stderr)
        return
    if not ids:
        print("gpuq: replay interrupted before it submitted a job", file=sys.stderr)
        return
    which = f"job {ids[0]} keeps" if len(ids) == 1 else f"jobs {task_ranges(list(ids))} keep"
    print(f"gpuq: replay interrupted: {which} running", file=sys.stderr)
    print(f"hint: gpuq cancel {' '.join(map(str, ids))} ends them", file=sys.stderr)
