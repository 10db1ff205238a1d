"""Sia's selection: a binary ILP over (job, configuration) pairs, solved by HiGHS.

The problem (Sia 3.3, Eq. 1; the artifact's `__solve_mip_rescaled`), with
one binary x per pair a job may take and v its value (G after the restart
factor, `gpuq.policies.sia.matrix`):

    p < 0:  minimize  sum x v^p + lambda_n (jobs - sum x)
    p > 0:  maximize  sum x v^p - lambda_n (jobs - sum x)
    subject to  sum of a job's x <= 1, and per resource row  usage @ x <= capacity

The lambda_n term is a constant plus lambda_n per chosen pair, so it is
folded into the coefficients: minimize sum x c with c = v^p - lambda_n
(p < 0) or c = -(v^p + lambda_n) (p > 0). A pair with c >= 0 can never
improve an optimum and gets no variable: with p < 0 and lambda_n = 1.1,
any value below 1.1^(1/p) ~ 0.83 (an unplaced job costs less). p = 0 is
not allowed (the artifact asserts it). Unlike the artifact, G^p is neither
rounded to 2 decimals nor clipped at 3000: pairs the artifact clips are
pairs without a variable here. With job weights w (gpuq's service rule),
each job's terms are multiplied by its w: c = w (v^p - lambda_n), the
same sign, so the same pairs get variables.

Solver: `scipy.optimize.milp` (HiGHS). Its LP relaxation is solved first:
a multiple-choice problem with few shared rows, it is usually integral at
an optimum, which then solves the ILP exactly. Otherwise the ILP is solved
with a relative gap of 1e-4 (the artifact's CBC used 0.01%) and a time
limit; on the limit, the best solution found so far is used, else the
caller's fallback (each job kept in its current configuration) when it
satisfies the rows, else nothing. The LP is solved without HiGHS's
presolve, which costs more than it saves there; the ILP keeps it.

HiGHS (as scipy 1.17 ships it) sometimes writes a debugging line
("HighsMipSolverData::transformNewIntegerFeasibleSolution ...") straight to
file descriptor 1 while solving an ILP, where `gpuq sim --json` prints its
results; `quiet_stdout` points that descriptor at /dev/null for the ILP
only, under a lock (gpuq writes nothing to stdout from another thread
while a policy decides).
"""

from __future__ import annotations

import math
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array, csr_array, vstack

MIP_GAP = 1e-4
"""Relative optimality gap at which HiGHS stops."""

INTEGRAL = 1e-9
"""How close to 0 or 1 every value of an LP optimum must be to count as integral."""

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Selection:
    """Which pairs were chosen, and how the solver ended."""

    chosen: BoolArray
    optimal: bool
    message: str


def costs(values: FloatArray, p: float, lambda_n: float) -> FloatArray:
    """Each pair's coefficient in the minimized objective (module docstring)."""
    if p == 0 or not math.isfinite(p):
        raise ValueError(f"p must be finite and non-zero, got {p}")
    powered = np.power(values, p)
    return powered - lambda_n if p < 0 else -(powered + lambda_n)


def select(
    jobs: IntArray,
    values: FloatArray,
    usage: csr_array,
    capacity: FloatArray,
    p: float,
    lambda_n: float,
    time_limit: float,
    fallback: BoolArray | None = None,
    weights: FloatArray | None = None,
) -> Selection:
    """Choose at most one pair per job, within `usage @ x <= capacity` (module docstring).

    `jobs[k]` is pair k's job (any integers), `values[k] > 0` its value, and
    `usage` has one row per resource (GPUs of a pool, say) and one column per pair.
    `weights[k] > 0`, where given, scales pair k's coefficient: its job's
    weight in the objective (gpuq's service rule, `gpuq.policies.sia.policy`).
    """
    count = len(values)
    chosen = np.zeros(count, dtype=bool)
    if count == 0:
        return Selection(chosen, True, "no pairs")
    positive = values > 0
    c = np.zeros(count)
    c[positive] = costs(values[positive], p, lambda_n)
    if weights is not None:
        c *= weights
    useful = np.flatnonzero(positive & (c < 0))
    if useful.size == 0:
        return Selection(chosen, True, "no pair improves on leaving every job waiting")
    owners = np.unique(jobs[useful], return_inverse=True)[1].ravel()
    per_job = np.bincount(owners)
    shared = per_job[owners] > 1  # a job with one pair needs no row: its bound is 1
    rows = np.unique(owners[shared], return_inverse=True)[1].ravel()
    one_each = coo_array(
        (np.ones(int(shared.sum())), (rows, np.flatnonzero(shared))),
        shape=(int(rows.max(initial=-1)) + 1, useful.size),
    )
    matrix = vstack([one_each, csr_array(usage)[:, useful]], format="csr")
    upper = np.concatenate([np.ones(one_each.shape[0]), np.asarray(capacity, dtype=float)])
    constraints = LinearConstraint(matrix, -np.inf, upper)
    # The LP relaxation first: where its optimum is integral (usual), it is the ILP's.
    relaxed = milp(
        c[useful],
        bounds=Bounds(0, 1),
        constraints=constraints,
        options={"disp": False, "presolve": False, "time_limit": time_limit},
    )
    if relaxed.x is not None and relaxed.status == 0:
        x = np.asarray(relaxed.x)
        if np.all((x < INTEGRAL) | (x > 1 - INTEGRAL)):
            chosen[useful] = x > 0.5
            return Selection(chosen, True, "the LP relaxation is integral")
    with quiet_stdout():
        result = milp(
            c[useful],
            integrality=np.ones(useful.size),
            bounds=Bounds(0, 1),
            constraints=constraints,
            options={"disp": False, "mip_rel_gap": MIP_GAP, "time_limit": time_limit},
        )
    if result.x is not None:
        chosen[useful] = np.asarray(result.x) > 0.5
        return Selection(chosen, bool(result.status == 0), str(result.message))
    if fallback is not None and _feasible(jobs, fallback, usage, capacity):
        return Selection(fallback.copy(), False, f"{result.message}; kept current configurations")
    return Selection(chosen, False, str(result.message))


_QUIET = threading.Lock()


@contextmanager
def quiet_stdout() -> Iterator[None]:
    """File descriptor 1 goes to /dev/null inside (the module docstring says why)."""
    with _QUIET:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, 1)
            finally:
                os.close(null)
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _feasible(jobs: IntArray, pick: BoolArray, usage: csr_array, capacity: FloatArray) -> bool:
    """True if `pick` takes at most one pair per job and fits every row."""
    if np.unique(jobs[pick]).size != int(pick.sum()):
        return False
    used = csr_array(usage) @ pick.astype(float)
    return bool(np.all(used <= np.asarray(capacity, dtype=float) + 1e-9))


__all__ = ["MIP_GAP", "Selection", "costs", "select"]
