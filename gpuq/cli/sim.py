"""`gpuq sim`: replay a workload on a simulated cluster under one or more policies.

The simulator (`gpuq.sim`) runs the very policy objects the daemon uses
(`gpuq.policies.registry`); its run loop is `gpuq.sim.run`, and this module
only parses, shows progress and renders. numpy, scipy and the simulator are
imported inside the command, so other commands (`gpuq submit` above all)
stay light.

Workloads (`--workload`) and policies (`--policy`, `--compare`, with
`NAME:KEY=VALUE` options) are named as `gpuq.sim.run` documents.

Several policies
    `--compare a,b,c` runs each policy (after `--policy`, if given) on the same
    workload and prints them side by side. Runs go to `--jobs` worker
    processes (default: the number of CPUs), each policy in its own; with one
    worker or one policy everything runs in this process.

Progress
    Shown on stderr only when stderr is a terminal and `--json` is not given,
    as one line rewritten in place: the percentage of the workload's jobs
    finished, for a run in this process, or how many policies have finished
    when they run in worker processes. Nothing else goes to stderr but errors.

Output
    A table on stdout: average, median and 99th-percentile job completion
    time (seconds), makespan (seconds), GPU utilization, finish-time fairness
    rho (average and worst), reallocations, and the policy's average decision
    time in milliseconds. `--json` prints `{"schema_version": 1, "workload": ..., "settings":
    {...}, "results": {policy: summary}}` where each summary has `avg_jct`
    and the simulator's other metrics.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuq.cli.errors import render_error
from gpuq.cli.render import table
from gpuq.errors import GpuqError, UsageError
from gpuq.models import JSON_SCHEMA_VERSION
from gpuq.textsafe import visible
from gpuq.workloads import WORKLOAD_FORMS

if TYPE_CHECKING:
    from gpuq.sim.cluster import SimCluster
    from gpuq.sim.run import SimSettings
    from gpuq.sim.workload import WorkloadJob


class Progress:
    """One status line on stderr, rewritten in place (silent when disabled).

    Not `in_place` (stderr is a log file, not a terminal), each change is a
    line of its own instead, so a long run still shows where it is.
    """

    def __init__(self, enabled: bool, in_place: bool = True) -> None:
        self.enabled = enabled
        self.in_place = in_place
        self.shown = ""

    def show(self, text: str) -> None:
        """Replace the line with `text` if it changed (escaped: policy names are user text)."""
        text = visible(text)
        if self.enabled and text != self.shown:
            if self.in_place:
                sys.stderr.write("\r" + text.ljust(len(self.shown)))
            else:
                sys.stderr.write(text + "\n")
            sys.stderr.flush()
            self.shown = text

    def clear(self) -> None:
        """Erase the line (a line of its own stays)."""
        if self.enabled and self.shown and self.in_place:
            sys.stderr.write("\r" + " " * len(self.shown) + "\r")
            sys.stderr.flush()
        self.shown = ""


_COLUMNS = (
    ("policy", None, ""),
    ("avg JCT", "avg_jct", "s"),
    ("median", "median_jct", "s"),
    ("p99", "p99_jct", "s"),
    ("makespan", "makespan", "s"),
    ("util", "gpu_utilization", "%"),
    ("rho avg", "avg_rho", "x"),
    ("rho max", "max_rho", "x"),
    ("realloc", "reallocations", "n"),
    ("decide ms", "decision_time_mean", "ms"),
)


def _cell(value: object, unit: str) -> str:
    if not isinstance(value, int | float):
        return "-"
    if unit == "s":
        return f"{value:.0f}"
    if unit == "%":
        return f"{100 * value:.1f}%"
    if unit == "x":
        return f"{value:.2f}"
    if unit == "ms":
        return f"{1000 * value:.2f}"
    return f"{value:.0f}"


def results_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The summary table: one row per policy, times in seconds."""
    header = [title for title, _, _ in _COLUMNS]
    rows = [
        [name, *(_cell(summary.get(key or ""), unit) for _, key, unit in _COLUMNS[1:])]
        for name, summary in results.items()
    ]
    return table(header, rows)


def users_table(results: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Per policy and user: jobs, average JCT and share of the GPU time (None: no users)."""
    rows = [
        [
            name,
            user,
            str(row["jobs"]),
            _cell(row.get("avg_jct"), "s"),
            f"{row['gpu_share']:.1%}",
        ]
        for name, summary in results.items()
        for user, row in sorted((summary.get("users") or {}).items())
    ]
    if not rows:
        return None
    return table(["POLICY", "USER", "JOBS", "AVG JCT", "GPU TIME"], rows)


def _cluster(
    spec: str | None, nodes: int | None, gpus_per_node: int | None, workload: str = ""
) -> SimCluster:
    """The cluster of `--cluster`, or of `--nodes` and `--gpus-per-node`, never both.

    With none of them, the Pollux artifact's 16 x 4, or for a `lab:` workload
    the one server of 8 it is drawn for.
    """
    from gpuq.sim.cluster import load_cluster, uniform_cluster

    if spec is None:
        if nodes is None and gpus_per_node is None and workload.startswith("lab:"):
            return uniform_cluster(1, 8)
        return uniform_cluster(
            16 if nodes is None else nodes, 4 if gpus_per_node is None else gpus_per_node
        )
    if nodes is not None or gpus_per_node is not None:
        raise UsageError(
            "--cluster names the nodes; --nodes and --gpus-per-node cannot go with it",
            hint="drop --nodes/--gpus-per-node, or describe the nodes in the cluster file",
        )
    return load_cluster(spec)


def _with_users(
    jobs: tuple[WorkloadJob, ...],
    settings: SimSettings,
    users: str | None,
    user_copies: str | None,
    shares: str | None,
    half_life: str,
    max_gpus: int,
) -> tuple[tuple[WorkloadJob, ...], SimSettings]:
    """The workload with owners and the settings with fair share, as the lab options say."""
    from gpuq.sim.fair import SimLab
    from gpuq.sim.run import parse_users
    from gpuq.sim.workload import assign_users, copies_for_users
    from gpuq.units import parse_duration

    if users and user_copies:
        raise UsageError(
            "--users and --user-copies both give jobs owners: use one",
            hint="--users draws an owner per job; --user-copies gives each user copies of all",
        )
    named: set[str] = set()
    if users:
        weights = parse_users(users)
        named = set(weights)
        if not any(weight > 0 for weight in weights.values()):
            raise UsageError(
                f"--users {users!r} gives no user a weight above 0",
                hint="weights are odds of owning each job, such as alice=10,bob=1",
            )
        jobs = assign_users(jobs, weights, settings.seed)
    elif user_copies:
        counts = parse_users(user_copies)
        named = set(counts)
        if any(count != int(count) for count in counts.values()) or not any(counts.values()):
            raise UsageError(
                f"--user-copies {user_copies!r} must give whole numbers of copies, one above 0",
                hint="such as --user-copies heavy=10,light=1",
            )
        jobs = copies_for_users(jobs, {name: int(count) for name, count in counts.items()})
    if max_gpus < 0:
        raise UsageError(
            "--max-gpus-per-user must be 0 (no limit) or more",
            hint="the most GPUs one user's jobs hold at once",
        )
    lab = SimLab(
        shares=parse_users(shares) if shares else {},
        half_life=parse_duration(half_life, bare_minutes=False),
        max_gpus=max_gpus,
    )
    if lab.half_life <= 0:
        raise UsageError("--half-life must be more than 0", hint="such as 7d (the default) or 12h")
    if any(share <= 0 for share in lab.shares.values()):
        raise UsageError(
            f"--shares {shares!r}: every share must be more than 0",
            hint="shares are relative, such as alice=2,bob=1; a user left out has 1",
        )
    owners = sorted(named | {job.user for job in jobs if job.user})
    strangers = sorted(set(lab.shares) - set(owners))
    if strangers:
        raise UsageError(
            f"--shares names {', '.join(strangers)}, who own"
            f"{'s' if len(strangers) == 1 else ''} no job of the workload"
            + (f" (its users: {', '.join(owners)})" if owners else ""),
            hint="name the users of --users or --user-copies (or of the workload's user column)"
            if owners
            else "give jobs owners with --users or --user-copies, or a workload with a user column",
        )
    if not (users or user_copies or shares or max_gpus):
        return jobs, settings
    return jobs, dataclasses.replace(settings, lab=lab)


def sim_command(
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            "-w",
            metavar="SPEC",
            help=f"The workload: {WORKLOAD_FORMS}.",
        ),
    ],
    policy: Annotated[
        str | None,
        typer.Option(
            "--policy",
            "-p",
            metavar="NAME",
            help="Policy to simulate, with options as NAME:KEY=VALUE (gpuq:starts=free).",
        ),
    ] = None,
    compare: Annotated[
        str | None,
        typer.Option(
            "--compare", metavar="A,B,...", help="Comma-separated policies to run side by side."
        ),
    ] = None,
    cluster: Annotated[
        str | None,
        typer.Option(
            "--cluster",
            metavar="NAME|FILE",
            help="Nodes and GPU types: pollux, sia, sia-t4, phoebe or a TOML file.",
        ),
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            "--nodes",
            metavar="N",
            help="Nodes of 4 T4 GPUs (default 16; 1 node of 8 for a lab: workload).",
        ),
    ] = None,
    gpus_per_node: Annotated[
        int | None, typer.Option("--gpus-per-node", metavar="N", help="GPUs per node (default 4).")
    ] = None,
    interval: Annotated[
        float,
        typer.Option("--interval", metavar="SECONDS", help="Seconds between scheduling decisions."),
    ] = 60.0,
    restart_penalty: Annotated[
        float,
        typer.Option(
            "--restart-penalty", metavar="SECONDS", help="Seconds a job loses per reallocation."
        ),
    ] = 30.0,
    interference: Annotated[
        float,
        typer.Option(
            "--interference",
            metavar="FRACTION",
            help="Slowdown of distributed jobs sharing a node, in [0, 1).",
        ),
    ] = 0.0,
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Seed of the simulator and policies.")
    ] = 0,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs", "-j", metavar="N", help="Worker processes for --compare (default: CPUs)."
        ),
    ] = None,
    users: Annotated[
        str | None,
        typer.Option(
            "--users",
            metavar="NAME=W,...",
            help="Give each job an owner, drawn with these odds (alice=10,bob=1).",
        ),
    ] = None,
    user_copies: Annotated[
        str | None,
        typer.Option(
            "--user-copies",
            metavar="NAME=N,...",
            help="Each user submits N copies of every job (alice=10,bob=1).",
        ),
    ] = None,
    shares: Annotated[
        str | None,
        typer.Option(
            "--shares", metavar="NAME=S,...", help="Fair shares of users (default 1 each)."
        ),
    ] = None,
    half_life: Annotated[
        str,
        typer.Option(
            "--half-life", metavar="DURATION", help="Fair share: half-life of past usage (7d)."
        ),
    ] = "7d",
    max_gpus_per_user: Annotated[
        int,
        typer.Option(
            "--max-gpus-per-user", metavar="N", help="Most GPUs one user holds (0: no limit)."
        ),
    ] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Simulate a workload under one or more scheduling policies and compare them.

    The workload is a CSV file (name,time,application,num_replicas,batch_size),
    a bundled trace of the Pollux or Sia artifact (--workload lists them),
    gen:SEED[:tuned|realistic][:LOAD], drawn by the Pollux
    recipe for this cluster, or lab:SEED[:tuned|realistic][:LOAD], its lab
    variant: one server of 8 GPUs at 1.5x load (30 jobs). The table gives the
    average, median and p99 job completion time and the makespan in seconds,
    GPU utilization, finish-time fairness (rho, average and worst),
    reallocations and the average decision time in milliseconds; --json gives
    the same per policy under "results".

    The cluster is --nodes x --gpus-per-node T4 GPUs on the Pollux tables
    (16 x 4 by default; 1 x 8 for a lab: workload), or --cluster: a bundled
    one (pollux: that default; sia: Sia's mixed 64 GPUs, 6x4 T4 + 3x8
    RTX2080Ti + 2x8 A100; sia-t4: 16x4 T4 on Sia's tables; phoebe: 3x8
    RTX2080Ti + 2x8 A100 + 1x4 RTX6000) or a TOML file of node groups, each
    `[[nodes]]` with type (T4, RTX2080Ti, A100, RTX6000), gpus and count, and
    `tables = "sia"` or "pollux". Jobs run on the measured tables of the GPU type they hold.

    Policies: fifo, srtf, srsf, tiresias, optimus, afs, afs-p, pollux, sia,
    gandiva, ones, gpuq; the daemon runs fifo, tiresias, pollux, gandiva, gpuq
    (scheduler.policy), the others only here so far; gpuq is its default.

    Lab mode: --users draws an owner for each job, or --user-copies has each
    user submit copies of the workload (one user 10x the other's work:
    --user-copies heavy=10,light=1); the policies then share the GPUs by
    --shares (fair share with usage decayed by --half-life; fifo and gpuq
    enforce it, with --max-gpus-per-user), and the results give each user's
    jobs, average JCT and share of the GPU time.
    """
    try:
        from gpuq.sim.run import SimSettings, policy_names, resolve_workload, run_policies

        shape = _cluster(cluster, nodes, gpus_per_node, workload)
        settings = SimSettings(
            len(shape.nodes),
            max(node.gpus for node in shape.nodes),
            interval,
            restart_penalty,
            interference,
            seed,
            cluster=shape,
        )
        settings.check()
        names = policy_names(policy, compare)
        workers = jobs if jobs is not None else (os.cpu_count() or 1)
        if workers < 1:
            raise UsageError(
                "--jobs must be at least 1", "--jobs 1 runs the policies one after another"
            )
        jobs_list = resolve_workload(workload, shape.total_gpus, settings.gpus_per_node)
        jobs_list, settings = _with_users(
            jobs_list, settings, users, user_copies, shares, half_life, max_gpus_per_user
        )
        progress = Progress(enabled=not json_out and sys.stderr.isatty())
        try:
            results = run_policies(names, jobs_list, settings, workers, progress.show)
        finally:
            progress.clear()
    except GpuqError as error:
        raise typer.Exit(render_error(error, json_out)) from None
    if json_out:
        document = {
            "schema_version": JSON_SCHEMA_VERSION,
            "workload": workload,
            "settings": {**asdict(settings), "cluster": shape.describe()},
            "results": results,
        }
        print(json.dumps(document, indent=2))
    else:
        print(results_table(results))
        if (per_user := users_table(results)) is not None:
            print()
            print(per_user)
