"""gpuq's default policy, `gpuq`: Pollux's goodput allocation, with fewer restarts.

What it takes from the papers:

- Pollux: the objective. Every decision maximizes the power mean (p = -1) of
  each active job's goodput speedup over allocation matrices, jobs adapt
  their batch size to what they get, and a job whose allocation changes is
  charged the restart penalty (`gpuq.policies.pollux`, reused, not copied).
- AFS and Tiresias: change a running job only when it pays. AFS reallocates
  only at events and Tiresias keeps running jobs where they are; both restart
  far less than Pollux, whose genetic search moves a job whenever the fitness
  rises at all, however little. Each restart costs the job 30 s of progress
  that the fitness accounts for only through the penalty factor of its age.

The rule gpuq adds (the "stability filter"): after the search, every running
job whose allocation the search changed is offered back its current
allocation, one at a time, best first; a revert is kept when the allocation
stays feasible (capacity, one multi-node job per node, caps) and the fitness
stays within `tolerance` (default 0.5%) of the search's best. Starting a
pending job is never reverted (that would only leave GPUs idle), and a
revert that collides with another job's new GPUs is infeasible, so it is
skipped. With `tolerance = 0` the policy makes exactly Pollux's decisions.

Everything else (fair share, exploration cap, search, determinism per seed
and sequence of states) is Pollux's, documented in `gpuq.policies.pollux`.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from gpuq.policies.elastic import ClusterState, Decision
from gpuq.policies.pollux import PolluxPolicy
from gpuq.policies.pollux_search import Allocations, SearchProblem, evaluate, feasible


class GpuqPolicy(PolluxPolicy):
    """Pollux's goodput-driven allocation with a stability filter (see module)."""

    name = "gpuq"

    def __init__(self, seed: int = 0, tolerance: float = 0.005) -> None:
        super().__init__(seed=seed)
        if not 0.0 <= tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        self.tolerance = tolerance

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Pollux's decision, with changes to running jobs undone where they do not pay."""
        decision = super().decide(state, now)
        if self.tolerance == 0.0 or not decision.allocations:
            return decision
        jobs, problem = self.problem(state, now)
        best = np.zeros_like(problem.base)
        for row, job in enumerate(jobs):
            allocation = decision.allocations.get(job.id)
            if allocation:
                best[:, row] = allocation
        target = float(evaluate(problem, best[None])[0][0]) * (1.0 - self.tolerance)
        running = problem.base.sum(axis=0) > 0
        changed = (best != problem.base).any(axis=0) & running
        reverted: list[int] = []
        for row in self._by_fitness(problem, best, np.flatnonzero(changed)):
            trial = best.copy()
            trial[:, row] = problem.base[:, row]
            if not feasible(problem, trial[None])[0]:
                continue  # an earlier revert took the GPUs back
            if float(evaluate(problem, trial[None])[0][0]) >= target:
                best = trial
                reverted.append(row)
        if not reverted:
            return decision
        allocations = dict(decision.allocations)
        notes = dict(decision.notes)
        for row in reverted:
            job = jobs[row]
            allocations[job.id] = tuple(int(c) for c in problem.base[:, row])
            notes[job.id] = (
                f"kept its {int(problem.base[:, row].sum())} GPUs (a move would not pay)"
            )
        return Decision(allocations=allocations, notes=notes)

    @staticmethod
    def _by_fitness(problem: SearchProblem, best: Allocations, rows: NDArray[np.intp]) -> list[int]:
        """Candidate reverts, the ones that cost the least fitness first."""
        if rows.size == 0:
            return []
        trials = np.repeat(best[None], rows.size, axis=0)
        for i, row in enumerate(rows):
            trials[i, :, row] = problem.base[:, row]
        # A current allocation may break today's caps (a cap can shrink): such a
        # revert is infeasible, and its speedup is not even tabulated.
        ok = feasible(problem, trials)
        if not ok.any():
            return []
        rows, trials = rows[ok], trials[ok]
        fitness = evaluate(problem, trials)[0]
        order = np.argsort(-fitness, kind="stable")
        return [int(rows[i]) for i in order]
