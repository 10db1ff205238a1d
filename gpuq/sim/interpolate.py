"""Piecewise-linear interpolation of the measured step-time tables.

`Curve` interpolates over the per-GPU batch size at one measured placement;
`Triangulation` over `(num_nodes, num_replicas, local_bsz)` for placements
that were not measured. `gpuq.sim.apps` documents when each is used and
what happens outside the measured range. scipy is imported only when a
triangulation is built, so a job whose placements were all measured (a
trace job on one node, such as up to 4 T4s or 8 A100s) starts without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Curve:
    """Step and sync time over the per-GPU batch size at one placement or group."""

    local_bsz: FloatArray
    step_time: FloatArray
    sync_time: FloatArray

    def at(self, local_bsz: float) -> tuple[float, float]:
        """`(step_time, sync_time)` at `local_bsz`, extrapolated as `gpuq.sim.apps` says."""
        xs = self.local_bsz
        if xs[0] <= local_bsz <= xs[-1]:
            step = float(np.interp(local_bsz, xs, self.step_time))
            sync = float(np.interp(local_bsz, xs, self.sync_time))
            return step, min(sync, step)
        end = 0 if local_bsz < xs[0] else -1
        sync = float(min(self.sync_time[end], self.step_time[end]))
        compute = float(self.step_time[end]) - sync
        if end == -1:
            compute *= local_bsz / float(xs[-1])
        return compute + sync, sync


class Triangulation:
    """Piecewise-linear interpolation on the Delaunay triangulation of 3-D points.

    The same interpolant as scipy's `LinearNDInterpolator`, evaluated directly:
    scipy's per-simplex LAPACK transforms take seconds on a busy machine with
    a threaded BLAS. Flat simplices are dropped; where qhull's triangulation
    of these grid-like points is not conforming, a point on a face shared by
    several simplices gets the average of their values. Points that span
    no volume (all on one node, as in a one-node table) have no simplex:
    every point is then outside.
    """

    def __init__(self, points: FloatArray, values: FloatArray) -> None:
        if np.linalg.matrix_rank(points[1:] - points[0]) < points.shape[1]:
            simplices = np.zeros((0, points.shape[1] + 1), dtype=np.intp)
        else:
            from scipy.spatial import Delaunay  # here: importing the simulator stays light

            simplices = Delaunay(points).simplices
        corners = points[simplices]
        origin = corners[:, 3, :]
        e1, e2, e3 = (corners[:, i, :] - origin for i in range(3))
        rows = np.stack([np.cross(e2, e3), np.cross(e3, e1), np.cross(e1, e2)], axis=1)
        det = np.einsum("ij,ij->i", e1, rows[:, 0, :])
        size = np.abs(np.stack([e1, e2, e3])).max(axis=(0, 2))
        solid = np.abs(det) > 1e-9 * size**3
        self._inverse = rows[solid] / det[solid, None, None]
        self._origin = origin[solid]
        self._values = values[simplices[solid]]

    def at(self, point: tuple[float, float, float]) -> tuple[float, float] | None:
        """Interpolated values at `point`, or None outside the convex hull."""
        offset = np.asarray(point, dtype=np.float64) - self._origin
        weights = np.einsum("sij,sj->si", self._inverse, offset)
        weights = np.concatenate([weights, 1.0 - weights.sum(axis=1, keepdims=True)], axis=1)
        inside = np.flatnonzero((weights >= -1e-9).all(axis=1))
        if inside.size == 0:
            return None
        values = np.einsum("si,sij->sj", weights[inside], self._values[inside]).mean(axis=0)
        return float(values[0]), float(values[1])
