"""Pollux's goodput model: throughput x statistical efficiency, pure numpy.

Shared by the runner (which picks its batch size), the policies (which turn it
into speedups) and the simulator. The equations follow Pollux (OSDI'21, §3-4)
as implemented in its artifact (adaptdl, `goodput.py`):

    T_grad(m)       = alpha_c + beta_c * m                         compute, per micro-batch
    T_sync(N, K)    = 0                                 if K == 1
                    = alpha_r + beta_r * max(K - 2, 1e-8)   if N == 1   (one node)
                    = alpha_n + beta_n * max(K - 2, 1e-8)   if N > 1    (across nodes)
    T_iter(m, s)    = s * T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma)
    THROUGHPUT      = M / T_iter,   M = K * m * (s + 1)
    EFFICIENCY(M)   = (var + sqr) / (var / S + sqr) / S,   S = M / M0
                    = (phi + M0) / (phi + M),   phi = M0 * var / sqr (the PGNS)
    GOODPUT         = THROUGHPUT * EFFICIENCY

with N nodes, K replicas (GPUs), m the per-GPU batch, s accumulation steps.

Choices the paper leaves open (the rules are tested in `tests/test_goodput.py`):

- `T_sync` is exactly 0 on one GPU (the artifact uses 1e-8); the `max(K - 2,
  1e-8)` guard on the retrogression term is the artifact's.
- If both gradient statistics are 0 the AdaScale gain is 1 (no gain from a
  larger batch), as in the artifact; `GradParams(0, 1)` is the optimistic
  prior of a job with no statistics yet (efficiency 1 at every batch size).
- `optimize` samples 50 total batch sizes geometrically in
  `[max(M0, min_local * K), M_max]`, takes `s = ceil(local / max_local) - 1`
  (at least 1 on one GPU above M0, so the gradient statistics come from two
  micro-batches) and `m = ceil(local / (s + 1))`, then caps `m` so that
  `K * m * (s + 1) <= M_max` (the artifact simulator's cap). Candidates with
  `m` outside the bounds, and every candidate of a pair whose smallest batch
  exceeds `M_max`, get goodput 0. `max_batch_size=None` means M0 (the batch is
  fixed); bounds `None` mean `(1, M_max)`.
- `fit_perf_params` pins a parameter at its lower bound (1e-8) when no data
  supports it: the node pair without multi-node data, the local pair without
  single-node multi-GPU data, each retrogression term without K > 2 data on
  its side (the artifact frees both when any K > 2 exists, but its regularizer
  then drives the unsupported one to the bound). Its gradient is analytic
  rather than autograd's, and the best point found is returned even when the
  solver stops early, as in the artifact. The solver is scipy's bounded
  truncated Newton (TNC) with tight tolerances rather than the artifact's
  L-BFGS-B: same objective and bounds, and the same optimum (within 1e-7 of
  the objective on synthetic data), but L-BFGS-B calls threaded OpenBLAS
  routines that take 10-50x longer when the CPUs are busy (a training job's
  data loaders, simulations run in parallel).
- `SpeedupFunction` divides by the best goodput on one GPU; when one GPU
  cannot run the job at all (M0 or the fixed batch above `max_local` without
  accumulation) it divides by that configuration's unbounded goodput instead.
  For a fixed batch B: efficiency 1, `local = ceil(B / K)`, accumulation only
  to fit `max_local` (no forced step on one GPU: the learning rate is not
  scaled), goodput `B / T_iter` (the job's progress rate), `min_local` and
  `max_batch_size` ignored, and 0 when K > B or the batch does not fit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast, overload

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Scalar = int | float | np.integer[Any] | np.floating[Any]
Values = Scalar | npt.NDArray[Any] | Sequence[float]

CANDIDATES = 50  # total batch sizes tried per (nodes, replicas) pair
MEMO_REPLICAS = 64  # SpeedupFunction memoizes pairs with at most this many replicas
_EPS = 1e-8  # tolerance for ceil() of ratios, and the artifact's floor on K - 2
_LOWER = 1e-8  # lower bound of every alpha and beta in the fit
_CANDIDATE_STEPS = np.linspace(0.0, 1.0, CANDIDATES)  # `optimize`'s geometric spacing
_INITIAL = (0.1, 0.01, 0.1, 0.01, 0.1, 0.01, 1.001)  # the artifact's starting point


@dataclass(frozen=True, slots=True)
class PerfParams:
    """The step-time model; seconds, and seconds per sample for `beta_c`."""

    # T_grad = alpha_c + beta_c * local_bsz: one forward/backward pass of m samples.
    alpha_c: float
    beta_c: float
    # T_sync = alpha_n + beta_n * (K - 2) when the K replicas span more than one node.
    alpha_n: float
    beta_n: float
    # T_sync = alpha_r + beta_r * (K - 2) when all K >= 2 replicas share one node.
    alpha_r: float
    beta_r: float
    # T_iter = s * T_grad + (T_grad^gamma + T_sync^gamma)^(1/gamma): gamma = 1 is no
    # overlap of compute and sync (a sum), gamma -> infinity full overlap (a max).
    gamma: float

    def __post_init__(self) -> None:
        values = (self.alpha_c, self.beta_c, self.alpha_n, self.beta_n, self.alpha_r, self.beta_r)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"alphas and betas must be finite and >= 0: {self}")
        if not 1.0 <= self.gamma <= 10.0:
            raise ValueError(f"gamma must be in [1, 10], got {self.gamma}")


@dataclass(frozen=True, slots=True)
class GradParams:
    """Gradient statistics: `sqr` = |G|^2 and `var` = tr(Sigma) / M0 (adaptdl's scale)."""

    sqr: float
    var: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sqr) and math.isfinite(self.var)):
            raise ValueError(f"gradient statistics must be finite: {self}")
        if self.sqr < 0 or self.var < 0:
            raise ValueError(f"gradient statistics must be >= 0: {self}")


def _is_scalar(*values: Values) -> bool:
    return not any(isinstance(v, np.ndarray | list | tuple) for v in values)


def _gain(grad: GradParams, init_batch_size: int, batch_size: FloatArray) -> FloatArray:
    scale = batch_size / init_batch_size
    denom = grad.var / scale + grad.sqr
    ones = np.ones_like(denom)
    return np.divide(grad.var + grad.sqr, denom, out=ones, where=denom > 0)


@overload
def efficiency(grad: GradParams, init_batch_size: int, batch_size: Scalar) -> float: ...  # type: ignore[overload-overlap]
@overload
def efficiency(grad: GradParams, init_batch_size: int, batch_size: Values) -> FloatArray: ...
def efficiency(grad: GradParams, init_batch_size: int, batch_size: Values) -> float | FloatArray:
    """Statistical efficiency E(M) = r / S: progress per sample relative to M0 (E(M0) = 1)."""
    batch = np.asarray(batch_size, dtype=np.float64)
    result = _gain(grad, init_batch_size, batch) * init_batch_size / batch
    return float(result) if _is_scalar(batch_size) else result


@overload
def adascale_gain(grad: GradParams, init_batch_size: int, batch_size: Scalar) -> float: ...  # type: ignore[overload-overlap]
@overload
def adascale_gain(grad: GradParams, init_batch_size: int, batch_size: Values) -> FloatArray: ...
def adascale_gain(grad: GradParams, init_batch_size: int, batch_size: Values) -> float | FloatArray:
    """AdaScale's gain r = (var + sqr) / (var / S + sqr) = S * E(M), in [1, S]."""
    result = _gain(grad, init_batch_size, np.asarray(batch_size, dtype=np.float64))
    return float(result) if _is_scalar(batch_size) else result


def _sync_time(perf: PerfParams, nodes: IntArray, replicas: IntArray) -> FloatArray:
    retrogression = np.maximum(replicas - 2, _EPS)
    across = perf.alpha_n + perf.beta_n * retrogression
    within = perf.alpha_r + perf.beta_r * retrogression
    return np.where(nodes > 1, across, np.where(replicas > 1, within, 0.0))


def _overlap(compute: FloatArray, sync: FloatArray, gamma: float) -> FloatArray:
    """(compute^gamma + sync^gamma)^(1/gamma), scaled by the larger term to stay finite."""
    high, low = np.maximum(compute, sync), np.minimum(compute, sync)
    ratio = np.divide(low, high, out=np.zeros_like(high), where=high > 0)
    return np.asarray(high * (1.0 + ratio**gamma) ** (1.0 / gamma), dtype=np.float64)


@dataclass(frozen=True)
class GoodputFunction:
    """A job's fitted model: step time, throughput, efficiency and their product."""

    perf: PerfParams
    grad: GradParams
    init_batch_size: int

    def __post_init__(self) -> None:
        if self.init_batch_size < 1:
            raise ValueError(f"init_batch_size must be >= 1, got {self.init_batch_size}")

    def _step_time(self, nodes: Any, replicas: Any, local_bsz: Any, accum: Any) -> FloatArray:
        compute = self.perf.alpha_c + self.perf.beta_c * np.asarray(local_bsz, dtype=np.float64)
        sync = _sync_time(self.perf, np.asarray(nodes), np.asarray(replicas))
        return np.asarray(accum * compute + _overlap(compute, sync, self.perf.gamma))

    def _goodput(self, nodes: Any, replicas: Any, local_bsz: Any, accum: Any) -> FloatArray:
        batch = np.asarray(replicas * local_bsz * (accum + 1), dtype=np.float64)
        step = self._step_time(nodes, replicas, local_bsz, accum)
        return np.asarray(batch / step * efficiency(self.grad, self.init_batch_size, batch))

    @overload
    def step_time(  # type: ignore[overload-overlap]
        self, nodes: Scalar, replicas: Scalar, local_bsz: Scalar, accum_steps: Scalar
    ) -> float: ...
    @overload
    def step_time(
        self, nodes: Values, replicas: Values, local_bsz: Values, accum_steps: Values
    ) -> FloatArray: ...
    def step_time(
        self, nodes: Values, replicas: Values, local_bsz: Values, accum_steps: Values
    ) -> float | FloatArray:
        """Seconds per optimizer step, T_iter (numpy-broadcast over the arguments)."""
        args = [np.asarray(v) for v in (nodes, replicas, local_bsz, accum_steps)]
        result = self._step_time(*args)
        return float(result) if _is_scalar(nodes, replicas, local_bsz, accum_steps) else result

    @overload
    def throughput(  # type: ignore[overload-overlap]
        self, nodes: Scalar, replicas: Scalar, local_bsz: Scalar, accum_steps: Scalar
    ) -> float: ...
    @overload
    def throughput(
        self, nodes: Values, replicas: Values, local_bsz: Values, accum_steps: Values
    ) -> FloatArray: ...
    def throughput(
        self, nodes: Values, replicas: Values, local_bsz: Values, accum_steps: Values
    ) -> float | FloatArray:
        """Samples per second, M / T_iter with M = replicas * local_bsz * (accum_steps + 1)."""
        k, m, s = (np.asarray(v) for v in (replicas, local_bsz, accum_steps))
        result = np.asarray(k * m * (s + 1) / self._step_time(np.asarray(nodes), k, m, s))
        return float(result) if _is_scalar(nodes, replicas, local_bsz, accum_steps) else result

    @overload
    def efficiency(self, batch_size: Scalar) -> float: ...  # type: ignore[overload-overlap]
    @overload
    def efficiency(self, batch_size: Values) -> FloatArray: ...
    def efficiency(self, batch_size: Values) -> float | FloatArray:
        """E(M) of this job's gradient statistics (see the module docstring)."""
        return efficiency(self.grad, self.init_batch_size, batch_size)

    @overload
    def evaluate(  # type: ignore[overload-overlap]
        self, nodes: Scalar, replicas: Scalar, local_bsz: Scalar, accum_steps: Scalar
    ) -> float: ...
    @overload
    def evaluate(
        self, nodes: Values, replicas: Values, local_bsz: Values, accum_steps: Values
    ) -> FloatArray: ...
    def evaluate(
        self, nodes: Values, replicas: Values, local_bsz: Values, accum_steps: Values
    ) -> float | FloatArray:
        """Goodput: throughput x efficiency, in M0-equivalent samples per second."""
        if _is_scalar(nodes, replicas, local_bsz, accum_steps):
            values = (float(cast(Scalar, v)) for v in (nodes, replicas, local_bsz, accum_steps))
            return self._evaluate_scalar(*values)
        args = [np.asarray(v) for v in (nodes, replicas, local_bsz, accum_steps)]
        return self._goodput(*args)

    def _evaluate_scalar(
        self, nodes: float, replicas: float, local_bsz: float, accum: float
    ) -> float:
        """`evaluate` of one configuration in plain floats: the same arithmetic (to rounding).

        Why: the runner's tuner evaluates its current configuration at every
        decision, where numpy's per-call cost is most of the work.
        """
        perf = self.perf
        compute = perf.alpha_c + perf.beta_c * local_bsz
        retrogression = max(replicas - 2, _EPS)
        if nodes > 1:
            sync = perf.alpha_n + perf.beta_n * retrogression
        elif replicas > 1:
            sync = perf.alpha_r + perf.beta_r * retrogression
        else:
            sync = 0.0
        high, low = max(compute, sync), min(compute, sync)
        ratio = low / high if high > 0 else 0.0
        step = accum * compute + high * math.pow(
            1.0 + math.pow(ratio, perf.gamma), 1.0 / perf.gamma
        )
        batch = replicas * local_bsz * (accum + 1)
        if step <= 0 or batch <= 0:  # what numpy makes of a zero model or an empty batch
            args = [np.asarray(v) for v in (nodes, replicas, local_bsz, accum)]
            return float(self._goodput(*args))
        m0, grad = self.init_batch_size, self.grad
        denom = grad.var / (batch / m0) + grad.sqr
        gain = (grad.var + grad.sqr) / denom if denom > 0 else 1.0
        return batch / step * (gain * m0 / batch)

    @overload
    def optimize(  # type: ignore[overload-overlap]
        self,
        nodes: Scalar,
        replicas: Scalar,
        max_batch_size: int | None = None,
        local_bsz_bounds: tuple[int, int] | None = None,
        accumulation: bool = False,
    ) -> tuple[float, int, int]: ...
    @overload
    def optimize(
        self,
        nodes: Values,
        replicas: Values,
        max_batch_size: int | None = None,
        local_bsz_bounds: tuple[int, int] | None = None,
        accumulation: bool = False,
    ) -> tuple[FloatArray, IntArray, IntArray]: ...
    def optimize(
        self,
        nodes: Values,
        replicas: Values,
        max_batch_size: int | None = None,
        local_bsz_bounds: tuple[int, int] | None = None,
        accumulation: bool = False,
    ) -> tuple[float, int, int] | tuple[FloatArray, IntArray, IntArray]:
        """The best (goodput, local_bsz, accum_steps) for each (nodes, replicas) pair.

        Broadcasts `nodes` against `replicas`; goodput 0 means no candidate fits.
        """
        m0 = self.init_batch_size
        max_batch = m0 if max_batch_size is None else max_batch_size
        min_local, max_local = (1, max_batch) if local_bsz_bounds is None else local_bsz_bounds
        if max_batch < m0:
            raise ValueError(f"max_batch_size {max_batch} is below init_batch_size {m0}")
        if not 1 <= min_local <= max_local:
            raise ValueError(f"local_bsz_bounds must satisfy 1 <= low <= high: {local_bsz_bounds}")
        if _is_scalar(nodes, replicas) and nodes == 1 and replicas == 1:
            return self._optimize_one_gpu(max_batch, min_local, max_local, accumulation)
        n_in, k_in = np.broadcast_arrays(np.asarray(nodes), np.asarray(replicas))
        shape = n_in.shape
        n, k = n_in.astype(np.int64).ravel(), k_in.astype(np.int64).ravel()
        if np.any(n < 1) or np.any(n > k):
            raise ValueError("optimize needs 1 <= nodes <= replicas")
        # Rows: CANDIDATES total batch sizes, geometric from `smallest` to `max_batch`.
        smallest = np.maximum(m0, min_local * k).astype(np.float64)
        steps = _CANDIDATE_STEPS[:, None]
        local = smallest * (max_batch / smallest) ** steps / k
        if accumulation:
            # At least 0: a per-GPU batch far below a huge max_local rounds to -1 otherwise.
            accum = np.maximum(np.ceil(local / max_local - _EPS) - 1, 0)
            one_gpu_above_m0 = (k == 1) & (local > m0 + _EPS)
            accum = np.where(one_gpu_above_m0, np.maximum(accum, 1), accum).astype(np.int64)
        else:
            accum = np.zeros(local.shape, dtype=np.int64)
        local_bsz = np.ceil(local / (accum + 1) - _EPS).astype(np.int64)
        local_bsz = np.minimum(local_bsz, max_batch // (k * (accum + 1)))
        goodput = self._goodput(n, k, np.maximum(local_bsz, 1), accum)
        # The cap leaves m below min_local for a pair whose smallest batch exceeds max_batch.
        valid = (min_local <= local_bsz) & (local_bsz <= max_local)
        goodput = np.where(valid, goodput, 0.0)
        best = np.argmax(goodput, axis=0), np.arange(n.size)
        best_goodput = goodput[best].reshape(shape)
        best_local, best_accum = local_bsz[best].reshape(shape), accum[best].reshape(shape)
        if _is_scalar(nodes, replicas):
            return float(best_goodput), int(best_local), int(best_accum)
        return best_goodput, best_local, best_accum

    def _optimize_one_gpu(
        self, max_batch: int, min_local: int, max_local: int, accumulation: bool
    ) -> tuple[float, int, int]:
        """`optimize` on one GPU: the same candidates and arithmetic, without broadcasting.

        Why: a training job's tuner asks this at its decisions, several times
        each, and the general path's broadcasting over (nodes, replicas) pairs
        costs it several times the arithmetic (there is no sync term to add).
        """
        m0 = self.init_batch_size
        smallest = float(max(m0, min_local))
        local = smallest * (max_batch / smallest) ** _CANDIDATE_STEPS
        if accumulation:
            accum = np.maximum(np.ceil(local / max_local - _EPS) - 1, 0)
            accum = np.where(local > m0 + _EPS, np.maximum(accum, 1), accum).astype(np.int64)
        else:
            accum = np.zeros(CANDIDATES, dtype=np.int64)
        local_bsz = np.minimum(
            np.ceil(local / (accum + 1) - _EPS).astype(np.int64), max_batch // (accum + 1)
        )
        m = np.maximum(local_bsz, 1)
        compute = self.perf.alpha_c + self.perf.beta_c * m.astype(np.float64)
        step = accum * compute + compute  # `_overlap` with no sync term is the compute time
        batch = (m * (accum + 1)).astype(np.float64)
        goodput = batch / step * (_gain(self.grad, m0, batch) * m0 / batch)
        valid = (min_local <= local_bsz) & (local_bsz <= max_local)
        best = int(np.argmax(np.where(valid, goodput, 0.0)))
        return float(goodput[best]) if valid[best] else 0.0, int(local_bsz[best]), int(accum[best])


def optimize_many(
    models: Sequence[GoodputFunction],
    nodes: Values,
    replicas: Values,
    max_batch_sizes: Sequence[int | None],
    local_bsz_bounds: Sequence[tuple[int, int] | None],
    accumulation: bool = False,
) -> FloatArray:
    """`GoodputFunction.optimize`'s best goodput for many models at once: shape (models, pairs).

    Row i equals `models[i].optimize(nodes, replicas, max_batch_sizes[i],
    local_bsz_bounds[i], accumulation)[0]` (the same arithmetic, broadcast
    over a leading axis of models), for the (nodes, replicas) pairs given
    as two equally long 1-D arrays. Why: a scheduler that asks for every
    job's goodput on the same configurations does so in one pass, not one
    call per job.
    """
    count = len(models)
    n = np.asarray(nodes, dtype=np.int64).ravel()
    k = np.asarray(replicas, dtype=np.int64).ravel()
    if count == 0:
        return np.zeros((0, n.size))
    if n.size != k.size or np.any(n < 1) or np.any(n > k):
        raise ValueError(
            "optimize_many needs equally long nodes and replicas, 1 <= nodes <= replicas"
        )
    m0 = np.array([model.init_batch_size for model in models], dtype=np.int64)
    max_batch = np.array(
        [m if m is not None else int(b) for m, b in zip(max_batch_sizes, m0, strict=True)],
        dtype=np.int64,
    )
    if np.any(max_batch < m0):
        raise ValueError("a max_batch_size is below its init_batch_size")
    lows, highs = [], []
    for bounds, top in zip(local_bsz_bounds, max_batch, strict=True):
        low, high = (1, int(top)) if bounds is None else bounds
        if not 1 <= low <= high:
            raise ValueError(f"local_bsz_bounds must satisfy 1 <= low <= high: {bounds}")
        lows.append(low)
        highs.append(high)
    column = (slice(None), None)  # models down the first axis, pairs along the second
    min_local = np.array(lows, dtype=np.int64)[column]
    max_local = np.array(highs, dtype=np.int64)[column]
    m0_, max_b = m0[column], max_batch[column]

    def per_model(name: str, source: str = "perf") -> FloatArray:
        values = [getattr(getattr(model, source), name) for model in models]
        return np.array(values, dtype=np.float64)[column]

    smallest = np.maximum(m0_, min_local * k).astype(np.float64)  # (models, pairs)
    steps = np.linspace(0.0, 1.0, CANDIDATES)[:, None, None]
    local = smallest * (max_b / smallest) ** steps / k  # (candidates, models, pairs)
    if accumulation:
        accum = np.maximum(np.ceil(local / max_local - _EPS) - 1, 0)
        one_gpu_above_m0 = (k == 1) & (local > m0_ + _EPS)
        accum = np.where(one_gpu_above_m0, np.maximum(accum, 1), accum).astype(np.int64)
    else:
        accum = np.zeros(local.shape, dtype=np.int64)
    local_bsz = np.ceil(local / (accum + 1) - _EPS).astype(np.int64)
    local_bsz = np.minimum(local_bsz, max_b // (k * (accum + 1)))
    m = np.maximum(local_bsz, 1)
    compute = per_model("alpha_c") + per_model("beta_c") * m.astype(np.float64)
    retrogression = np.maximum(k - 2, _EPS)
    across = per_model("alpha_n") + per_model("beta_n") * retrogression
    within = per_model("alpha_r") + per_model("beta_r") * retrogression
    sync = np.where(n > 1, across, np.where(k > 1, within, 0.0))
    high, low = np.maximum(compute, sync), np.minimum(compute, sync)
    ratio = np.divide(low, high, out=np.zeros_like(high), where=high > 0)
    gamma = per_model("gamma")
    step = accum * compute + high * (1.0 + ratio**gamma) ** (1.0 / gamma)
    batch = (k * m * (accum + 1)).astype(np.float64)
    var, sqr = per_model("var", "grad"), per_model("sqr", "grad")
    denom = var / (batch / m0_) + sqr
    gain = np.divide(var + sqr, denom, out=np.ones_like(denom), where=denom > 0)
    goodput = batch / step * (gain * m0_ / batch)
    valid = (min_local <= local_bsz) & (local_bsz <= max_local)
    return np.asarray(np.where(valid, goodput, 0.0).max(axis=0), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class _Samples:
    """Measurements in the form the fit objective uses them."""

    local_bsz: FloatArray
    retrogression: FloatArray  # max(K - 2, 1e-8)
    across: FloatArray  # 1.0 where the job spans nodes
    within: FloatArray  # 1.0 where K >= 2 replicas share one node
    log_accum: FloatArray  # NaN where T_grad was not measured apart
    log_optim: FloatArray


def _objective(x: FloatArray, data: _Samples) -> tuple[float, FloatArray]:
    """The artifact's fit objective and its exact gradient.

    RMSE(log T_grad, log accum) + RMSE(log T_iter(s=0), log optim)
    + 1e-3 (gamma - 1)^2 + 1e-2 ((beta_n / alpha_n)^2 + (beta_r / alpha_r)^2).
    """
    alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma = (float(v) for v in x)
    compute = alpha_c + beta_c * data.local_bsz
    sync_n = alpha_n + beta_n * data.retrogression
    sync_r = alpha_r + beta_r * data.retrogression
    sync = data.across * sync_n + data.within * sync_r
    high, low = np.maximum(compute, sync), np.minimum(compute, sync)
    q = (low / high) ** gamma  # in [0, 1]; 0 on one GPU
    log_optim = np.log(high) + np.log1p(q) / gamma
    weight_low = q / (1.0 + q)  # d log T_iter / d log(low term)
    weight_compute = np.where(compute >= sync, 1.0 - weight_low, weight_low)
    measured = ~np.isnan(data.log_accum)
    err_accum = np.where(measured, np.log(compute) - data.log_accum, 0.0)
    err_optim = log_optim - data.log_optim
    accum_count = max(int(np.count_nonzero(measured)), 1)
    rmse_accum = math.sqrt(float(np.sum(err_accum**2)) / accum_count)
    rmse_optim = math.sqrt(float(np.mean(err_optim**2)))
    count = err_optim.size
    d_accum = err_accum / (accum_count * max(rmse_accum, 1e-150))  # d RMSE / d log T_grad
    d_optim = err_optim / (count * max(rmse_optim, 1e-150))  # d RMSE / d log T_iter
    d_compute = (d_accum + d_optim * weight_compute) / compute
    d_sync = np.divide(
        d_optim * (1.0 - weight_compute), sync, out=np.zeros_like(sync), where=sync > 0
    )
    q_log_q = q * np.log(np.where(q > 0, q, 1.0))
    d_gamma = (q_log_q / (1.0 + q) - np.log1p(q)) / gamma**2
    ratio_n, ratio_r = beta_n / alpha_n, beta_r / alpha_r
    grad = np.array(
        [
            np.sum(d_compute),
            np.sum(d_compute * data.local_bsz),
            np.sum(d_sync * data.across) - 2e-2 * ratio_n**2 / alpha_n,
            np.sum(d_sync * data.across * data.retrogression) + 2e-2 * ratio_n / alpha_n,
            np.sum(d_sync * data.within) - 2e-2 * ratio_r**2 / alpha_r,
            np.sum(d_sync * data.within * data.retrogression) + 2e-2 * ratio_r / alpha_r,
            np.sum(d_optim * d_gamma) + 2e-3 * (gamma - 1.0),
        ]
    )
    value = rmse_accum + rmse_optim + 1e-3 * (gamma - 1.0) ** 2 + 1e-2 * (ratio_n**2 + ratio_r**2)
    return value, grad


def fit_perf_params(
    nodes: npt.ArrayLike,
    replicas: npt.ArrayLike,
    local_bsz: npt.ArrayLike,
    accum_step_time: npt.ArrayLike,
    optim_step_time: npt.ArrayLike,
) -> PerfParams:
    """Fit `PerfParams` to measured step times by bounded RMSLE minimization (Pollux §4.1).

    One entry per configuration seen: `accum_step_time` is the compute time of a
    step (T_grad), `optim_step_time` a synchronizing step without accumulation
    (T_iter with s = 0). A NaN `accum_step_time` leaves that entry out of the
    T_grad term: a step on several replicas whose compute was not timed apart
    from its synchronization. Parameters without supporting data stay at their
    lower bound, which makes a new job look perfectly scalable (Pollux §4.3).
    """
    # Imported here, not at the top, to keep `import gpuq.goodput` light in training jobs.
    import scipy.optimize  # type: ignore[import-untyped, unused-ignore]

    columns = [np.asarray(v, dtype=np.float64).ravel() for v in (nodes, replicas, local_bsz)]
    n, k, m = columns
    accum = np.asarray(accum_step_time, dtype=np.float64).ravel()
    optim = np.asarray(optim_step_time, dtype=np.float64).ravel()
    if len({n.size, k.size, m.size, accum.size, optim.size}) != 1 or n.size == 0:
        raise ValueError("fit_perf_params needs equally long, non-empty measurements")
    if np.any(n < 1) or np.any(k < n) or np.any(m < 1):
        raise ValueError("fit_perf_params needs 1 <= nodes <= replicas and local_bsz >= 1")
    if not (np.all(np.isfinite(accum) | np.isnan(accum)) and np.all(np.isfinite(optim))):
        raise ValueError("step times must be finite (or NaN: a T_grad not measured)")
    if np.any(accum <= 0) or np.any(optim <= 0):
        raise ValueError("step times must be positive")
    lower = np.array([_LOWER] * 6 + [1.0])
    upper = np.array([np.inf] * 6 + [10.0])
    initial = np.array(_INITIAL)
    across, within = n > 1, (n == 1) & (k > 1)
    pinned = np.array(
        [
            np.unique(m).size == 1,  # alpha_c: one batch size cannot split T_grad
            False,
            not across.any(),
            not (across & (k > 2)).any(),
            not within.any(),
            not (within & (k > 2)).any(),
            False,
        ]
    )
    initial[pinned] = lower[pinned]
    if pinned[0]:
        compute = accum[~np.isnan(accum)] if np.any(~np.isnan(accum)) else optim
        initial[0] = float(np.mean(compute)) / 2  # the artifact's even split of T_grad
    data = _Samples(
        local_bsz=m,
        retrogression=np.maximum(k - 2, _EPS),
        across=across.astype(np.float64),
        within=within.astype(np.float64),
        log_accum=np.log(accum),
        log_optim=np.log(optim),
    )
    free = ~pinned

    def objective(z: FloatArray) -> tuple[float, FloatArray]:
        x = initial.copy()
        x[free] = z
        value, grad = _objective(x, data)
        return value, grad[free]

    result = scipy.optimize.minimize(
        objective,
        initial[free],
        jac=True,
        method="TNC",  # not L-BFGS-B: see the module docstring
        options={"maxfun": 1000, "ftol": 1e-12, "xtol": 1e-12, "gtol": 1e-9},
        bounds=list(zip(lower[free], upper[free], strict=True)),
    )
    x = initial.copy()
    x[free] = result.x
    if not across.any():  # prior: crossing nodes costs at least 1.1x staying on one
        x[2], x[3] = max(x[2], 1.1 * x[4]), max(x[3], 1.1 * x[5])
    return PerfParams(*(float(v) for v in x))


ONE_REPLICA_GRID = 51
"""Points of each grid `fit_one_replica` searches, each narrower than the one before."""
ONE_REPLICA_TOLERANCE = 1e-7
"""Width of the last grid, as a share of the step time that grows with the batch."""
_ONE_REPLICA_UNIT = np.linspace(0.0, 1.0, ONE_REPLICA_GRID)


def _fit_on_bound(log_t: FloatArray, free: FloatArray, fixed: FloatArray) -> float:
    """The x > 0 minimizing the squared error of log(x free + fixed) against `log_t` (Newton)."""
    y = float(np.mean(log_t - np.log(free)))  # the optimum without the fixed part
    for _ in range(12):
        scaled = math.exp(y) * free
        share = scaled / (scaled + fixed)
        residual = np.log(scaled + fixed) - log_t
        slope = float(np.sum(residual * share))
        curvature = float(np.sum(share**2 + residual * share * (1.0 - share)))
        if curvature <= 0:
            break
        y -= max(-1.0, min(1.0, slope / curvature))
    return math.exp(y)


def fit_one_replica(local_bsz: npt.ArrayLike, step_time: npt.ArrayLike) -> PerfParams:
    """`fit_perf_params` for steps timed on one replica, where T_iter = T_grad, without a solver.

    On one replica nothing constrains the sync terms (they stay at their
    bounds, as there) and gamma only meets its regularizer (its optimum is 1),
    and with T_grad measured as the step time both RMSE terms are the same:
    the objective is the squared error of log(alpha_c + beta_c m) against the
    log step times. With alpha_c + beta_c m = c ((1 - s) + s m / max m) the
    best c is closed-form for each share s in [0, 1], which leaves a search
    over s on ever finer grids; an optimum on a bound (alpha_c or beta_c at 1e-8)
    is refined with the other parameter alone. Same optimum (tested against
    the solver), in well under a millisecond instead of its 5-30 ms, so a
    training job can refit between any two steps.
    """
    m = np.asarray(local_bsz, dtype=np.float64).ravel()
    seconds = np.asarray(step_time, dtype=np.float64).ravel()
    valid = np.all(np.isfinite(seconds)) and np.all(seconds > 0) and np.all(m >= 1)
    if m.size == 0 or m.size != seconds.size or not valid:
        raise ValueError("fit_one_replica needs as many positive step times as batch sizes >= 1")
    log_t = np.log(seconds)
    ones = np.ones_like(m)
    if len(set(m.tolist())) == 1:  # alpha_c pinned at half the mean time, as fit_perf_params does
        alpha = float(np.mean(np.exp(log_t))) / 2
        beta = _fit_on_bound(log_t, m, alpha * ones)
        return PerfParams(alpha, max(beta, _LOWER), 1.1 * _LOWER, 1.1 * _LOWER, _LOWER, _LOWER, 1.0)
    ratio = m / m.max()
    rise = ratio - 1.0  # (1 - s) + s ratio = 1 + s (ratio - 1)

    def errors(shares: FloatArray) -> tuple[FloatArray, FloatArray]:
        residual = log_t - np.log(1.0 + np.multiply.outer(shares, rise))
        log_c = residual.mean(axis=1)
        return np.square(residual - log_c[:, None]).sum(axis=1), log_c

    low, high = 0.0, 1.0
    while True:  # each grid narrows the search to the two cells around its best point
        shares = low + (high - low) * _ONE_REPLICA_UNIT
        sse, log_c = errors(shares)
        best = int(np.argmin(sse))
        if high - low < ONE_REPLICA_TOLERANCE:
            break
        low, high = float(shares[max(best - 1, 0)]), float(shares[min(best + 1, shares.size - 1)])
    share, scale = float(shares[best]), math.exp(float(log_c[best]))
    alpha, beta = scale * (1.0 - share), scale * share / float(m.max())
    if beta < _LOWER:  # on the bound: beta_c = 1e-8 and the best alpha_c beside it
        beta = _LOWER
        alpha = _fit_on_bound(log_t, ones, beta * m)
    elif alpha < _LOWER:
        alpha = _LOWER
        beta = _fit_on_bound(log_t, m, alpha * ones)
    alpha, beta = max(alpha, _LOWER), max(beta, _LOWER)
    return PerfParams(alpha, beta, 1.1 * _LOWER, 1.1 * _LOWER, _LOWER, _LOWER, 1.0)


class SpeedupFunction:
    """goodput(nodes, replicas) / goodput(1, 1), each at its best batch size; memoized.

    With `fixed_batch_size` the job is not adaptive: its batch never changes and
    its efficiency is 1, so the speedup is the ratio of step rates.
    """

    def __init__(
        self,
        goodput_fn: GoodputFunction,
        max_batch_size: int | None = None,
        local_bsz_bounds: tuple[int, int] | None = None,
        accumulation: bool = False,
        fixed_batch_size: int | None = None,
    ) -> None:
        if fixed_batch_size is not None and fixed_batch_size < 1:
            raise ValueError(f"fixed_batch_size must be >= 1, got {fixed_batch_size}")
        self.goodput_fn = goodput_fn
        self.max_batch_size = max_batch_size
        self.local_bsz_bounds = local_bsz_bounds
        self.accumulation = accumulation
        self.fixed_batch_size = fixed_batch_size
        self._memo = np.full((MEMO_REPLICAS + 1, MEMO_REPLICAS + 1), -1.0)
        self._memo[0, 0] = 0.0
        one = np.ones(1, dtype=np.int64)
        base = float(self._goodput(one, one)[0])
        if base <= 0:  # one GPU cannot run it: compare with it unbounded
            batch = fixed_batch_size or goodput_fn.init_batch_size
            base = batch / goodput_fn.step_time(1, 1, batch, 0)
        self._base = base

    def _goodput(self, nodes: IntArray, replicas: IntArray) -> FloatArray:
        if self.fixed_batch_size is None:
            return self.goodput_fn.optimize(
                nodes, replicas, self.max_batch_size, self.local_bsz_bounds, self.accumulation
            )[0]
        batch = self.fixed_batch_size
        max_local = batch if self.local_bsz_bounds is None else self.local_bsz_bounds[1]
        local = np.ceil(batch / replicas - _EPS)
        accum = np.zeros_like(local)
        if self.accumulation:
            accum = np.maximum(np.ceil(local / max_local - _EPS) - 1, 0)
        local_bsz = np.ceil(local / (accum + 1) - _EPS)
        step = self.goodput_fn.step_time(nodes, replicas, local_bsz, accum)
        fits = (local_bsz <= max_local) & (replicas <= batch)
        return np.where(fits, batch / step, 0.0)

    @overload
    def __call__(self, nodes: Scalar, replicas: Scalar) -> float: ...  # type: ignore[overload-overlap]
    @overload
    def __call__(self, nodes: Values, replicas: Values) -> FloatArray: ...
    def __call__(self, nodes: Values, replicas: Values) -> float | FloatArray:
        """Speedup of each (nodes, replicas) pair over one GPU; 0 for no GPUs (broadcasts)."""
        n_in, k_in = np.broadcast_arrays(np.asarray(nodes), np.asarray(replicas))
        shape = n_in.shape
        n, k = n_in.astype(np.int64).ravel(), k_in.astype(np.int64).ravel()
        if np.any(n < 0) or np.any(n > k) or np.any((n > 0) != (k > 0)):
            raise ValueError("speedup needs 0 <= nodes <= replicas, both 0 or both positive")
        speedup = np.full(n.size, -1.0)
        memoized = k <= MEMO_REPLICAS
        speedup[memoized] = self._memo[n[memoized], k[memoized]]
        missing = speedup < 0
        if missing.any():
            keys, inverse = np.unique(n[missing] * (1 << 32) + k[missing], return_inverse=True)
            unique_n, unique_k = keys >> 32, keys & ((1 << 32) - 1)
            computed = self._goodput(unique_n, unique_k) / self._base
            keep = unique_k <= MEMO_REPLICAS
            self._memo[unique_n[keep], unique_k[keep]] = computed[keep]
            speedup[missing] = computed[inverse.ravel()]
        result = speedup.reshape(shape)
        return float(result) if _is_scalar(nodes, replicas) else result
