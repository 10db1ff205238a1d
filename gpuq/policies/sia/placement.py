"""Sia's placer: each chosen configuration becomes GPUs on nodes (Sia 3.1, 3.2).

Pool by pool (`gpuq.policies.sia.configs`), rules tested in
`tests/test_policy_sia.py`:

1. A job whose configuration is unchanged keeps its exact GPUs.
2. Multi-node configurations, most GPUs first, take `per_node` GPUs on each
   of `nodes` nodes (whole nodes for Sia's own set): the job's current nodes
   first, then the fullest that fit, then the last (as the artifact takes
   whole nodes from the end and single-node jobs from the start).
3. Single-node configurations, most GPUs first, go best-fit: the job's
   current node if it fits, else the fullest node with room, else the first.
A job constrained to some nodes (`JobView.nodes`) uses only those, and goes
before unconstrained jobs of its size.

Fragmentation: the ILP counts GPUs per pool (and whole nodes), so a job
can find no node with room. It may then evict single-node jobs, as Sia's
placer does: the fewest jobs (then GPUs) on one node that make room, for a
multi-node job any single-node job, for a single-node one only smaller
jobs, smallest first. Evicted jobs keep their configuration and are placed
again, so a job that stays the same size may move (usually fewer than
three per round, as the paper reports). A job that still finds no room keeps
its current GPUs if they are free (it is running), else waits; its note
says so. Nothing is ever placed over a node's capacity or across pools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuq.policies.interface import JobView
from gpuq.policies.sia.configs import Config, Pool


@dataclass(frozen=True, slots=True)
class Placement:
    """GPUs per node for each placed job, the jobs moved by eviction, and failures."""

    allocations: dict[int, tuple[int, ...]]
    moved: frozenset[int]
    failed: dict[int, str] = field(default_factory=dict)


def place(
    pools: Sequence[Pool],
    names: Sequence[str],
    free: Sequence[int],
    chosen: Mapping[int, Config],
    jobs: Mapping[int, JobView],
    current: Mapping[int, Config | None],
) -> Placement:
    """Place every chosen configuration on GPUs left `free` (module docstring)."""
    placer = _Placer(pools, names, free, jobs, chosen)
    for index, pool in enumerate(pools):
        mine = sorted(job_id for job_id, config in chosen.items() if config.pool == index)
        placer.place_pool(pool, [(job_id, chosen[job_id]) for job_id in mine], current)
    return placer.result()


class _Placer:
    """The free GPUs of each node and the jobs placed so far, while placing."""

    def __init__(
        self,
        pools: Sequence[Pool],
        names: Sequence[str],
        free: Sequence[int],
        jobs: Mapping[int, JobView],
        chosen: Mapping[int, Config],
    ) -> None:
        self.pools = pools
        self.chosen = chosen
        self.names = names
        self.free = list(free)
        self.jobs = jobs
        self.held: dict[int, dict[int, int]] = {}
        self.singles: list[dict[int, int]] = [{} for _ in free]
        """Per node: the single-node jobs on it (evictable), with their GPUs."""
        self.kept: set[int] = set()
        self.moved: set[int] = set()
        self.failed: dict[int, str] = {}
        self.evictions = 0
        self.max_evictions = 4 * len(jobs) + 16

    def place_pool(
        self, pool: Pool, chosen: list[tuple[int, Config]], current: Mapping[int, Config | None]
    ) -> None:
        """Rules 1-3 for one pool."""
        multi: list[tuple[int, Config]] = []
        queue: list[tuple[int, Config]] = []
        for job_id, config in chosen:
            if config == current.get(job_id) and self._keep(job_id, config):
                continue
            (multi if config.nodes > 1 else queue).append((job_id, config))
        for job_id, config in sorted(multi, key=self._order):
            self._place_multi(pool, job_id, config, queue)
        while queue:
            queue.sort(key=self._order)
            job_id, config = queue.pop(0)
            self._place_single(pool, job_id, config, queue)

    def result(self) -> Placement:
        """The placement, after failed running jobs fall back on their current GPUs."""
        for job_id in sorted(self.failed):
            allocation = self.jobs[job_id].allocation
            if any(allocation) and all(
                count <= self.free[i] for i, count in enumerate(allocation) if count
            ):
                self._take(job_id, {i: c for i, c in enumerate(allocation) if c}, single=False)
                self.failed[job_id] += "; keeps its current GPUs"
        width = len(self.free)
        allocations = {}
        for job_id, nodes in self.held.items():
            row = [0] * width
            for node, count in nodes.items():
                row[node] = count
            allocations[job_id] = tuple(row)
        return Placement(allocations, frozenset(self.moved & set(self.held)), dict(self.failed))

    def _order(self, item: tuple[int, Config]) -> tuple[int, int, int]:
        job_id, config = item
        nodes = self.jobs[job_id].nodes
        return (-config.gpus, len(nodes) if nodes is not None else 1 << 30, job_id)

    def _allowed(self, pool: Pool, job_id: int) -> list[int]:
        job = self.jobs[job_id]
        return [node for node in pool.nodes if job.may_run_on(self.names[node])]

    def _holds(self, job_id: int, node: int) -> bool:
        allocation = self.jobs[job_id].allocation
        return node < len(allocation) and allocation[node] > 0

    def _keep(self, job_id: int, config: Config) -> bool:
        """Rule 1: keep the job's exact GPUs, if they are still free."""
        allocation = self.jobs[job_id].allocation
        if any(count > self.free[i] for i, count in enumerate(allocation) if count):
            return False
        self._take(job_id, {i: c for i, c in enumerate(allocation) if c}, config.nodes == 1)
        self.kept.add(job_id)
        return True

    def _take(self, job_id: int, nodes: dict[int, int], single: bool) -> None:
        for node, count in nodes.items():
            self.free[node] -= count
            if single:
                self.singles[node][job_id] = count
        self.held[job_id] = nodes

    def _evict(self, node: int, victims: list[int], queue: list[tuple[int, Config]]) -> None:
        for victim in victims:
            count = self.singles[node].pop(victim)
            self.free[node] += count
            del self.held[victim]
            if victim in self.kept:
                self.kept.discard(victim)
                self.moved.add(victim)
            queue.append((victim, self.chosen[victim]))
            self.evictions += 1

    def _room_by_eviction(
        self, node: int, needed: int, smaller_than: int | None
    ) -> tuple[int, int, list[int]] | None:
        """The fewest single-node jobs on `node` whose eviction leaves `needed` free."""
        if self.free[node] >= needed:
            return (0, 0, [])
        victims = sorted(
            (count, job_id)
            for job_id, count in self.singles[node].items()
            if smaller_than is None or count < smaller_than
        )
        room, taken = self.free[node], []
        for count, job_id in victims:
            if room >= needed:
                break
            room += count
            taken.append(job_id)
        if room < needed:
            return None
        return (len(taken), room - self.free[node], taken)

    def _place_multi(
        self, pool: Pool, job_id: int, config: Config, queue: list[tuple[int, Config]]
    ) -> None:
        per_node = config.per_node
        allowed = self._allowed(pool, job_id)
        ready = [node for node in allowed if self.free[node] >= per_node]
        short = config.nodes - len(ready)
        if short > 0:
            options = []
            for node in allowed:
                if self.free[node] < per_node:
                    found = self._room_by_eviction(node, per_node, None)
                    if found is not None:
                        options.append((found[0], found[1], node, found[2]))
            if len(options) < short or self.evictions >= self.max_evictions:
                self.failed[job_id] = "its nodes are held by other jobs (fragmented)"
                return
            for _, _, node, victims in sorted(options)[:short]:
                self._evict(node, victims, queue)
                ready.append(node)
        ready.sort(key=lambda node: (not self._holds(job_id, node), self.free[node], -node))
        self._take(job_id, {node: per_node for node in ready[: config.nodes]}, single=False)

    def _place_single(
        self, pool: Pool, job_id: int, config: Config, queue: list[tuple[int, Config]]
    ) -> None:
        gpus = config.gpus
        allowed = self._allowed(pool, job_id)
        fits = [node for node in allowed if self.free[node] >= gpus]
        if not fits:
            options = []
            for node in allowed:
                found = self._room_by_eviction(node, gpus, gpus)
                if found is not None:
                    options.append((found[0], found[1], node, found[2]))
            if not options or self.evictions >= self.max_evictions:
                self.failed[job_id] = "no node of its type has room (fragmented)"
                return
            _, _, node, victims = min(options)
            self._evict(node, victims, queue)
            fits = [node]
        best = min(fits, key=lambda node: (not self._holds(job_id, node), self.free[node], node))
        self._take(job_id, {best: gpus}, single=True)


__all__ = ["Placement", "place"]
