"""The `gpuq` policy's packing step: a job that would take turns shares a GPU while it pays.

Gandiva's packing with introspection, by the rules `gandiva` shares
(`gpuq.policies.packing`: measured rates, candidates, pairs, keep or undo).
It runs per priority class after the goodput allocation and before
time-slicing (`gpuq.policies.gpuq.classes`), so a pack is tried before a
waiting job is time-sliced, and instead of it:

- **Review** each pack of the class (a *rider* on its *host*'s GPU, as the
  caller reports them: `JobView.packed_with`; `riders`). It ends when its
  host leaves its GPU in this decision (preempted, resized, moved) or when
  a whole GPU is free on the node (the rider takes its turns there, or its
  own GPU at the next decision); else the members' packed rates decide: a trial
  until both are measured, kept while their sum beats time-slicing, undone
  the first time it does not ("packed throughput 0.71 of time-sliced
  (0.36+0.35 of solo), undone on n1"), and the pair is never packed again.
  An unpacked rider goes back to its class's waiting jobs to take turns
  (the caller takes one member off the GPU); it is never packed again, or
  given GPUs elsewhere, in the decision that unpacks it.
- **Pack** each waiting job of the class that would otherwise wait for GPUs
  behind its own class (the time-slicing step's candidates), in queue
  order, with a host of its class: a running (or parked) 1-GPU job that
  holds a whole GPU, keeps exactly that GPU in this decision and is in no
  pack. Both must be runner jobs measured alone (a solo rate from their
  step times) with known utilization and memory peak, their memory peaks
  must fit together in the host GPU's memory (margin and other users'
  memory taken off), their utilizations add up to at most
  `max_utilization`, and the pair must not have failed before. The host
  is the one the guest already sits on, else the least utilized, then in
  GPU order: "trial on n1 (utilization 30% + 30%)".

Why gpuq packs, and when: a job waiting behind its own class otherwise gets
its GPU only in turns, half the time; two light jobs (a small model, a
data-bound loop) packed on one GPU can each run at more than half speed,
and measuring both jobs packed tells within a sample or two whether they
do. Only whole-GPU jobs of one GPU that wait: a memory-share job is
already packed by its memory (admission), a multi-GPU job is never packed,
and a job that fits somewhere is not packed but placed.

It remembers (saved with the policy's memory) each job's solo rate, the
packs under watch with their rates, and the pairs that failed. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuq.policies.gpuq.board import Board
from gpuq.policies.interface import ClusterState, JobView
from gpuq.policies.packing import Pack, Profile, Rates, judge, pair_fits, profile, trial_note


@dataclass(slots=True)
class Packed:
    """What the packing step decided for one class.

    `packs`: rider -> host, riding on in this decision; `notes`: the reason
    of each member whose pack began, was reviewed or ended; `unpacked`:
    riders back among the class's waiting jobs (to take turns).
    """

    packs: dict[int, int] = field(default_factory=dict)
    notes: dict[int, str] = field(default_factory=dict)
    unpacked: list[JobView] = field(default_factory=list)


class Packer:
    """The packing step and what it remembers (module docstring)."""

    def __init__(self, keep_threshold: float = 1.0, max_utilization: float = 100.0) -> None:
        self.keep_threshold = keep_threshold
        self.max_utilization = max_utilization
        self.rates = Rates()
        self.packs: dict[int, Pack] = {}
        """The packs under watch, by rider."""
        self.failed: set[frozenset[int]] = set()
        """Pairs packed slower than time-slicing, or of which one ran out of memory packed."""

    def observe(self, state: ClusterState, now: float) -> None:
        """Take in what the caller measured, and forget jobs that left."""
        self.rates.observe(state, now)
        present = {job.id for job in state.jobs}
        for job in state.jobs:
            self.failed.update(frozenset((job.id, other)) for other in job.oom_partners)
        self.failed = {pair for pair in self.failed if pair <= present}
        self.packs = {
            rider: pack
            for rider, pack in self.packs.items()
            if rider in present and pack.host in present
        }

    def riders(self, state: ClusterState) -> dict[int, int]:
        """Each packed pair of the state as rider -> host: the host holds the GPU on the board.

        A member holding no GPU (on its way to its partner's) rides; of two
        on one GPU, the rider is the one this policy packed as such, else
        the younger (submit time, then id).
        """
        jobs = {job.id: job for job in state.jobs}
        found: dict[int, int] = {}
        for job in state.jobs:
            if len(job.packed_with) != 1:
                continue
            other = jobs.get(job.packed_with[0])
            if other is None or other.packed_with != (job.id,) or job.id > other.id:
                continue
            holders = [member for member in (job, other) if member.gpu_uuids]
            if len(holders) == 1:
                host = holders[0]
            elif not holders:
                continue
            else:
                known = self.packs.get(job.id) or self.packs.get(other.id)
                hosts = [m for m in (job, other) if known is not None and m.id == known.host]
                host = hosts[0] if hosts else min(job, other, key=lambda m: (m.submit_time, m.id))
            rider = other if host is job else job
            found[rider.id] = host.id
        return found

    def step(
        self,
        board: Board,
        priority: int,
        waiting: list[JobView],
        stays: Callable[[int], bool],
        now: float,
    ) -> Packed:
        """Review the class's packs, then pack its `waiting` jobs where it pays (docstring).

        `waiting` are the class's whole-GPU jobs that would wait behind it,
        in queue order; `stays(job_id)` says whether a job keeps exactly the
        GPUs it holds on the board in this decision.
        """
        result = Packed()
        ended: set[int] = set()
        for rider, host in sorted(board.riders.items()):
            if board.jobs[rider].priority != priority:
                continue
            ended.add(rider)
            if self._review(board, rider, host, stays, now, result):
                ended.discard(rider)
        taken = set(result.packs) | set(result.packs.values())
        hosts = self._hosts(board, priority, stays, taken)
        for job in waiting:
            guest = self._candidate(job)
            if guest is None or job.id in ended or job.id in taken:
                continue
            options = [
                (host, gpu, host_profile)
                for host, (gpu, host_profile) in hosts.items()
                if host not in taken
                and job.may_run_on(_node(board, gpu))
                and frozenset((job.id, host)) not in self.failed
                and pair_fits(guest, host_profile, board.capacity.usable[gpu], self.max_utilization)
            ]
            if not options:
                continue
            sits = set(board.given[job.id].gpu_uuids)
            host, gpu, host_profile = min(
                options,
                key=lambda o: (board.uuids((o[1],))[0] not in sits, o[2].utilization, o[1], o[0]),
            )
            taken.update((job.id, host))
            result.packs[job.id] = host
            self.packs[job.id] = Pack(host, now)
            note = trial_note(_node(board, gpu), guest, host_profile)
            result.notes[job.id] = result.notes[host] = note
        return result

    def _review(
        self,
        board: Board,
        rider: int,
        host: int,
        stays: Callable[[int], bool],
        now: float,
        result: Packed,
    ) -> bool:
        """Review one pack of the class; True if the rider rides on."""
        pack = self.packs.get(rider)
        if pack is None or pack.host != host:  # packed before this policy remembered it
            pack = self.packs[rider] = Pack(host, now)
        hold = board.holds.get(host)
        if hold is None or not stays(host):
            del self.packs[rider]
            result.notes[rider] = f"job {host} leaves its GPU"
            result.unpacked.append(board.jobs[rider])
            return False
        where = _node(board, hold.gpus[0])
        if board.open_per_node()[board.node_of[hold.gpus[0]]] > 0:
            del self.packs[rider]
            result.notes[rider] = result.notes[host] = f"a GPU of its own is free on {where}"
            result.unpacked.append(board.jobs[rider])
            return False
        verdict = judge(pack, rider, self.rates.packed, self.keep_threshold, where)
        result.notes[rider] = result.notes[host] = verdict.note
        if verdict.undo:
            del self.packs[rider]
            self.failed.add(frozenset((rider, host)))
            result.unpacked.append(board.jobs[rider])
            return False
        result.packs[rider] = host
        return True

    def _candidate(self, job: JobView) -> Profile | None:
        """A waiting job's profile if it may be packed: one whole GPU, rigid, measured."""
        if job.gpu_mem is not None or job.adaptive or job.max_gpus > 1 or job.min_gpus > 1:
            return None
        return profile(job, self.rates.solo.get(job.id))

    def _hosts(
        self, board: Board, priority: int, stays: Callable[[int], bool], taken: set[int]
    ) -> dict[int, tuple[int, Profile]]:
        """The class's jobs a waiting job may join: their GPU and profile (module docstring)."""
        hosts: dict[int, tuple[int, Profile]] = {}
        for job_id, hold in board.holds.items():
            job = board.jobs[job_id]
            if job.priority != priority or job_id in taken or hold.gpu_mem is not None:
                continue
            if len(hold.gpus) != 1 or not stays(job_id) or job.packed_with:
                continue
            if board.uuids(hold.gpus) != board.given[job_id].gpu_uuids:
                continue  # the board placed it elsewhere than it is
            found = self._candidate(job)
            if found is not None:
                hosts[job_id] = (hold.gpus[0], found)
        return hosts

    def save(self) -> dict[str, Any]:
        """What it remembers, JSON-ready."""
        return {
            "rates": self.rates.save(),
            "packs": {str(rider): pack.save() for rider, pack in sorted(self.packs.items())},
            "failed": sorted(sorted(pair) for pair in self.failed),
        }

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up what `save` returned (KeyError, TypeError or ValueError if it cannot)."""
        rates = Rates()
        rates.restore(saved["rates"])
        packs = {int(rider): Pack.load(pack) for rider, pack in saved["packs"].items()}
        failed = {frozenset(int(j) for j in pair) for pair in saved["failed"]}
        self.rates, self.packs, self.failed = rates, packs, failed


def _node(board: Board, gpu: int) -> str:
    """The name of GPU `gpu`'s node, for reasons."""
    return board.state.nodes[board.node_of[gpu]].name


__all__ = ["Packed", "Packer"]
