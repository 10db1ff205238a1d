"""The policy interface: `decide(state, now) -> Decision`, with declared capabilities.

The papers' policies (Tiresias, Optimus, AFS, Pollux, Gandiva, ONES), gpuq's
own and `fifo` with backfill and memory shares decide how many GPUs each job
holds on each node, and sometimes its batch size or its exact GPUs. They see a `ClusterState`: the
nodes, and every active job (pending or running) with what is known about
it. The simulator (`gpuq.sim`) builds the state from its tables and the
daemon builds it from its store (`gpuq.daemon.scheduler.view`); both run the very
same policy objects.

Conventions, shared by every policy and by both callers:

- An allocation is a tuple with one entry per node of `state.nodes`, in that
  order: the number of GPUs the job holds there. `()` or all zeros: none.
- A `Decision` gives the allocation of every job it wants to run; a job it
  leaves out holds no GPUs (it waits, or is suspended if it was running).
- Allocations may over-subscribe a node only in policies that time-slice
  (Gandiva); the caller then shares the node's GPUs round-robin among its
  jobs. `packed` names groups of jobs that share GPUs at the same time instead.
- A job with a placement constraint (`JobView.nodes`) gets GPUs only on
  its nodes (`gpuq.policies.confine` says how each policy sees to it).
- Time is passed in as `now`, in seconds. Policies are deterministic for a
  given seed, never read the clock, and never mutate the state.
- What a policy needs from its caller is declared in its `capabilities`
  (adaptive jobs, time-slicing, packing, preemption, remaining work, memory
  between decisions), never probed: the simulator and the daemon read it to
  know how to run its decisions, and where they cannot, refuse the policy
  with a reason.
- A policy that remembers (`capabilities.remembers`) and runs in the daemon
  implements `Remembers`: the daemon persists what `save` returns after each
  decision and gives it to `restore` after a restart, so a restart does not
  change its choices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuq.fairshare import Fairness

if TYPE_CHECKING:
    from gpuq.goodput import GoodputFunction


@dataclass(frozen=True, slots=True)
class NodeView:
    """A server (or one GPU type of a mixed server): its name, GPU count and GPU type.

    `gpu_type` is the type of all its GPUs (`gpuq.gputypes`: "A100", "T4");
    empty where the caller does not know it. A policy unaware of types
    ignores it, as Pollux does.
    """

    name: str
    gpus: int
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class TypeModel:
    """What a job's throughput is on GPUs of one type (Sia's per-type estimator).

    `goodput` is the job's goodput model on that type: fitted to what it
    measured there when `measured`, else bootstrapped from its model on
    another type scaled by the two types' single-GPU throughput (Sia 3.1);
    None where nothing is known yet. `local_bsz_bounds` is the per-GPU batch
    range that fits that type's memory.
    """

    goodput: GoodputFunction | None
    local_bsz_bounds: tuple[int, int]
    measured: bool = False


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU of a node, where the caller knows GPUs one by one (the daemon does).

    `memory_foreign` is memory held by processes gpuq did not start; it is
    never available to gpuq jobs. GPUs of a node with the same non-empty
    `link_group` share a PCIe switch or NVLink, so a multi-GPU job placed
    within one group communicates fastest (`gpuq.policies.topology`); empty:
    unknown, the GPU counts as a group of its own. `index` is the number
    users see in `gpuq gpus` (-1: unknown), for reasons.
    """

    uuid: str
    node: str
    memory_total: int
    memory_foreign: int = 0
    link_group: str = ""
    index: int = -1
    server: str = ""
    """The server it is on, where that is not `node` (a server split by GPU type)."""


@dataclass(frozen=True, slots=True)
class JobView:
    """An active job, as a policy sees it.

    Fields about the job's request:
    - `gpus_requested`: the GPU count the user asked for (gang policies run
      the job with exactly this many or not at all);
    - `batch_size`: the user's total batch size (for non-adaptive jobs, the
      only one it runs with); `init_batch_size` is M0, the batch size its
      learning rate was tuned for;
    - `adaptive`: the job runs gpuq's agent, which picks its own batch size
      for whatever GPUs it is given (Pollux); `max_batch_size` and
      `local_bsz_bounds` bound that choice;
    - `max_gpus`: the most GPUs the job can use at all; `min_gpus` the
      fewest it can run on: a policy gives it none or at least that many
      (the daemon: what the user asked for; the simulator: 0, as Pollux's
      jobs run on any count).

    Fields about its history: `allocation` (current GPUs per node),
    `attained_service` (GPU-seconds so far), `run_time` (seconds it held any
    GPU), `num_restarts` (reallocations so far), `max_profiled_gpus` (most
    GPUs it has ever run on).

    Models (None when unknown): `goodput` is the job's fitted throughput and
    gradient-noise model (`gpuq.goodput`); `remaining_iterations` is how many
    more iterations at `batch_size` it needs (exact in the simulator: an
    oracle; estimated in the daemon). `gpu_utilization` (0-100) and
    `memory_peak` (bytes per GPU) are its profile on one exclusive GPU, for
    packing decisions. `step_seconds` is the job's latest measured time per
    iteration while computing (time waiting for a turn left out), and
    `step_shared_with` the jobs that computed on its GPUs at the same time
    throughout that measurement (empty: alone); the daemon measures them
    from the runner's step times, the simulator leaves them None. `epoch`
    counts epochs completed.

    GPU-level fields, set where the caller knows GPUs one by one (the
    daemon): `gpu_mem` is the bytes the job needs on each of its GPUs when it
    asks for memory shares rather than whole GPUs (None: whole GPUs);
    `exclusive` keeps other gpuq jobs off its GPUs; `time_limit` (seconds)
    lets backfill prove a job ends in time; a running job's `gpu_uuids` are
    the GPUs it holds and `start_time` is when its attempt started.

    State the caller carries out for the policy: `suspended` marks a job the
    caller has suspended (its `allocation` is what it still holds: the GPUs
    of a parked or stopped job, none for a checkpointed one); `packed_with`
    names the jobs sharing its GPUs at once; `oom_partners` the jobs beside
    which it ran out of GPU memory when packed (never pack them together
    again); `preemptible` says the caller can take its GPUs without losing
    its work (a checkpointing runner, or everywhere in the simulator);
    `moved_at` is when the caller last began moving it to other GPUs (None:
    never), so a policy does not move a job again before it has run a while
    (`gpuq.policies.consolidate`).

    GPU types (clusters whose `NodeView.gpu_type` differ): `per_type` holds
    the job's model on each type it may run on (`TypeModel`; empty: the
    caller knows no types, and `goodput` is all there is); `goodput` is
    then the type-unaware model, fitted to every measurement whatever the
    type (what Pollux sees). `gpu_type` is the type it runs on now (or last
    ran on; empty: never ran). `restart_penalty` is this job's seconds lost
    per restart where the caller knows it (Sia's per-model cost; None: the
    state's `restart_penalty`).

    Placement constraint: `nodes` names the nodes the job may hold GPUs on
    (None: any; the daemon sets it from `--node`, `--exclude-node` and
    `--label`). Every policy gives a job GPUs only on those nodes
    (`may_run_on`); a running job keeps what it holds. `spread` is how many
    nodes the job's GPUs must be on, the same count on each (None: any
    shape, as the simulator's distributed jobs); the daemon sets 1 for a
    job that is one process, N for a multi-node job (`--nodes N`), and
    never starts a job on another shape (`gpuq.daemon.scheduler.binding`).

    `user` names the job's owner (empty: unknown, or one user); policies
    that share the cluster across users read it with `ClusterState.fair`.
    """

    id: int
    submit_time: float
    gpus_requested: int = 1
    batch_size: int = 0
    init_batch_size: int = 0
    max_batch_size: int = 0
    local_bsz_bounds: tuple[int, int] = (1, 1 << 30)
    adaptive: bool = False
    max_gpus: int = 1 << 30
    min_gpus: int = 0
    priority: int = 0
    name: str = ""
    application: str = ""
    allocation: tuple[int, ...] = ()
    attained_service: float = 0.0
    run_time: float = 0.0
    num_restarts: int = 0
    max_profiled_gpus: int = 0
    epoch: int = 0
    goodput: GoodputFunction | None = None
    remaining_iterations: float | None = None
    gpu_utilization: float | None = None
    memory_peak: int | None = None
    step_seconds: float | None = None
    step_shared_with: tuple[int, ...] = ()
    gpu_mem: int | None = None
    exclusive: bool = False
    time_limit: float | None = None
    gpu_uuids: tuple[str, ...] = ()
    start_time: float = 0.0
    suspended: bool = False
    packed_with: tuple[int, ...] = ()
    oom_partners: tuple[int, ...] = ()
    preemptible: bool = True
    moved_at: float | None = None
    nodes: frozenset[str] | None = None
    spread: int | None = None
    per_type: Mapping[str, TypeModel] = field(default_factory=dict)
    gpu_type: str = ""
    restart_penalty: float | None = None
    user: str = ""

    def may_run_on(self, node: str) -> bool:
        """True if the job may hold GPUs on `node` (its placement constraint allows it)."""
        return self.nodes is None or node in self.nodes

    @property
    def gpus(self) -> int:
        """GPUs the job holds now, over all nodes."""
        return sum(self.allocation)

    @property
    def running(self) -> bool:
        """True if the job holds any GPU."""
        return self.gpus > 0


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Everything a policy may use: nodes, active jobs, and the tick length.

    `jobs` holds pending and running jobs in id order. `interval` is the time
    until the next decision (the simulator's tick); `restart_penalty` is the
    seconds of progress a job loses per reallocation (Pollux's delta).
    `gpu_memory` is each GPU's memory in bytes (for packing), if known.

    `gpus` lists every GPU one by one, in node order, where the caller knows
    them (the daemon; empty in the simulator). `memory_margin` is the
    fraction of each GPU's memory never handed out as shares (a margin
    against allocator overshoot); `foreign_tolerance` is how many bytes of
    other users' memory a GPU may hold and still count as free.

    `fair` is the users' fair share (`gpuq.fairshare.Fairness`: shares,
    decayed usage, factors, per-user limits) where the caller shares the
    cluster across users (lab mode, or a simulated workload with users);
    None: no such sharing, and every policy decides as it always did.
    """

    nodes: tuple[NodeView, ...]
    jobs: tuple[JobView, ...]
    interval: float = 60.0
    restart_penalty: float = 30.0
    gpu_memory: int | None = None
    gpus: tuple[GpuView, ...] = ()
    memory_margin: float = 0.05
    foreign_tolerance: int = 512 * 1024**2
    fair: Fairness | None = None

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return sum(n.gpus for n in self.nodes)

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """The GPU types of the nodes, in node order, once each (empty types left out)."""
        return tuple(dict.fromkeys(n.gpu_type for n in self.nodes if n.gpu_type))


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer for this instant.

    `allocations`: GPUs per node for every job that should hold GPUs.
    `batch_sizes`: total batch size the policy chooses for a job (ONES); jobs
    not named keep their own (adaptive jobs choose for themselves).
    `packed`: groups of job ids that share the same GPUs at once (Gandiva
    packing), rather than being time-sliced.
    `bindings`: the exact GPUs (UUIDs of `state.gpus`) for a job, where the
    policy chooses them itself (memory shares, backfill, a running job moved
    to other GPUs of its node); the caller binds every other allocation to
    GPUs of the right nodes, and restarts a moved job on exactly its binding.
    `suspend_modes`: how to suspend a job the decision leaves out or moves
    ("park", "checkpoint" or "stop"), where the policy cares; the caller
    picks otherwise.
    `notes`: a short reason per job, for `gpuq show` and debugging: why it
    waits, or why it is started, suspended, resized, moved, packed or
    unpacked (`gpuq.policies.actions` turns a decision into those actions).
    """

    allocations: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    batch_sizes: Mapping[int, int] = field(default_factory=dict)
    packed: tuple[tuple[int, ...], ...] = ()
    bindings: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    suspend_modes: Mapping[int, str] = field(default_factory=dict)
    notes: Mapping[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a policy needs from whoever runs its decisions.

    - `adaptive_jobs`: jobs pick their own batch size for the GPUs they are
      given (Pollux), so the caller runs them adaptively;
    - `time_slicing`: allocations may over-subscribe a node, and the caller
      shares its GPUs among those jobs in turns (Gandiva);
    - `packing`: `Decision.packed` puts jobs on the same GPUs at once;
    - `preemption`: a running job may lose, change or move its GPUs, so the
      caller must be able to suspend, resize and move jobs;
    - `remaining_work`: the policy reads `JobView.remaining_iterations`,
      exact in the simulator (an oracle) and an estimate where it runs live;
    - `remembers`: the policy keeps state between decisions that changes its
      choices (a search's last population, a packing book, service clocks);
      where it runs in the daemon it implements `Remembers`;
    - `quantum`: with `time_slicing`, the seconds of each turn on a shared GPU;
    - `multi_node`: the policy places jobs whose `JobView.spread` is above 1
      (a part's GPUs on each of that many nodes); the daemon refuses
      `--nodes N` jobs under a policy that does not;
    - `fair_share`: the policy reads `ClusterState.fair`: it orders waiting
      jobs by the users' fair share and applies the per-user limits
      (`gpuq.policies.fairness`); a lab daemon refuses a policy that does
      not, whose decisions would ignore the lab's shares and its limits.
    """

    adaptive_jobs: bool = False
    time_slicing: bool = False
    packing: bool = False
    preemption: bool = False
    remaining_work: bool = False
    remembers: bool = False
    quantum: float = 60.0
    multi_node: bool = False
    fair_share: bool = False


class Policy(Protocol):
    """A cluster-wide policy: a pure function of the state and the time."""

    name: str
    capabilities: Capabilities

    def decide(self, state: ClusterState, now: float) -> Decision:
        """Return the allocations for this instant; must not mutate `state`."""
        ...


@runtime_checkable
class Remembers(Protocol):
    """A policy whose memory between decisions can be saved and restored.

    `save()` returns JSON-ready data (dicts, lists, strings, numbers, bools,
    None); `restore(saved)` on a fresh policy built with the same options
    makes it decide from then on exactly as the saved one would have. Data
    it does not recognise (another version's) raises ValueError, and the
    caller starts the policy afresh.
    """

    def save(self) -> dict[str, Any]:
        """The policy's memory, JSON-ready."""
        ...

    def restore(self, saved: Mapping[str, Any]) -> None:
        """Take up the memory `save` returned (ValueError if it cannot)."""
        ...


def capacity_violations(state: ClusterState, decision: Decision) -> list[str]:
    """Every way `decision` over-commits a node (empty when it fits).

    Time-slicing policies may over-subscribe on purpose; every other policy
    must return a decision for which this is empty (a property test checks).
    """
    problems = []
    used = [0] * len(state.nodes)
    known = {job.id for job in state.jobs}
    for job_id, allocation in decision.allocations.items():
        if job_id not in known:
            problems.append(f"job {job_id} is not in the state")
        if allocation and len(allocation) != len(state.nodes):
            problems.append(f"job {job_id}: allocation has {len(allocation)} entries")
            continue
        for i, count in enumerate(allocation):
            if count < 0:
                problems.append(f"job {job_id}: negative GPUs on node {i}")
            used[i] += count
    for node, count in zip(state.nodes, used, strict=True):
        if count > node.gpus:
            problems.append(f"node {node.name}: {count} GPUs allocated of {node.gpus}")
    return problems
