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

GPU types (a cluster whose nodes have several, `gpuq.sim.cluster`): the job
has one `Application` per type, the tables measured there; gradient
statistics and progress are the job's whatever the type. As in Sia's
simulator:

- A job runs on one type. An allocation spanning types (a type-unaware
  policy's) runs on the type holding most of its GPUs, ties to the faster
  type (single-GPU throughput); the others stay held and idle.
- From its first start the job knows its single-GPU step times on every
  type (Sia profiles each type on one GPU), and it records what it runs.
  Its model per type is fitted per type and bootstrapped across types
  (`gpuq.typemodels`); the type-unaware model (`goodput()`, what Pollux
  sees) is fitted to every measurement of every type together, as Sia's
  Pollux baseline merges profiles.
- Each start, resize and move costs the application's own restart delay
  (`Application.restart_delay`, else the simulator's flat penalty), and
  progress is divided by its calibration `slowdown`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from gpuq.goodput import GoodputFunction, GradParams, PerfParams, fit_perf_params
from gpuq.sim.apps import Application, BatchConfig, ProfileSample, normalize_placement
from gpuq.sim.workload import WorkloadJob
from gpuq.typemodels import Fitted, bootstrap

Key = tuple[int, int, int]
"""A measured configuration: (nodes, replicas, per-GPU batch)."""

SPEEDUP_THRESHOLD = 1.05
"""An adaptive job switches batch configuration only for a predicted gain above 5%."""

_FITS: dict[tuple[str, str, tuple[ProfileSample, ...]], PerfParams] = {}
"""Fits by application and ordered samples: a pure function, shared by every run."""
_MAX_FITS = 50_000


class FitMemo:
    """One run's fits by application and set of configurations (module docstring)."""

    __slots__ = ("_by_set",)

    def __init__(self) -> None:
        self._by_set: dict[tuple[str, str, frozenset[object]], PerfParams] = {}

    def fit(
        self, app: Application, samples: Mapping[Any, ProfileSample], kind: str = ""
    ) -> PerfParams:
        """`PerfParams` fitted to `samples`, in the first order this run saw their set.

        `kind` names the GPU type the samples come from ("*": every type).
        """
        key = (app.name, kind, frozenset(samples))
        perf = self._by_set.get(key)
        if perf is None:
            perf = _fit_ordered(app.name, kind, tuple(samples.values()))
            self._by_set[key] = perf
        return perf


def _fit_ordered(name: str, kind: str, samples: tuple[ProfileSample, ...]) -> PerfParams:
    key = (name, kind, samples)
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
        "_by_type",
        "_fit_memo",
        "_goodput",
        "_grad_noise",
        "_merged",
        "_rate",
        "_stale",
        "adaptive",
        "allocation",
        "app",
        "apps",
        "attained_service",
        "batch_size",
        "config",
        "delay",
        "epoch",
        "finish_time",
        "gpu_type",
        "id",
        "measured_types",
        "num_restarts",
        "perf",
        "perfs",
        "placement",
        "profiles",
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
        apps: Mapping[str, Application] | None = None,
    ) -> None:
        self.id = job_id
        self._fit_memo = FitMemo() if fits is None else fits
        self.spec = spec
        self.apps: dict[str, Application] = dict(apps) if apps else {app.gpu_type: app}
        """The application's tables on each GPU type of the cluster (one: a one-type cluster)."""
        self.gpu_type = next(iter(self.apps)) if app.gpu_type not in self.apps else app.gpu_type
        """The type the job runs on now, or last ran on (the first type before it ran)."""
        self.app = self.apps[self.gpu_type]
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
        self.profiles: dict[str, dict[Key, ProfileSample]] = {kind: {} for kind in self.apps}
        """Measured configurations per GPU type."""
        self.perf: PerfParams | None = None
        """The model on the current type (what the agent tunes its batch with)."""
        self.perfs: dict[str, PerfParams] = {}
        """The model on each type, measured or bootstrapped (several types only)."""
        self.measured_types: frozenset[str] = frozenset()
        self._merged: PerfParams | None = None
        self._grad_noise = grad_noise
        self._goodput: GoodputFunction | None = None
        self._by_type: dict[str, GoodputFunction] = {}
        self._rate: float | None = None
        self._stale = False

    # ---- what the policy sees -----------------------------------------------------

    @property
    def typed(self) -> bool:
        """True when the cluster has several GPU types."""
        return len(self.apps) > 1

    @property
    def profile(self) -> dict[Key, ProfileSample]:
        """Measured configurations on the current type."""
        return self.profiles[self.gpu_type]

    @profile.setter
    def profile(self, samples: dict[Key, ProfileSample]) -> None:
        self.profiles[self.gpu_type] = samples

    @property
    def replicas(self) -> int:
        """GPUs the job holds now."""
        return sum(self.placement)

    @property
    def max_profiled_gpus(self) -> int:
        """Most GPUs the job has run on, on any type."""
        return max((key[1] for samples in self.profiles.values() for key in samples), default=0)

    @property
    def total_batch(self) -> int:
        """Total batch size of the current configuration (the target when not running)."""
        if self.config is None or not self.placement:
            return self.batch_size
        return self.config.total(self.replicas)

    def _grad(self) -> GradParams:
        grad = self.app.grad_params(self.epoch, self.total_batch)
        if self._grad_noise:
            noise = self._grad_noise[min(self.epoch, len(self._grad_noise) - 1)]
            grad = GradParams(grad.sqr, grad.var * noise)
        return grad

    def goodput(self) -> GoodputFunction | None:
        """The agent's model: fitted step times and this epoch's gradient statistics.

        On a one-type cluster, the model of that type; on several, the
        type-unaware model fitted to every type's measurements together.
        """
        perf = self._merged if self.typed else self.perf
        if perf is None:
            return None
        grad = self._grad()
        cached = self._goodput
        if cached is None or cached.perf is not perf or cached.grad != grad:
            cached = GoodputFunction(perf, grad, self.app.init_batch_size)
            self._goodput = cached
        return cached

    def goodput_on(self, kind: str) -> GoodputFunction | None:
        """The job's model on GPUs of type `kind` (None: nothing known yet)."""
        perf = self.perfs.get(kind) if self.typed else self.perf
        if perf is None:
            return None
        grad = self._grad()
        cached = self._by_type.get(kind)
        if cached is None or cached.perf is not perf or cached.grad != grad:
            cached = GoodputFunction(perf, grad, self.app.init_batch_size)
            self._by_type[kind] = cached
        return cached

    def remaining_iterations(self) -> float:
        """Oracle: iterations at the job's target batch size until completion."""
        return self.app.remaining_iterations(self.batch_size, self.progress)

    # ---- what the simulator does to it ---------------------------------------------

    def reallocate(
        self, allocation: tuple[int, ...], node_types: Sequence[str] | None = None
    ) -> bool:
        """Move the job to `allocation`; True if it pays the restart penalty.

        `node_types` gives each node's GPU type, where the cluster has
        several: the job runs on one type (module docstring).
        """
        if allocation == self.allocation:
            return False
        self.allocation = allocation
        used = allocation
        if node_types is not None and self.typed and any(allocation):
            kind = self._run_type(allocation, node_types)
            used = tuple(a if t == kind else 0 for a, t in zip(allocation, node_types, strict=True))
            self._switch_type(kind)
        self.placement = normalize_placement(used, self.app.node_gpus)
        self._rate = None
        if not self.placement:
            self.config = None
            self.delay = 0.0
            return False
        first = self.start_time is None
        if not first:
            self.num_restarts += 1
        self.delay = self.restart_penalty
        if first and self.typed:
            self._profile_every_type()
        self._choose_config(hysteresis=True)
        return True

    def _run_type(self, allocation: tuple[int, ...], node_types: Sequence[str]) -> str:
        """The type holding most of the allocation's GPUs, ties to the faster one."""
        held: dict[str, int] = {}
        for count, kind in zip(allocation, node_types, strict=True):
            if count:
                held[kind] = held.get(kind, 0) + count
        return max(held, key=lambda kind: (held[kind], self.apps[kind].single_gpu_throughput()))

    def _switch_type(self, kind: str) -> None:
        if kind == self.gpu_type:
            return
        self.gpu_type = kind
        self.app = self.apps[kind]
        self.perf = self.perfs.get(kind)
        self.config = None

    def _profile_every_type(self) -> None:
        """Sia's profile: the single-GPU step times of every type, known from the first start."""
        for kind, app in self.apps.items():
            curve = app.placements.get((1,))
            if curve is None:
                continue
            for bsz in curve.local_bsz:
                key = (1, 1, int(bsz))
                if key not in self.profiles[kind]:
                    self.profiles[kind][key] = app.profile_sample((1,), int(bsz))
        self._stale = True

    def load_profiles(self, profiles: Mapping[str, Mapping[Key, ProfileSample]]) -> None:
        """Take measured configurations per type (a restarted trace job's) and fit them."""
        for kind, samples in profiles.items():
            if kind in self.profiles:
                self.profiles[kind] = dict(samples)
        if self.typed:
            self.perf = self._refit_types()
        else:
            self.perf = self._fit_memo.fit(self.app, self.profile) if self.profile else None

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
        goodput = self.goodput_on(self.gpu_type) if self.typed else self.goodput()
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
                step_time = step + self.config.accum_steps * (step - sync)
                self._rate = gain / (step_time * self.app.slowdown)
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
        if self.typed:
            perf = self._refit_types()
        else:
            perf = self._fit_memo.fit(self.app, self.profile)
        if perf != self.perf:
            self.perf = perf
            if self.adaptive and self.placement and self.finish_time is None:
                self._choose_config(hysteresis=True)

    def _refit_types(self) -> PerfParams | None:
        """Fit each type's samples, bootstrap the rest; the model on the current type."""
        fitted: dict[str, Fitted] = {}
        merged: dict[tuple[str, Key], ProfileSample] = {}
        for kind, samples in self.profiles.items():
            if samples:
                perf = self._fit_memo.fit(self.apps[kind], samples, kind)
                fitted[kind] = Fitted(perf, max(key[1] for key in samples))
                merged.update(((kind, key), sample) for key, sample in samples.items())
        speeds = {kind: app.single_gpu_throughput() for kind, app in self.apps.items()}
        models = bootstrap(fitted, speeds)
        self.perfs = {kind: perf for kind, (perf, _) in models.items()}
        self.measured_types = frozenset(kind for kind, (_, own) in models.items() if own)
        if merged:
            self._merged = self._fit_memo.fit(self.app, merged, "*")
        return self.perfs.get(self.gpu_type)

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
