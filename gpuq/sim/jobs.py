"""One simulated job: its configuration, progress, and the agent inside it.

Mechanics follow the Pollux artifact's simulator (`notes/ones_pollux.md` 3.7):

- Progress is counted in scale-invariant iterations of M0 samples: a step at
  total batch M adds the AdaScale gain `r = (var + sqr) / (var / S + sqr)`,
  S = M / M0, with the true gradient statistics of the current epoch. The
  progress rate is `r / (step_time + accum_steps * compute_time)`, times the
  job's share of the tick and `(1 - slowdown)` for interference.
- A (re)allocation costs `restart_penalty` seconds without progress while
  the job holds its new GPUs. The first start pays it too but is not
  counted in `num_restarts`; losing all GPUs is free, and coming back
  counts as a restart (the artifact's rules).
- The agent records `(nodes, replicas, local_bsz)` -> step times for each
  configuration it runs and, at the end of a tick in which it saw a new one,
  refits `PerfParams` on all of them (`gpuq.goodput.fit_perf_params`): the
  artifact refits at every new configuration, the real agent every 30 s
  report; once per tick is both. The samples are exact table values, so a
  fit depends only on the application and the configurations seen, and
  their order (the fit is ill-conditioned: the order of the sums moves it).
  Within a run, jobs share the fit of the first order seen for each set
  (`FitMemo`); across runs in one process, fits are reused by the ordered
  samples only, so a run's result never depends on the runs before it.
- Adaptive jobs start at `max(M0, min_local * K)` until they have a model,
  then pick `(m, s)` with `GoodputFunction.optimize` (accumulation allowed)
  after each reallocation, each epoch and each refit, switching only when
  the predicted goodput beats the current configuration's by more than 5%
  (adaptdl's data loader) or the current one no longer fits.
- Non-adaptive jobs run at a fixed total batch with the artifact's rule for
  the per-GPU batch and accumulation (`Application.fixed_batch_config`).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from gpuq.goodput import GoodputFunction, GradParams, PerfParams, fit_perf_params
from gpuq.sim.apps import Application, BatchConfig, ProfileSample, normalize_placement
from gpuq.sim.workload import WorkloadJob

SPEEDUP_THRESHOLD = 1.05
"""An adaptive job switches batch configuration only for a predicted gain above 5%."""

_FITS: dict[tuple[str, tuple[ProfileSample, ...]], PerfParams] = {}
"""Fits by application and ordered samples: a pure function, shared by every run."""
_MAX_FITS = 50_000


class FitMemo:
    """One run's fits by application and set of configurations (module docstring)."""

    __slots__ = ("_by_set",)

    def __init__(self) -> None:
        self._by_set: dict[tuple[str, frozenset[tuple[int, int, int]]], PerfParams] = {}

    def fit(
        self, app: Application, samples: dict[tuple[int, int, int], ProfileSample]
    ) -> PerfParams:
        """`PerfParams` fitted to `samples`, in the first order this run saw their set."""
        key = (app.name, frozenset(samples))
        perf = self._by_set.get(key)
        if perf is None:
            perf = _fit_ordered(app.name, tuple(samples.values()))
            self._by_set[key] = perf
        return perf


def _fit_ordered(name: str, samples: tuple[ProfileSample, ...]) -> PerfParams:
    key = (name, samples)
    perf = _FITS.get(key)
    if perf is None:
        perf = fit_perf_params(*zip(*samples, strict=True))
        if len(_FITS) >= _MAX_FITS:
            _FITS.clear()
        _FITS[key] = perf
    return perf


def agent_terms(app: Application, batch_size: int, policy_adaptive: bool) -> tuple[bool, int]:
    """Whether a job adapts its batch under a policy, and its (initial or fixed) total batch.

    Under a policy with adaptive jobs every application adapts except one
    with a `fixed_batch_size` (NCF), which runs at that batch; under any
    other policy a job runs at its user's batch size.
    """
    fixed = app.fixed_batch_size if policy_adaptive else None
    return policy_adaptive and fixed is None, fixed or batch_size


def gpu_limit(app: Application, adaptive: bool, batch_size: int, requested: int, total: int) -> int:
    """The most GPUs a job may use on `total` GPUs (`JobView.max_gpus`, engine docstring).

    The batch's worth of smallest per-GPU shares (the largest batch for an
    adaptive job), the application's limit and the cluster, never below
    the request (capped at the cluster).
    """
    batch = app.max_batch_size if adaptive else batch_size
    cap = min(total, max(1, batch // app.local_bsz_bounds[0]), app.max_replicas or total)
    return max(cap, min(requested, total))


@lru_cache(maxsize=1 << 16)
def _optimize(
    goodput: GoodputFunction,
    nodes: int,
    replicas: int,
    max_batch_size: int,
    local_bsz_bounds: tuple[int, int],
) -> tuple[float, int, int]:
    """The agent's best (goodput, per-GPU batch, accumulation steps), memoized.

    Jobs of one application in the same epoch with the same model (a fit is
    shared by every job that saw the same configurations) ask the same question.
    """
    return goodput.optimize(nodes, replicas, max_batch_size, local_bsz_bounds, accumulation=True)


class SimJob:
    """The simulator's mutable record of one job (see the module docstring)."""

    __slots__ = (
        "_fit_memo",
        "_goodput",
        "_grad_noise",
        "_rate",
        "_stale",
        "adaptive",
        "allocation",
        "app",
        "attained_service",
        "batch_size",
        "config",
        "delay",
        "epoch",
        "finish_time",
        "id",
        "num_restarts",
        "perf",
        "placement",
        "profile",
        "progress",
        "restart_penalty",
        "run_time",
        "spec",
        "start_time",
    )

    def __init__(
        self,
        job_id: int,
        spec: WorkloadJob,
        app: Application,
        adaptive: bool,
        restart_penalty: float,
        grad_noise: tuple[float, ...] = (),
        fits: FitMemo | None = None,
    ) -> None:
        self.id = job_id
        self._fit_memo = FitMemo() if fits is None else fits
        self.spec = spec
        self.app = app
        self.adaptive, self.batch_size = agent_terms(app, spec.batch_size, adaptive)
        self.restart_penalty = restart_penalty
        self.allocation: tuple[int, ...] = ()
        self.placement: tuple[int, ...] = ()
        self.config: BatchConfig | None = None
        self.progress = 0.0
        self.epoch = 0
        self.delay = 0.0
        self.num_restarts = 0
        self.start_time: float | None = None
        self.finish_time: float | None = None
        self.attained_service = 0.0
        self.run_time = 0.0
        self.profile: dict[tuple[int, int, int], ProfileSample] = {}
        self.perf: PerfParams | None = None
        self._grad_noise = grad_noise
        self._goodput: GoodputFunction | None = None
        self._rate: float | None = None
        self._stale = False

    # ---- what the policy sees -----------------------------------------------------

    @property
    def replicas(self) -> int:
        """GPUs the job holds now."""
        return sum(self.placement)

    @property
    def max_profiled_gpus(self) -> int:
        """Most GPUs the job has run on."""
        return max((key[1] for key in self.profile), default=0)

    @property
    def total_batch(self) -> int:
        """Total batch size of the current configuration (the target when not running)."""
        if self.config is None or not self.placement:
            return self.batch_size
        return self.config.total(self.replicas)

    def goodput(self) -> GoodputFunction | None:
        """The agent's model: fitted step times and this epoch's gradient statistics."""
        if self.perf is None:
            return None
        grad = self.app.grad_params(self.epoch, self.total_batch)
        if self._grad_noise:
            noise = self._grad_noise[min(self.epoch, len(self._grad_noise) - 1)]
            grad = GradParams(grad.sqr, grad.var * noise)
        cached = self._goodput
        if cached is None or cached.perf is not self.perf or cached.grad != grad:
            cached = GoodputFunction(self.perf, grad, self.app.init_batch_size)
            self._goodput = cached
        return cached

    def remaining_iterations(self) -> float:
        """Oracle: iterations at the job's target batch size until completion."""
        return self.app.remaining_iterations(self.batch_size, self.progress)

    # ---- what the simulator does to it ---------------------------------------------

    def reallocate(self, allocation: tuple[int, ...]) -> bool:
        """Move the job to `allocation`; True if it pays the restart penalty."""
        if allocation == self.allocation:
            return False
        self.allocation = allocation
        self.placement = normalize_placement(allocation)
        self._rate = None
        if not self.placement:
            self.config = None
            self.delay = 0.0
            return False
        if self.start_time is not None:
            self.num_restarts += 1
        self.delay = self.restart_penalty
        self._choose_config(hysteresis=True)
        return True

    def set_batch_size(self, batch_size: int) -> None:
        """A policy's new total batch size for a non-adaptive job (no restart)."""
        if self.adaptive or batch_size == self.batch_size or batch_size < 1:
            return
        self.batch_size = batch_size
        if self.placement:
            self._choose_config(hysteresis=False)

    def _nodes(self) -> int:
        return len(self.placement)

    def _choose_config(self, hysteresis: bool) -> None:
        replicas = self.replicas
        app = self.app
        self._rate = None
        if not self.adaptive:
            self.config = app.fixed_batch_config(replicas, self.batch_size)
            return
        goodput = self.goodput()
        initial = max(app.init_batch_size, app.local_bsz_bounds[0] * replicas)
        if goodput is None:
            self.config = app.fixed_batch_config(replicas, min(initial, app.max_batch_size))
            return
        nodes = self._nodes()
        best, atomic, accum = _optimize(
            goodput, nodes, replicas, app.max_batch_size, app.local_bsz_bounds
        )
        current = self.config
        if current is not None and self._fits(current, replicas):
            if best <= 0:
                return
            now = goodput.evaluate(nodes, replicas, current.atomic_bsz, current.accum_steps)
            if hysteresis and best <= SPEEDUP_THRESHOLD * now:
                return
        if best > 0:
            self.config = BatchConfig(atomic, accum)
        else:
            self.config = app.fixed_batch_config(replicas, min(initial, app.max_batch_size))

    def _fits(self, config: BatchConfig, replicas: int) -> bool:
        low, high = self.app.local_bsz_bounds
        total = config.total(replicas)
        return (
            low <= config.atomic_bsz <= high
            and self.app.init_batch_size <= total <= self.app.max_batch_size
        )

    def rate(self) -> float:
        """Progress (M0-sized iterations) per second when running alone on its GPUs."""
        if self._rate is None:
            if self.config is None or not self.placement:
                self._rate = 0.0
            else:
                gain = self.app.gain(self.epoch, self.config.total(self.replicas))
                step, sync = self.app.step_time(self.placement, self.config.atomic_bsz)
                self._rate = gain / (step + self.config.accum_steps * (step - sync))
        return self._rate

    def _observe(self) -> None:
        config = self.config
        if config is None:
            return
        key = (self._nodes(), self.replicas, config.atomic_bsz)
        if key not in self.profile:
            sample = self.app.profile_sample(self.placement, config.atomic_bsz)
            self.profile[key] = sample
            self._stale = True

    def _refit(self) -> None:
        """Fit the agent's model to every configuration seen (once per tick, like a report)."""
        self._stale = False
        perf = self._fit_memo.fit(self.app, self.profile)
        if perf != self.perf:
            self.perf = perf
            if self.adaptive and self.placement and self.finish_time is None:
                self._choose_config(hysteresis=True)

    def advance(
        self, now: float, seconds: float, share: float, speed: float, refit: bool = True
    ) -> None:
        """Run for `seconds` from `now` with a `share` of the time at `speed` of its rate.

        `share` < 1 is time-slicing (the GPUs are held that fraction of the
        time); `speed` < 1 is interference. Sets `finish_time` on completion.
        A configuration seen for the first time is fitted at the end, or with
        `refit=False` at the end of a later call (a caller advancing in
        steps shorter than a tick refits once per tick, as the engine does).
        """
        if not self.placement or self.finish_time is not None:
            return
        if self.start_time is None:
            self.start_time = now
        gpus = self.replicas
        waited = min(self.delay, seconds)
        self.delay -= waited
        held = waited
        clock = now + waited
        left = seconds - waited
        bounds = self.app.epoch_progress
        while left > 0:
            rate = self.rate() * share * speed
            if rate <= 0:
                held += left
                break
            self._observe()
            needed = (bounds[self.epoch + 1] - self.progress) / rate
            if needed > left:
                self.progress += rate * left
                held += left
                left = 0.0
            else:
                self.progress = float(bounds[self.epoch + 1])
                self.epoch += 1
                held += needed
                clock += needed
                left -= needed
                self._rate = None
                if self.epoch >= self.app.max_epochs:
                    self.finish_time = clock
                    break
                if self.adaptive:
                    self._choose_config(hysteresis=True)
        self.attained_service += held * share * gpus
        self.run_time += held * share
        if self._stale and refit:
            self._refit()


def noise_factors(rng: np.random.Generator, sigma: float, epochs: int) -> tuple[float, ...]:
    """Per-epoch multiplicative noise on the gradient variance the agent sees (lognormal)."""
    if sigma <= 0:
        return ()
    return tuple(float(v) for v in rng.lognormal(0.0, sigma, size=epochs))
