"""Capacity bookkeeping for placement policies: what each GPU still offers.

`Capacity` tracks, per GPU of a `ClusterState` (by its index in
`state.gpus`), the gpuq jobs holding it and the memory shares reserved on it.
It never changes the state; a policy builds one per decision, places jobs on
it and may `copy()` it to simulate jobs ending (backfill's shadow time).

The capacity rules (DESIGN.md section 6):

- A GPU held by a whole-GPU job (`gpu_mem` None) or an exclusive job is fully
  taken: nothing else goes there, whatever memory is left.
- A shared GPU offers `floor(memory_total * (1 - memory_margin))
  - memory_foreign - shares`; a share is placed only where it fits, so the
  GPUs are never over-committed.
- A whole GPU is free when no gpuq job holds it and its foreign memory is at
  most `foreign_tolerance`.
- An exclusive job with `gpu_mem` needs a GPU no gpuq job holds whose memory
  beside the foreign processes fits the request; it then takes the GPU alone.
- A multi-GPU job's GPUs come from one link group (a PCIe switch or NVLink)
  where one has room, else from as few as possible (`gpuq.policies.topology`).
- A job with a spread (`JobView.spread`: the daemon's jobs) gets its whole
  GPUs on exactly that many nodes, the same count on each: one node for a
  single-process job (a process cannot use another server's GPUs), N for a
  multi-node job (`--nodes N`), the fullest nodes that fit first.
- A job with a placement constraint (`JobView.nodes`) gets GPUs of its nodes
  only: the GPUs of other nodes (`Capacity.outside`) are left out of its
  choice, as a backfill reservation's are.

Every fit check goes through a `Summary` (sorted free amounts, cached until the
next change), so a job that cannot fit is rejected in constant time.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from gpuq.policies.interface import ClusterState, JobView
from gpuq.policies.topology import group_keys, pick_close

_GIB = 1024**3
_MIB = 1024**2


def format_size(size: int) -> str:
    """Render bytes for humans: `6.0G`, `512M`, `900B` (binary units)."""
    size = max(size, 0)
    if size >= _GIB:
        return f"{size / _GIB:.1f}G"
    if size >= _MIB:
        return f"{size / _MIB:.0f}M"
    return f"{size}B"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


@dataclass(frozen=True, slots=True)
class Hold:
    """The GPUs (indices into `state.gpus`) one gpuq job holds, and how it holds them."""

    job_id: int
    gpus: tuple[int, ...]
    gpu_mem: int | None = None
    exclusive: bool = False

    @property
    def takes_whole(self) -> bool:
        """True when the job has its GPUs to itself (whole-GPU or exclusive)."""
        return self.gpu_mem is None or self.exclusive


@dataclass(frozen=True, slots=True)
class Summary:
    """What a set of GPUs offers right now, sorted for constant-time fit checks.

    `shared_free` is the free memory of every GPU that accepts shares, and
    `empty_free` the memory beside foreign processes of every GPU no gpuq job
    holds; both are sorted in descending order.
    """

    whole_free: int
    foreign_blocked: int
    shared_free: tuple[int, ...]
    empty_free: tuple[int, ...]
    shared_suffix: str = field(init=False)
    empty_suffix: str = field(init=False)

    def __post_init__(self) -> None:
        # The text after the size in single-GPU reasons, shared by every job that waits.
        shared = format_size(self.shared_free[0]) if self.shared_free else "0B"
        empty = format_size(self.empty_free[0]) if self.empty_free else "0B"
        object.__setattr__(self, "shared_suffix", f" on a shared GPU (largest free {shared})")
        object.__setattr__(self, "empty_suffix", f" on an unshared GPU (largest free {empty})")

    def threshold(self, gpus: int, exclusive: bool) -> int:
        """The largest `gpu_mem` that fits on `gpus` GPUs now, or -1 if none does."""
        free = self.empty_free if exclusive else self.shared_free
        return free[gpus - 1] if 0 < gpus <= len(free) else -1

    def fits(self, gpus: int, gpu_mem: int | None, exclusive: bool) -> bool:
        """True when `gpus` GPUs can hold the request now."""
        if gpu_mem is None:
            return self.whole_free >= gpus
        return gpu_mem <= self.threshold(gpus, exclusive)

    def wait_reason(self, gpus: int, gpu_mem: int | None, exclusive: bool, where: str = "") -> str:
        """Say in a few words what a request that does not fit is waiting for.

        `where` names the nodes a constrained job may use (its summary counts only theirs).
        """
        on = f" on {where}" if where else ""
        if gpu_mem is None:
            blocked = f", {self.foreign_blocked} used by other processes"
            detail = f"{self.whole_free} free{blocked if self.foreign_blocked else ''}"
            return f"waiting for {_plural(gpus, 'free GPU')}{on} ({detail})"
        if gpus == 1:
            suffix = self.empty_suffix if exclusive else self.shared_suffix
            if where:
                suffix = suffix.replace(" GPU (", f" GPU of {where} (", 1)
            return "waiting for " + format_size(gpu_mem) + suffix
        free = self.empty_free if exclusive else self.shared_free
        kind = "unshared GPUs" if exclusive else "shared GPUs"
        having = sum(1 for amount in free if amount >= gpu_mem)
        return f"waiting for {format_size(gpu_mem)} on each of {gpus} {kind}{on} ({having} have it)"


_NOTHING: frozenset[int] = frozenset()


class Capacity:
    """Mutable per-GPU bookkeeping of gpuq jobs and memory shares."""

    __slots__ = (
        "_outside",
        "_summaries",
        "groups",
        "index",
        "nodes",
        "owners",
        "shares",
        "sharers",
        "usable",
        "whole_ok",
    )

    def __init__(
        self,
        index: dict[str, int],
        nodes: list[str],
        usable: list[int],
        whole_ok: list[bool],
        owners: list[int],
        sharers: list[int],
        shares: list[int],
        groups: list[Hashable] | None = None,
    ) -> None:
        self.index = index
        self.nodes = nodes
        self.usable = usable
        self.whole_ok = whole_ok
        self.owners = owners
        self.sharers = sharers
        self.shares = shares
        self.groups: list[Hashable] = groups if groups is not None else list(range(len(nodes)))
        """Each GPU's link-group key (`topology.group_key`); by default each GPU alone."""
        self._summaries: dict[frozenset[int], Summary] = {}
        self._outside: dict[frozenset[str], frozenset[int]] = {}

    @classmethod
    def from_state(cls, state: ClusterState) -> Capacity:
        """Capacity of the state's GPUs with its running jobs already held."""
        keep = 1.0 - state.memory_margin
        count = len(state.gpus)
        capacity = cls(
            index={gpu.uuid: i for i, gpu in enumerate(state.gpus)},
            nodes=[gpu.node for gpu in state.gpus],
            usable=[int(gpu.memory_total * keep) - gpu.memory_foreign for gpu in state.gpus],
            whole_ok=[gpu.memory_foreign <= state.foreign_tolerance for gpu in state.gpus],
            owners=[0] * count,
            sharers=[0] * count,
            shares=[0] * count,
            groups=group_keys(state),
        )
        for job in state.jobs:
            if job.gpu_uuids:
                capacity.hold(capacity.hold_of(job))
        return capacity

    def copy(self) -> Capacity:
        """An independent copy, for what-if simulation."""
        return Capacity(
            self.index,
            self.nodes,
            self.usable,
            self.whole_ok,
            self.owners.copy(),
            self.sharers.copy(),
            self.shares.copy(),
            self.groups,
        )

    def outside(self, job: JobView) -> frozenset[int]:
        """The GPUs (positions) on nodes `job` may not use: none for a job without a constraint."""
        if job.nodes is None:
            return _NOTHING
        cached = self._outside.get(job.nodes)
        if cached is None:
            cached = frozenset(i for i, node in enumerate(self.nodes) if node not in job.nodes)
            self._outside[job.nodes] = cached
        return cached

    def hold_of(self, job: JobView) -> Hold:
        """Translate a running job's GPU UUIDs to indices (unknown GPUs are dropped)."""
        gpus = tuple(self.index[uuid] for uuid in job.gpu_uuids if uuid in self.index)
        return Hold(job.id, gpus, job.gpu_mem, job.exclusive)

    def hold(self, hold: Hold) -> None:
        """Book a job's GPUs."""
        self._change(hold, 1)

    def release(self, hold: Hold) -> None:
        """Give back what `hold` booked."""
        self._change(hold, -1)

    def _change(self, hold: Hold, sign: int) -> None:
        self._summaries.clear()
        for i in hold.gpus:
            if hold.takes_whole:
                self.owners[i] += sign
            else:
                self.sharers[i] += sign
                self.shares[i] += sign * (hold.gpu_mem or 0)

    def summary(self, excluded: frozenset[int] = _NOTHING) -> Summary:
        """What the GPUs outside `excluded` offer now (cached until the next change)."""
        cached = self._summaries.get(excluded)
        if cached is not None:
            return cached
        whole_free = foreign_blocked = 0
        shared_free: list[int] = []
        empty_free: list[int] = []
        for i, usable in enumerate(self.usable):
            if i in excluded or self.owners[i]:
                continue
            shared_free.append(usable - self.shares[i])
            if self.sharers[i]:
                continue
            empty_free.append(usable)
            if self.whole_ok[i]:
                whole_free += 1
            else:
                foreign_blocked += 1
        shared_free.sort(reverse=True)
        empty_free.sort(reverse=True)
        summary = Summary(whole_free, foreign_blocked, tuple(shared_free), tuple(empty_free))
        self._summaries[excluded] = summary
        return summary

    def choose(
        self,
        gpus: int,
        gpu_mem: int | None,
        exclusive: bool,
        excluded: frozenset[int] = _NOTHING,
        spread: int | None = None,
    ) -> tuple[int, ...] | None:
        """Pick GPUs (indices, ascending) for a request, or None if it does not fit.

        Whole GPUs go to as few nodes as possible (the fullest node that still
        fits, then GPU order), or to exactly `spread` nodes, `gpus / spread`
        on each; shares go best-fit, to the GPUs with the least memory left
        that still fits, so large holes stay open for large jobs (ties in GPU
        order), on one node where `spread` is 1. Either way a multi-GPU job's
        GPUs come from as few link groups as possible (`topology.pick_close`).
        """
        if gpus <= 0 or not self.summary(excluded).fits(gpus, gpu_mem, exclusive):
            return None
        if gpu_mem is None:
            return self._choose_whole(gpus, excluded, spread)
        if spread is None or self._single_node():
            return self._choose_best_fit(gpus, gpu_mem, exclusive, excluded)
        for node in self._fullest_nodes():  # shares of one node (a multi-node job has none)
            others = frozenset(i for i, name in enumerate(self.nodes) if name != node)
            if self.summary(excluded | others).fits(gpus, gpu_mem, exclusive):
                return self._choose_best_fit(gpus, gpu_mem, exclusive, excluded | others)
        return None

    def _single_node(self) -> bool:
        """True when every GPU is on one node (a single server's daemon)."""
        return not self.nodes or self.nodes.count(self.nodes[0]) == len(self.nodes)

    def _fullest_nodes(self) -> list[str]:
        """Node names, those with the least free memory for shares first (best fit)."""
        free: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            free[node] = free.get(node, 0) + max(0, self.usable[i] - self.shares[i])
        return sorted(free, key=free.__getitem__)

    def free_whole(self, excluded: frozenset[int] = _NOTHING) -> dict[str, list[int]]:
        """Each node's free whole GPUs (indices, in GPU order), nodes in GPU order."""
        by_node: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            if i in excluded or self.owners[i] or self.sharers[i] or not self.whole_ok[i]:
                continue
            by_node.setdefault(node, []).append(i)
        return by_node

    def _choose_whole(
        self, gpus: int, excluded: frozenset[int], spread: int | None = None
    ) -> tuple[int, ...] | None:
        groups = list(self.free_whole(excluded).values())
        if spread is not None:
            per_node = gpus // spread
            if per_node * spread != gpus:
                return None
            fitting = sorted((group for group in groups if len(group) >= per_node), key=len)
            if len(fitting) < spread:
                return None
            picked: list[int] = []
            for group in fitting[:spread]:
                picked.extend(pick_close(group, self.groups.__getitem__, per_node))
            return tuple(sorted(picked))
        fitting = [group for group in groups if len(group) >= gpus]
        if fitting:
            return tuple(sorted(pick_close(min(fitting, key=len), self.groups.__getitem__, gpus)))
        chosen: list[int] = []
        for group in sorted(groups, key=len, reverse=True):
            chosen.extend(group[: gpus - len(chosen)])
            if len(chosen) == gpus:
                break
        return tuple(sorted(chosen))

    def _choose_best_fit(
        self, gpus: int, gpu_mem: int, exclusive: bool, excluded: frozenset[int]
    ) -> tuple[int, ...]:
        candidates: list[tuple[int, int]] = []
        for i, usable in enumerate(self.usable):
            if i in excluded or self.owners[i] or (exclusive and self.sharers[i]):
                continue
            free = usable - self.shares[i]
            if free >= gpu_mem:
                candidates.append((free, i))
        candidates.sort()
        order = [i for _, i in candidates]
        return tuple(sorted(pick_close(order, self.groups.__getitem__, gpus)))


class Hardware:
    """What the state's GPUs could hold with no jobs at all, for impossible requests.

    Only the hardware counts: foreign memory comes and goes, so it makes a job
    wait, never impossible. `on(nodes)` is the same for the GPUs of some
    nodes only (a job's placement constraint).
    """

    __slots__ = ("_gpus", "_keep", "_on", "count", "offers", "where")

    def __init__(self, state: ClusterState) -> None:
        self._keep = 1.0 - state.memory_margin
        self._gpus = [(gpu.node, gpu.memory_total) for gpu in state.gpus]
        self._on: dict[frozenset[str], Hardware] = {}
        self.count = len(state.gpus)
        self.offers = sorted((int(total * self._keep) for _, total in self._gpus), reverse=True)
        single = len({gpu.node for gpu in state.gpus}) <= 1
        self.where = "this server has" if single else "the cluster has"

    def on(self, nodes: frozenset[str] | None) -> Hardware:
        """The hardware of `nodes` only (None: all of it), for a job's placement constraint."""
        if nodes is None:
            return self
        cached = self._on.get(nodes)
        if cached is None:
            cached = Hardware.__new__(Hardware)
            cached._keep, cached._on = self._keep, {}
            cached._gpus = [(node, total) for node, total in self._gpus if node in nodes]
            cached.count = len(cached._gpus)
            cached.offers = sorted(
                (int(total * self._keep) for _, total in cached._gpus), reverse=True
            )
            names = sorted({node for node, _ in cached._gpus}) or sorted(nodes)
            cached.where = f"{', '.join(names)} {'has' if len(names) == 1 else 'have'}"
            self._on[nodes] = cached
        return cached

    def impossible_reason(
        self, gpus: int, gpu_mem: int | None, spread: int | None = None
    ) -> str | None:
        """Why a request can never fit even on idle GPUs, or None if it can."""
        if gpus <= 0:
            return None
        if gpus > self.count:
            return f"needs {_plural(gpus, 'GPU')}; {self.where} {self.count}"
        if spread is not None:
            per_node = max(1, gpus // spread)
            counts: dict[str, int] = {}
            for node, _ in self._gpus:
                counts[node] = counts.get(node, 0) + 1
            if sum(1 for count in counts.values() if count >= per_node) < spread:
                have = ", ".join(f"{name} {count}" for name, count in sorted(counts.items()))
                if spread == 1:
                    return f"needs {_plural(gpus, 'GPU')} on one server ({have})"
                return f"needs {_plural(per_node, 'GPU')} on each of {spread} servers ({have})"
        if gpu_mem is None or 0 <= gpu_mem <= self.offers[gpus - 1]:
            return None
        if gpu_mem < 0:
            return f"invalid request: gpu_mem is negative ({gpu_mem})"
        if gpus == 1:
            largest = format_size(self.offers[0])
            return f"needs {format_size(gpu_mem)} on a GPU; the largest offers {largest}"
        having = sum(1 for offer in self.offers if offer >= gpu_mem)
        return f"needs {format_size(gpu_mem)} on each of {gpus} GPUs; {having} offer that"
