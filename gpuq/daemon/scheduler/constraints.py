"""Placement constraints: on which servers a job may run, and why it is refused or waits.

A job may name servers to run on (`gpuq submit --node`: any one of them),
servers to avoid (`--exclude-node`) and labels its server must carry
(`--label`: every one of them). The servers it may be placed on are among
the **known nodes**: this machine (`daemon.node_name`, with
`daemon.labels`) and each server of `[[cluster.servers]]` (its `host`, with
its `labels`), all of them read from the config at each use, so a reload
that changes labels or servers takes effect at the next pass.

- At submission (`check_submit`): a node name that is not known, a label no
  node carries, or constraints no node meets are refused, each error
  listing what is known; so is a GPU type no GPU has, or too few of on any
  one server (`check_gpu_types`, once every node's GPUs are seen).
- At each scheduling pass (`Constraints.hold`): a job none of whose nodes
  has GPUs in the daemon's snapshot (down, not reached yet, or not sampled
  yet) waits with a reason naming them ("waiting for node gpu2 (down: ...)",
  "no eligible node is up: gpu2 (...), gpu3 (...)"), and so does one that
  the config no longer lets run anywhere; the others reach the policy with
  their nodes (`JobView.nodes`).
- At binding (`misplaced`): a safety net under every policy, a start on a
  GPU of a node the job may not use is refused.

A job also runs only where its working directory exists: labs share home
directories, but not every directory is on every server. Each pass asks the
other servers about the working directories of the jobs it places (`dirs`:
True where it exists, False where not, None until the server has said);
a server without it (or not asked yet) is not among the job's nodes, and a
job left with none says why ("its working directory /x does not exist on
gpu2"). This machine has every job's directory: submission checked it.

Pure: no I/O (the caller passes the config and each node's status).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuq.config import Config
from gpuq.errors import ResourceError, UsageError
from gpuq.models import GpuInfo, Job, JobSpec
from gpuq.policies.confine import node_names
from gpuq.policies.interface import JobView

KnownNodes = Mapping[str, tuple[str, ...]]
"""Each known node's name and labels, this machine first."""


def known_nodes(config: Config) -> dict[str, tuple[str, ...]]:
    """This machine and the configured servers, each with its labels (module docstring)."""
    nodes = {config.daemon.node_name: config.daemon.labels}
    for server in config.cluster.servers:
        nodes.setdefault(server.host, server.labels)
    return nodes


def eligible_nodes(spec: JobSpec, known: KnownNodes) -> frozenset[str] | None:
    """The known nodes `spec` may run on; None when it has no constraint (any node)."""
    if not spec.constrained:
        return None
    return frozenset(name for name, labels in known.items() if not _out(spec, name, labels))


def _out(spec: JobSpec, name: str, labels: tuple[str, ...]) -> str:
    """Why `spec` may not run on node `name` ("" if it may)."""
    if spec.nodes and name not in spec.nodes:
        return "not named by --node"
    if name in spec.exclude_nodes:
        return "excluded"
    missing = [label for label in spec.labels if label not in labels]
    if missing:
        return f"no label {', '.join(missing)}"
    return ""


def why_none(spec: JobSpec, known: KnownNodes) -> str:
    """Why no known node meets `spec`'s constraints: each node with its reason."""
    return "; ".join(f"{name}: {_out(spec, name, labels)}" for name, labels in known.items())


def labels_text(known: KnownNodes) -> str:
    """Each node's labels, for errors: `head (a100, fast-disk), gpu2 (no labels)`."""
    return ", ".join(
        f"{name} ({', '.join(labels) if labels else 'no labels'})" for name, labels in known.items()
    )


def check_submit(spec: JobSpec, known: KnownNodes) -> None:
    """Refuse constraints no known node can ever meet, naming what is known.

    A name no node has (`--node`, `--label`) is a UsageError, a typo to fix;
    more servers than there are is a ResourceError, as more GPUs are.
    """
    unknown = [name for name in (*spec.nodes, *spec.exclude_nodes) if name not in known]
    if unknown:
        names = ", ".join(dict.fromkeys(unknown))
        raise UsageError(
            f"unknown node {names}: the known nodes are {', '.join(known)}",
            f"add a server with gpuq cluster add {unknown[0]}, or name a known node",
        )
    missing = [label for label in spec.labels if not any(label in v for v in known.values())]
    if missing:
        raise UsageError(
            f"no node carries label {', '.join(dict.fromkeys(missing))}: "
            f"the nodes' labels are {labels_text(known)}",
            "set daemon.labels, or labels of a [[cluster.servers]] table, in the config",
        )
    eligible = eligible_nodes(spec, known)
    if eligible == frozenset():
        raise UsageError(
            f"no node meets the job's placement constraints ({why_none(spec, known)})",
            "loosen --node, --exclude-node or --label",
        )
    usable = len(known) if eligible is None else len(eligible)
    if spec.node_count > usable:
        where = "the known nodes are" if eligible is None else "the job may run on"
        names = ", ".join(known) if eligible is None else ", ".join(sorted(eligible))
        raise ResourceError(
            f"--nodes {spec.node_count} needs {spec.node_count} servers; {where} {names}",
            "add servers with gpuq cluster add HOST, or ask for fewer --nodes",
        )


def check_gpu_types(spec: JobSpec, devices: Sequence[GpuInfo], unseen: Iterable[str]) -> None:
    """Refuse a `--gpu-type` no GPU has, or too few on any one server (ResourceError).

    Only when every known node's GPUs are seen (`unseen` empty): one down,
    or not reached yet, may have them.
    """
    if not spec.gpu_types or any(True for _ in unseen):
        return
    wanted = {name.lower() for name in spec.gpu_types}
    counts: dict[str, int] = {}
    kinds: dict[str, dict[str, int]] = {}
    for gpu in devices:
        per = kinds.setdefault(gpu.type, {})
        per[gpu.node] = per.get(gpu.node, 0) + 1
        if gpu.type.lower() in wanted:
            counts[gpu.node] = counts.get(gpu.node, 0) + 1
    asked = " or ".join(spec.gpu_types)
    if not counts:
        have = "; ".join(
            f"{kind} ({', '.join(f'{node} {n}' for node, n in per.items())})"
            for kind, per in sorted(kinds.items())
        )
        raise ResourceError(
            f"no GPU of type {asked}: the GPUs are {have or 'none'}",
            "pick a type that gpuq gpus --json lists (type), or drop --gpu-type",
        )
    need = spec.gpus // max(1, spec.node_count)
    fit = sorted(node for node, n in counts.items() if n >= need)
    if len(fit) < spec.node_count:
        most = ", ".join(f"{node} {n}" for node, n in sorted(counts.items()))
        where = "one server" if spec.node_count == 1 else f"each of {spec.node_count} servers"
        raise ResourceError(
            f"the job needs {need} GPU(s) of type {asked} on {where}; those GPUs are: {most}",
            "ask for fewer GPUs, or add another --gpu-type",
        )


def misplaced(node_of: Mapping[str, str], job: JobView, uuids: Iterable[str]) -> list[str]:
    """The nodes of `uuids` (`node_of`: each GPU's node) that `job` may not use, sorted."""
    if job.nodes is None:
        return []
    return sorted({node_of.get(uuid, "an unknown node") for uuid in uuids} - job.nodes)


def refusal(job: JobView, wrong: Iterable[str]) -> str:
    """Why a start the policy asked for on nodes `wrong` is not made (the job stays queued)."""
    return (
        f"the policy placed it on {', '.join(wrong)}, where it may not run "
        f"(it runs only on {node_names(job.nodes)})"
    )


@dataclass(slots=True)
class Constraints:
    """One pass's view of the constraints: the known nodes, and each constraint's nodes.

    `status` says, for a known node whose GPUs the snapshot lacks, what is
    known of it ("down: connection refused"), for waiting reasons.
    """

    known: KnownNodes
    seen: frozenset[str]
    status: Mapping[str, str] = field(default_factory=dict)
    dirs: Callable[[str, str], bool | None] | None = None
    """Whether directory `path` exists on node `node` (other servers only; None: not known yet)."""
    local: str = ""
    """This machine's node name: it has every job's working directory."""
    types: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Each seen node's GPU types (`gpuq.gputypes`), for `--gpu-type` (matched in any case)."""
    _cache: dict[tuple[object, ...], frozenset[str] | None] = field(default_factory=dict)

    def nodes_of(self, spec: JobSpec) -> frozenset[str] | None:
        """The nodes a job may run on now (None: any), cached per constraint and directory."""
        key = (spec.nodes, spec.exclude_nodes, spec.labels, spec.cwd)
        if key not in self._cache:
            nodes = eligible_nodes(spec, self.known)
            without = self._without_dir(spec.cwd, self.known if nodes is None else nodes)
            if without:
                nodes = frozenset(
                    n for n in (self.known if nodes is None else nodes) if n not in without
                )
            self._cache[key] = nodes
        return self._cache[key]

    def _without_dir(self, cwd: str, nodes: Iterable[str]) -> dict[str, bool | None]:
        """The nodes up where `cwd` is missing (False) or not known yet (None).

        A node that is not up is left to the reasons about nodes down.
        """
        if self.dirs is None:
            return {}
        found = {n: self.dirs(n, cwd) for n in nodes if n != self.local and n in self.seen}
        return {node: exists for node, exists in found.items() if exists is not True}

    def dir_note(self, spec: JobSpec) -> str | None:
        """Where the job's working directory keeps it from running, for a waiting reason."""
        named = eligible_nodes(spec, self.known)
        without = self._without_dir(spec.cwd, self.known if named is None else named)
        missing = sorted(node for node, exists in without.items() if exists is False)
        if not missing:
            return None
        return f"its working directory {spec.cwd} does not exist on {', '.join(missing)}"

    def waiting(self, spec: JobSpec) -> str | None:
        """Why a job may not reach the policy now (none of its nodes, or GPU types, is up)."""
        return self._node_waiting(spec) or self._type_waiting(spec)

    def _type_waiting(self, spec: JobSpec) -> str | None:
        """Why a `--gpu-type` job waits: no node of its that is up has a GPU of its types."""
        if not spec.gpu_types:
            return None
        nodes = self.nodes_of(spec)
        usable = sorted(n for n in self.seen if nodes is None or n in nodes)
        wanted = {name.lower() for name in spec.gpu_types}
        if any(wanted & {t.lower() for t in self.types.get(node, ())} for node in usable):
            return None
        up = ", ".join(f"{n} {'/'.join(sorted(self.types.get(n, ())))}" for n in usable) or "none"
        return f"waiting for a GPU of type {' or '.join(spec.gpu_types)} (GPU types up: {up})"

    def _node_waiting(self, spec: JobSpec) -> str | None:
        """Why a job may not reach the policy now (none of its nodes is up), or None."""
        nodes = self.nodes_of(spec)
        if nodes is None or nodes & self.seen:
            return None
        named = eligible_nodes(spec, self.known)
        without = self._without_dir(spec.cwd, self.known if named is None else named)
        if without and not nodes:
            missing = sorted(n for n, exists in without.items() if exists is False)
            if missing:
                return f"its working directory {spec.cwd} does not exist on {', '.join(missing)}"
            return f"checking its working directory on {', '.join(sorted(without))}"
        if not nodes:
            return f"no node meets its placement constraints now ({why_none(spec, self.known)})"
        down = [f"{name} ({self.status.get(name, 'no GPUs seen')})" for name in sorted(nodes)]
        if len(down) == 1:
            return f"waiting for node {down[0]}"
        return f"no eligible node is up: {', '.join(down)}"

    def cpu_waiting(self, spec: JobSpec, local: str) -> str | None:
        """Why a CPU-only job waits (its nodes exclude this machine), or None: it starts here.

        The daemon starts CPU-only jobs on its own machine only.
        """
        nodes = self.nodes_of(spec)
        if nodes is None or local in nodes:
            return None
        return f"runs only on {node_names(nodes)}; CPU-only jobs start on {local} only"

    def hold(self, jobs: Iterable[Job], local: str) -> tuple[list[Job], list[Job], dict[int, str]]:
        """Ready jobs split: CPU-only ones to start, GPU ones for the policy, and why others wait.

        `local` is this machine's node name, where CPU-only jobs start.
        """
        cpu: list[Job] = []
        gpu: list[Job] = []
        waiting: dict[int, str] = {}
        for job in jobs:
            if job.spec.gpus <= 0:
                why = self.cpu_waiting(job.spec, local)
            else:
                why = self.waiting(job.spec)
            if why is not None:
                waiting[job.id] = why
            else:
                (cpu if job.spec.gpus <= 0 else gpu).append(job)
        return cpu, gpu, waiting


__all__ = [
    "Constraints",
    "KnownNodes",
    "check_gpu_types",
    "check_submit",
    "eligible_nodes",
    "known_nodes",
    "labels_text",
    "misplaced",
    "refusal",
    "why_none",
]
