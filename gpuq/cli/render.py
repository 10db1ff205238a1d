"""Plain-text rendering of jobs, events and GPUs for the terminal.

Pure functions from the documented JSON objects to text, so the CLI's human
output and its `--json` output come from the same data. `now` is passed in.
Every table cell and every line of `show` goes through `gpuq.textsafe.visible`:
user text (names, commands, paths, reasons) reaches the terminal with its
control characters escaped, so it cannot clear the screen or forge a row.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from typing import Any

from gpuq.textsafe import visible
from gpuq.units import format_duration, format_size

JOB_COLUMNS = ("ID", "NAME", "STATE", "GPUS", "TIME", "EXIT", "REASON")
NODE_COLUMN_AFTER = JOB_COLUMNS.index("GPUS") + 1
"""Where the NODE column goes in a `gpuq ls` table that has one."""
PENDING_STATES = frozenset({"queued", "held"})


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces; the last column unpadded.

    Cells are shown through `visible`, so each row stays one line.
    """
    header = [visible(cell) for cell in header]
    rows = [[visible(cell) for cell in row] for row in rows]
    widths = [len(h) for h in header]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in (header, *rows):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def gpus_cell(job: dict[str, Any]) -> str:
    """`2`, `1x6.0G` (a share), `1-8` (adaptive; `4/1-8` holding 4), or `-` for CPU only."""
    if job["gpus"] == 0:
        return "-"
    if job["gpu_mem"] is not None:
        return f"{job['gpus']}x{format_size(job['gpu_mem'])}"
    if job["spec"].get("gpu_mem_auto"):
        return f"{job['gpus']}xauto"
    if job.get("gpus_max") is not None:
        held = len(job.get("gpu_uuids") or ())
        asked = f"{job['gpus']}-{job['gpus_max']}"
        return f"{held}/{asked}" if held else asked
    return str(job["gpus"])


def time_cell(job: dict[str, Any], now: float) -> str:
    """Run time for jobs that ever started (suspended time excluded), time waited for others.

    A job object's `run_time` is as of the reply that carried it.
    """
    if job.get("first_start_time") is not None or job["start_time"] is not None:
        return format_duration(float(job.get("run_time") or 0.0))
    if job["end_time"] is not None:
        return "-"
    return format_duration(max(0.0, now - job["submit_time"]))


def node_cell(job: dict[str, Any]) -> str:
    """The server the job runs or ran on; empty while it waits (even after an earlier attempt)."""
    if job["state"] in PENDING_STATES:
        return ""
    return str(job.get("node") or "")


def shows_nodes(jobs: Sequence[dict[str, Any]], nodes: Sequence[str] = ()) -> bool:
    """Whether `gpuq ls` has a NODE column.

    It has one where jobs may run on several servers: the daemon has other
    servers (`nodes`, from the `list` reply, names more than one), or the
    jobs listed ran on more than one. A single server's table stays as it was.
    """
    return len(set(nodes)) > 1 or len({job.get("node") for job in jobs} - {"", None}) > 1


def jobs_table(
    jobs: Sequence[dict[str, Any]], now: float | None = None, nodes: Sequence[str] = ()
) -> str:
    """The `gpuq ls` table, with a NODE column where `shows_nodes(jobs, nodes)`."""
    now = time.time() if now is None else now
    with_node = shows_nodes(jobs, nodes)
    rows = []
    for job in jobs:
        name = job["name"]
        if job["array_index"] is not None:
            name = f"{name}[{job['array_index']}]"
        row = [
            str(job["id"]),
            name[:24],
            job["state"],
            gpus_cell(job),
            time_cell(job, now),
            "" if job["exit_code"] is None else str(job["exit_code"]),
            job["reason"],
        ]
        if with_node:
            row.insert(NODE_COLUMN_AFTER, node_cell(job))
        rows.append(row)
    header = list(JOB_COLUMNS)
    if with_node:
        header.insert(NODE_COLUMN_AFTER, "NODE")
    return table(header, rows)


def node_detail(job: dict[str, Any]) -> str:
    """The `Node:` of `gpuq show`: the server of the current or last attempt.

    A job waiting again (a retry, a resume from a checkpoint) may start on
    another server, so its last server is told as the past: `- (last ran on gpu2)`.
    """
    node = str(job.get("node") or "")
    if not node:
        return "-"
    if "," in node:  # a multi-node job's parts, rank 0 first
        node = " ".join(f"{name} (rank {rank})" for rank, name in enumerate(node.split(",")))
    if job["state"] in PENDING_STATES:
        return f"- (last ran on {node})"
    return node


def _when(stamp: float | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def placement_text(spec: dict[str, Any]) -> str | None:
    """A spec's placement constraint in words (`on gpu2 or gpu3; not on head; GPU type A100`)."""
    parts = []
    if int(spec.get("node_count") or 1) > 1:
        parts.append(f"{spec['node_count']} servers, one part on each")
    if spec.get("nodes"):
        parts.append("on " + " or ".join(spec["nodes"]))
    if spec.get("exclude_nodes"):
        parts.append("not on " + ", ".join(spec["exclude_nodes"]))
    if spec.get("labels"):
        parts.append("labels " + ", ".join(spec["labels"]))
    if spec.get("gpu_types"):
        parts.append("GPU type " + " or ".join(spec["gpu_types"]))
    return "; ".join(parts) or None


def _state_with_reason(state: str, reason: str | None) -> str:
    """`failed (exited with code 2)`; a reason that starts with the state stands alone.

    "suspended (stop mode)", not "suspended (suspended (stop mode))".
    """
    if not reason:
        return state
    if reason == state or reason.startswith(f"{state} "):
        return reason
    return f"{state} ({reason})"


def job_detail(
    job: dict[str, Any],
    events: Sequence[dict[str, Any]],
    metrics: dict[str, Any] | None = None,
    attempts: Sequence[dict[str, Any]] = (),
    now: float | None = None,
    migrations: Sequence[dict[str, Any]] = (),
    sizing: str | None = None,
) -> str:
    """The `gpuq show` text: spec, state, GPUs, timings, attempts, moves, metrics and history.

    `sizing` is why a running adaptive job has the GPUs it has (the policy's note).

    Each line goes through `visible`, so no field can add a line or a terminal escape.
    """
    now = time.time() if now is None else now
    spec = job["spec"]
    first = job.get("first_start_time") or job["start_time"]
    wall = None
    if first is not None:
        wall = format_duration(max(0.0, (job["end_time"] or now) - first))
    lines = [
        f"Job {job['id']}: {job['name']}",
        f"  State:      {_state_with_reason(job['state'], job['reason'])}",
        f"  Command:    {shlex.join(spec['command'])}",
        f"  Directory:  {spec['cwd']}",
        f"  User:       {job['user']}",
        f"  GPUs:       {gpus_cell(job)}"
        + (f" on {', '.join(job['gpu_uuids'])}" if job["gpu_uuids"] else ""),
        *([f"  Sizing:     {sizing}"] if sizing else []),
        f"  Node:       {node_detail(job)}",
        f"  Priority:   {job['priority']}",
        f"  Submitted:  {_when(job['submit_time'])}",
        f"  Started:    {_when(first)}"
        + (
            f" (attempt {job['attempts']} at {_when(job['start_time'])})"
            if len(attempts) > 1
            else ""
        ),
        f"  Ended:      {_when(job['end_time'])}",
        f"  Run time:   {format_duration(float(job.get('run_time') or 0.0))} "
        "(suspended time excluded)" + (f"; {wall} since the first start" if wall else ""),
        f"  Exit code:  {'-' if job['exit_code'] is None else job['exit_code']}"
        + (f" ({job['signal']})" if job["signal"] else ""),
        f"  Output:     {job['stdout'] or '-'}",
    ]
    if job["stderr"] and job["stderr"] != job["stdout"]:
        lines.append(f"  Errors:     {job['stderr']}")
    optional = {
        "Array": None
        if job["array_index"] is None
        else f"task {job['array_index']} of array {job['array_id']}",
        "After": ", ".join(spec["after"]) or None,
        "Time limit": None if spec["time_limit"] is None else format_duration(spec["time_limit"]),
        "Begin": None if spec["begin"] is None else _when(spec["begin"]),
        "Notify": spec["notify"],
        "Placement": placement_text(spec),
    }
    for label, value in optional.items():
        if value:
            lines.append(f"  {label + ':':<11} {value}")
    if metrics:
        lines.append(f"  Metrics:    {metrics_line(metrics)} ({_when(metrics['time'])})")
    lines.append(f"  Attempts:   {job['attempts']} (retries allowed: {spec['retries']})")
    if attempts:
        for attempt in attempts:
            ran = format_duration(attempt["run_time"])
            ended = "running" if attempt["end_time"] is None else _when(attempt["end_time"])
            outcome = f"  {attempt['state']}: {attempt['reason']}" if attempt["reason"] else ""
            lines.append(
                f"    {attempt['attempt']:>3}  {_when(attempt['start_time'])} .. {ended}  "
                f"ran {ran}{outcome}"
            )
    if migrations:
        lines.append("  Migrations:")
        lines.extend(f"    {migration_line(move)}" for move in migrations)
    lines.append("  History:")
    for event in events:
        lines.append(f"    {_when(event['time'])}  {event['state']:<10}  {event['reason']}")
    return "\n".join(map(visible, lines))


def migration_line(move: dict[str, Any]) -> str:
    """`... head -> gpu2: drain 0.10s, save 0.01s, copy 0.52s, ...` (a phase not reached: -)."""
    phases = (
        ("drain", "drain"),
        ("save", "save"),
        ("copy", "copy"),
        ("start", "start"),
        ("first_step", "restore + first step"),
    )
    timed = ", ".join(
        f"{label} {'-' if move.get(key) is None else f'{move[key]:.2f}s'}" for key, label in phases
    )
    return f"{_when(move['requested'])}  {move.get('from') or '?'} -> {move['to']}: {timed}"


def array_detail(array: dict[str, Any], jobs: Sequence[dict[str, Any]]) -> str:
    """The `gpuq show ARRAY_ID` text: the array, its tasks' states, and its tasks."""
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["state"]] = counts.get(job["state"], 0) + 1
    states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    tasks = "1 task" if array["size"] == 1 else f"{array['size']} tasks"
    head = [
        f"Array {array['id']}: {array['name']} ({tasks}: {states or 'none left'})",
        f"  Submitted:  {_when(array['submit_time'])}",
        "",
    ]
    return "\n".join([*map(visible, head), jobs_table(jobs)])


def metrics_line(sample: dict[str, Any]) -> str:
    """One sample in a line: `step 120, epoch 2, 0.031s/step, 2064 samples/s, batch 64, ...`."""
    parts = [f"step {sample['step']}", f"epoch {sample.get('epoch', 0)}"]
    if sample.get("step_seconds") is not None:
        parts.append(f"{sample['step_seconds']:.3g}s/step")
    if sample.get("samples_per_second") is not None:
        parts.append(f"{sample['samples_per_second']:.4g} samples/s")
    if sample.get("batch_size") is not None:
        parts.append(f"batch {sample['batch_size']}")
    if sample.get("loss") is not None:
        parts.append(f"loss {sample['loss']:.4g}")
    if sample.get("memory_peak_bytes") is not None:
        low = sample.get("memory_min_bytes")
        low_text = "?" if low is None else format_size(low)
        parts.append(f"memory {low_text}..{format_size(sample['memory_peak_bytes'])}")
    if sample.get("goodput") is not None:
        parts.append(f"goodput {sample['goodput']:.4g}")
    return ", ".join(parts)


METRICS_COLUMNS = (
    "TIME",
    "STEP",
    "EPOCH",
    "S/STEP",
    "SAMPLES/S",
    "BATCH",
    "MEM MIN",
    "MEM PEAK",
    "LOSS",
    "GOODPUT",
)


def _number(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def metrics_table(samples: Sequence[dict[str, Any]]) -> str:
    """The `gpuq metrics` text: one row per sample, oldest first."""
    if not samples:
        return "no metrics: the job has not reported any (does it use gpuq.runner?)"
    rows = []
    for sample in samples:
        low, peak = sample.get("memory_min_bytes"), sample.get("memory_peak_bytes")
        batch = sample.get("batch_size")
        rows.append(
            (
                time.strftime("%H:%M:%S", time.localtime(sample["time"])),
                str(sample["step"]),
                str(sample.get("epoch", 0)),
                _number(sample.get("step_seconds"), 3),
                _number(sample.get("samples_per_second")),
                "-" if batch is None else str(batch),
                "-" if low is None else format_size(low),
                "-" if peak is None else format_size(peak),
                _number(sample.get("loss")),
                _number(sample.get("goodput")),
            )
        )
    return table(METRICS_COLUMNS, rows)


def gpu_nodes(gpus: Sequence[dict[str, Any]], servers: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The servers of a `gpus` reply in the order they are shown.

    The daemon's own first (the nodes of GPUs no configured server names),
    then the servers of `[[cluster.servers]]` in the config's order, those
    without GPUs (down, or none) included.
    """
    hosts = [str(server["host"]) for server in servers]
    own = [str(gpu.get("node") or "") for gpu in gpus]
    order = [node for node in own if node not in hosts] + hosts
    return list(dict.fromkeys(order))


def several_nodes(gpus: Sequence[dict[str, Any]], servers: Sequence[dict[str, Any]] = ()) -> bool:
    """Whether GPUs must be named with their server: servers configured, or GPUs on several."""
    return bool(servers) or len({gpu.get("node") or "" for gpu in gpus}) > 1


def gpu_label(gpu: dict[str, Any], qualified: bool) -> str:
    """`0`, or `gpu2:0` where GPUs of several servers are shown (each server has a GPU 0)."""
    if qualified and gpu.get("node"):
        return f"{gpu['node']}:{gpu['index']}"
    return str(gpu["index"])


def gpus_table(gpus: Sequence[dict[str, Any]], servers: Sequence[dict[str, Any]] = ()) -> str:
    """The `gpuq gpus` table: memory split by owner, utilization, jobs.

    A LINK column (the PCIe switch or NVLink group) appears where any GPU has one.
    With several servers (`several_nodes`), GPUs are named `node:index` and
    grouped by server, in `gpu_nodes` order.
    """
    links = any(gpu.get("link_group") for gpu in gpus)
    qualified = several_nodes(gpus, servers)
    if qualified:
        rank = {node: i for i, node in enumerate(gpu_nodes(gpus, servers))}
        gpus = sorted(gpus, key=lambda gpu: rank[str(gpu.get("node") or "")])
    rows = []
    for gpu in gpus:
        util = "-" if gpu["utilization"] is None else f"{gpu['utilization']:.0f}%"
        link = (gpu.get("link_group") or "-",) if links else ()
        rows.append(
            (
                gpu_label(gpu, qualified),
                gpu["name"],
                format_size(gpu["memory_total"]),
                format_size(gpu["memory_gpuq"]),
                format_size(gpu["memory_foreign"]),
                format_size(gpu["memory_free"]),
                util,
                gpu["mode"],
                ",".join(map(str, gpu["jobs"])) or "-",
                *link,
                gpu["uuid"],
            )
        )
    header = ("GPU", "NAME", "TOTAL", "GPUQ", "OTHER", "FREE", "UTIL", "MODE", "JOBS")
    return table((*header, *(("LINK",) if links else ()), "UUID"), rows)


def server_lines(
    gpus: Sequence[dict[str, Any]], servers: Sequence[dict[str, Any]], now: float
) -> list[str]:
    """A line per configured server that is not up (since when, and why) or is up without GPUs."""
    with_gpus = {gpu.get("node") for gpu in gpus}
    lines = []
    for server in servers:
        host = server["host"]
        since = format_duration(max(0.0, now - float(server.get("since") or now)))
        reason = server.get("reason")
        if server["state"] == "down":
            lines.append(f"{host}: down for {since}" + (f": {reason}" if reason else ""))
        elif server["state"] != "up":
            lines.append(f"{host}: not checked yet" + (f" ({reason})" if reason else ""))
        elif host not in with_gpus:
            lines.append(f"{host}: up, no GPUs")
    return lines


def gpus_text(result: dict[str, Any], now: float | None = None) -> str:
    """The whole `gpuq gpus` text from a `gpus` reply: the table, then servers without GPUs.

    Each line goes through `visible` (a server's reason is an error message
    from ssh or the remote daemon).
    """
    now = time.time() if now is None else now
    gpus, servers = result["gpus"], result.get("servers") or []
    parts = [gpus_table(gpus, servers) if gpus else "No GPUs (CPU-only jobs run with --gpus 0)."]
    others = foreign_lines(gpus)
    if others:
        parts.append("\n".join(visible(line) for line in others))
    down = server_lines(gpus, servers, now)
    if down:
        parts.append("\n".join(visible(line) for line in down))
    return "\n\n".join(parts)


def foreign_lines(gpus: list[dict[str, Any]]) -> list[str]:
    """One line per GPU held by processes gpuq did not start, naming their users where known."""
    lines = []
    several = len({gpu.get("node") for gpu in gpus}) > 1
    for gpu in gpus:
        named = [
            f"{p['user']} (pid {p['pid']}"
            + (f", {format_size(p['used_memory'])})" if p.get("used_memory") else ")")
            for p in gpu.get("processes") or ()
            if p.get("user") and p.get("foreign")
        ]
        if named and gpu.get("memory_foreign"):
            where = f"{gpu['node']}:{gpu['index']}" if several else str(gpu["index"])
            lines.append(f"GPU {where}: also used outside gpuq by {', '.join(named)}")
    return lines
