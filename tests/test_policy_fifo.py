"""The `fifo` policy, rule by rule (see the docstring of gpuq/policies/fifo.py).

Each decision is bound to GPUs as the daemon binds it (`gpuq.daemon.scheduler.binding`),
so the tests read what the daemon would start and why the rest waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpuq.daemon.scheduler.binding import Placement, placements
from gpuq.errors import UsageError
from gpuq.policies.fifo import FifoBackfill, find_reservation, queue_order
from gpuq.policies.interface import ClusterState, GpuView, JobView, NodeView
from gpuq.policies.placement import Capacity, Hold, format_size
from gpuq.policies.registry import POLICY_NAMES, get_policy

G = 1024**3
M = 1024**2
TOLERANCE = 512 * M


def gpu(uuid: str, node: str = "n1", total: int = 40 * G, foreign: int = 0) -> GpuView:
    return GpuView(uuid, node, total, foreign)


def job(
    job_id: int,
    gpus: int = 1,
    mem: int | None = None,
    *,
    priority: int = 0,
    submit: float = 0.0,
    exclusive: bool = False,
    limit: float | None = None,
) -> JobView:
    return JobView(
        job_id,
        submit,
        gpus_requested=gpus,
        priority=priority,
        gpu_mem=mem,
        exclusive=exclusive,
        time_limit=limit,
    )


def running(
    job_id: int,
    *uuids: str,
    mem: int | None = None,
    exclusive: bool = False,
    start: float = 0.0,
    limit: float | None = None,
) -> JobView:
    return JobView(
        job_id,
        start,
        gpus_requested=len(uuids),
        gpu_mem=mem,
        exclusive=exclusive,
        time_limit=limit,
        gpu_uuids=uuids,
        start_time=start,
    )


def cluster(
    gpus: list[GpuView], pending: list[JobView], run: list[JobView] | None = None
) -> ClusterState:
    nodes: dict[str, int] = {}
    for g in gpus:
        nodes[g.node] = nodes.get(g.node, 0) + 1
    jobs = sorted([*pending, *(run or ())], key=lambda j: j.id)
    return ClusterState(
        nodes=tuple(NodeView(name, count) for name, count in nodes.items()),
        jobs=tuple(jobs),
        gpus=tuple(gpus),
        memory_margin=0.05,
        foreign_tolerance=TOLERANCE,
    )


@dataclass(frozen=True)
class Plan:
    """What the daemon starts from a decision, and why each other pending job waits."""

    start: tuple[Placement, ...] = ()
    waiting: dict[int, str] = field(default_factory=dict)


def decide(
    gpus: list[GpuView],
    pending: list[JobView],
    run: list[JobView] | None = None,
    now: float = 0.0,
) -> Plan:
    state = cluster(gpus, pending, run)
    decision = FifoBackfill().decide(state, now)
    for held in run or ():  # no job here may move yet (tests/test_policy_consolidate.py)
        assert decision.bindings[held.id] == held.gpu_uuids
    starts, waiting = placements(state, decision)
    return Plan(tuple(starts), waiting)


def started(plan: Plan) -> dict[int, tuple[str, ...]]:
    return {placement.job_id: placement.gpu_uuids for placement in plan.start}


TWO_GPUS = [gpu("g0"), gpu("g1")]


# Order -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pending", "first"),
    [
        pytest.param([job(1), job(2, priority=5)], 2, id="higher-priority-first"),
        pytest.param([job(1, submit=20.0), job(2, submit=10.0)], 2, id="older-first"),
        pytest.param([job(2, submit=10.0), job(1, submit=10.0)], 1, id="lower-id-breaks-ties"),
        pytest.param(
            [job(1, submit=1.0), job(2, priority=1, submit=9.0)], 2, id="priority-beats-age"
        ),
    ],
)
def test_the_first_in_order_gets_the_only_free_gpu(pending: list[JobView], first: int) -> None:
    plan = decide([gpu("g0")], pending)
    assert started(plan) == {first: ("g0",)}


def test_queue_order_sorts_by_priority_then_submit_time_then_id() -> None:
    jobs = (job(3, submit=5.0), job(1, submit=5.0), job(2, priority=1, submit=9.0), job(4))
    assert [j.id for j in queue_order(jobs)] == [2, 4, 1, 3]


# Shared GPUs -----------------------------------------------------------------


def test_shared_jobs_pack_up_to_capacity_and_never_beyond() -> None:
    # 40G with a 5% margin leaves 38G: three 10G jobs per GPU, six in all.
    plan = decide(TWO_GPUS, [job(i, mem=10 * G) for i in range(1, 11)])
    placed = started(plan)
    assert sorted(placed) == [1, 2, 3, 4, 5, 6]
    assert sorted(uuids for uuids in placed.values()) == [("g0",)] * 3 + [("g1",)] * 3
    assert all(p.gpu_mem == 10 * G for p in plan.start)
    assert plan.waiting == {
        i: "waiting for 10.0G on a shared GPU (largest free 8.0G)" for i in range(7, 11)
    }


def test_shares_already_running_count_against_capacity() -> None:
    plan = decide(TWO_GPUS, [job(1, mem=10 * G)], [running(9, "g0", "g1", mem=30 * G)])
    assert started(plan) == {}
    assert plan.waiting[1] == "waiting for 10.0G on a shared GPU (largest free 8.0G)"


def test_foreign_memory_reduces_what_a_shared_gpu_offers() -> None:
    plan = decide([gpu("g0", foreign=20 * G)], [job(1, mem=10 * G), job(2, mem=10 * G)])
    assert started(plan) == {1: ("g0",)}
    assert plan.waiting[2] == "waiting for 10.0G on a shared GPU (largest free 8.0G)"


def test_shares_are_placed_best_fit() -> None:
    # Free: g0 18G, g1 8G, g2 28G, g3 8G. A 6G job takes the tightest fit,
    # g1 (ties go by view order); a 10G job skips both 8G holes and takes g0.
    gpus = [gpu("g0"), gpu("g1"), gpu("g2"), gpu("g3")]
    run = [
        running(7, "g0", mem=20 * G),
        running(8, "g1", "g3", mem=30 * G),
        running(9, "g2", mem=10 * G),
    ]
    assert started(decide(gpus, [job(1, mem=6 * G)], run)) == {1: ("g1",)}
    assert started(decide(gpus, [job(1, mem=10 * G)], run)) == {1: ("g0",)}


def test_multi_gpu_shares_take_distinct_gpus() -> None:
    plan = decide(TWO_GPUS, [job(1, 2, 30 * G), job(2, 2, 10 * G)])
    assert started(plan) == {1: ("g0", "g1")}
    assert plan.waiting[2] == "waiting for 10.0G on each of 2 shared GPUs (0 have it)"


# Whole GPUs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("foreign", "starts"),
    [(0, True), (TOLERANCE, True), (TOLERANCE + 1, False)],
    ids=["none", "at-tolerance", "above-tolerance"],
)
def test_foreign_memory_above_tolerance_blocks_a_whole_gpu(foreign: int, starts: bool) -> None:
    plan = decide([gpu("g0", foreign=foreign)], [job(1)])
    assert (started(plan) == {1: ("g0",)}) is starts
    if not starts:
        assert plan.waiting[1] == "waiting for 1 free GPU (0 free, 1 used by other processes)"


def test_whole_and_shared_jobs_never_share_a_gpu() -> None:
    plan = decide(
        TWO_GPUS,
        [job(1), job(2, mem=G), job(3)],
        [running(8, "g0", mem=G)],
    )
    # g0 holds a share, so the whole-GPU job takes g1 and the share cannot join it.
    assert started(plan) == {1: ("g1",), 2: ("g0",)}
    assert plan.waiting[3] == "waiting for 1 free GPU (0 free)"


def test_a_running_whole_gpu_job_takes_the_gpu_whatever_memory_is_left() -> None:
    plan = decide([gpu("g0")], [job(1, mem=G)], [running(8, "g0")])
    assert plan.waiting == {1: "waiting for 1.0G on a shared GPU (largest free 0B)"}


def test_multi_gpu_whole_jobs_prefer_one_node() -> None:
    # Node a has one free GPU (listed first), node b two.
    gpus = [gpu("a0", "a"), gpu("a1", "a"), gpu("b0", "b"), gpu("b1", "b")]
    run = [running(9, "a1")]
    assert started(decide(gpus, [job(1, 2)], run)) == {1: ("b0", "b1")}
    # A single GPU goes to the fullest node, keeping node b whole for a 2-GPU job.
    assert started(decide(gpus, [job(1, 1), job(2, 2)], run)) == {1: ("a0",), 2: ("b0", "b1")}


def test_whole_jobs_span_as_few_nodes_as_possible() -> None:
    gpus = [gpu("a0", "a"), gpu("b0", "b"), gpu("b1", "b"), gpu("c0", "c"), gpu("c1", "c")]
    run = [running(9, "c1")]
    assert started(decide(gpus, [job(1, 3)], run)) == {1: ("a0", "b0", "b1")}


# Exclusive -------------------------------------------------------------------


def test_exclusive_share_takes_a_gpu_alone() -> None:
    plan = decide(
        TWO_GPUS,
        [job(1, mem=10 * G, exclusive=True), job(2, mem=10 * G, exclusive=True), job(3, mem=G)],
        [running(8, "g0", mem=G)],
    )
    # g0 already holds a share; job 1 takes g1 alone, so nothing else fits anywhere
    # but job 3 next to the existing share.
    assert started(plan) == {1: ("g1",), 3: ("g0",)}
    assert plan.start[0].gpu_mem == 10 * G
    assert plan.waiting[2] == "waiting for 10.0G on an unshared GPU (largest free 0B)"


def test_exclusive_share_fits_beside_foreign_memory_above_tolerance() -> None:
    gpus = [gpu("g0", foreign=20 * G)]
    assert started(decide(gpus, [job(1, mem=10 * G, exclusive=True)])) == {1: ("g0",)}
    plan = decide(gpus, [job(1, mem=20 * G, exclusive=True)])
    assert plan.waiting[1] == "waiting for 20.0G on an unshared GPU (largest free 18.0G)"


def test_exclusive_whole_gpu_job_obeys_foreign_tolerance() -> None:
    plan = decide([gpu("g0", foreign=G), gpu("g1")], [job(1, exclusive=True)])
    assert started(plan) == {1: ("g1",)}
    assert plan.start[0].gpu_mem is None


def test_a_running_exclusive_job_keeps_shares_off_its_gpu() -> None:
    plan = decide([gpu("g0")], [job(1, mem=G)], [running(8, "g0", mem=G, exclusive=True)])
    assert started(plan) == {}


# Jobs without GPUs, and impossible jobs -------------------------------------


def test_a_job_asking_for_no_gpu_is_left_to_the_caller() -> None:
    # The daemon starts CPU-only jobs itself, as soon as they are ready.
    plan = decide([gpu("g0")], [job(1), job(4, 0)])
    assert started(plan) == {1: ("g0",)}
    assert plan.waiting == {4: "asks for no GPU: the caller starts it"}


@pytest.mark.parametrize(
    ("gpus", "impossible", "reason"),
    [
        pytest.param(TWO_GPUS, job(1, 4), "needs 4 GPUs; this server has 2", id="gpu-count"),
        pytest.param(
            [gpu("a0", "a"), gpu("b0", "b")],
            job(1, 3, G),
            "needs 3 GPUs; the cluster has 2",
            id="gpu-count-cluster",
        ),
        pytest.param(
            TWO_GPUS,
            job(1, mem=39 * G),
            "needs 39.0G on a GPU; the largest offers 38.0G",
            id="memory-after-margin",
        ),
        pytest.param(
            [gpu("g0", total=80 * G), gpu("g1")],
            job(1, 2, 50 * G),
            "needs 50.0G on each of 2 GPUs; 1 offer that",
            id="memory-on-each",
        ),
        pytest.param(
            TWO_GPUS,
            job(1, mem=-1),
            "invalid request: gpu_mem is negative (-1)",
            id="negative-memory",
        ),
    ],
)
def test_impossible_jobs_wait_with_a_clear_reason(
    gpus: list[GpuView], impossible: JobView, reason: str
) -> None:
    plan = decide(gpus, [impossible])
    assert plan == Plan(waiting={1: reason})


def test_an_impossible_job_does_not_hold_up_the_queue() -> None:
    plan = decide([gpu("g0")], [job(1, 4), job(2)])
    assert started(plan) == {2: ("g0",)}


def test_foreign_memory_makes_a_job_wait_not_impossible() -> None:
    plan = decide([gpu("g0", foreign=30 * G)], [job(1, mem=10 * G)])
    assert plan.waiting[1] == "waiting for 10.0G on a shared GPU (largest free 8.0G)"


# Backfill --------------------------------------------------------------------

# g0 runs job 9 until t=100; g1 is free. Job 1 needs both: it is the head, with
# g0 and g1 reserved from t=100.
BUSY_UNTIL_100 = [running(9, "g0", start=0.0, limit=100.0)]


@pytest.mark.parametrize(
    ("limit", "starts"),
    [(None, False), (50.0, True), (60.0, True), (61.0, False)],
    ids=["no-limit", "ends-early", "ends-at-shadow", "ends-after-shadow"],
)
def test_backfill_only_when_the_job_ends_by_the_shadow_time(
    limit: float | None, starts: bool
) -> None:
    plan = decide(TWO_GPUS, [job(1, 2), job(2, limit=limit)], BUSY_UNTIL_100, now=40.0)
    assert plan.waiting[1] == "waiting for 2 free GPUs (1 free)"
    if starts:
        assert started(plan) == {2: ("g1",)}
    else:
        assert started(plan) == {}
        assert plan.waiting[2] == "behind job 1 (reserved GPUs)"


def test_backfill_on_gpus_the_head_does_not_need() -> None:
    # Job 1 needs a whole GPU: g0 empties at t=100 and is reserved; g1's share
    # never ends. An unlimited share must avoid g0, though best-fit alone would
    # pick it (equal free memory, first in view order); a short one may use it.
    run = [running(8, "g0", mem=5 * G, limit=100.0), running(9, "g1", mem=5 * G)]
    plan = decide(TWO_GPUS, [job(1), job(2, mem=5 * G)], run)
    assert started(plan) == {2: ("g1",)}
    plan = decide(TWO_GPUS, [job(1), job(2, mem=5 * G, limit=50.0)], run)
    assert started(plan) == {2: ("g0",)}


def test_no_reservation_when_running_jobs_have_no_time_limit() -> None:
    plan = decide(TWO_GPUS, [job(1, 2), job(2)], [running(9, "g0")])
    assert started(plan) == {2: ("g1",)}
    assert plan.waiting[1] == "waiting for 2 free GPUs (1 free)"


def test_only_the_first_blocked_job_gets_a_reservation() -> None:
    # Job 1 (head) gets g0 at t=100. Job 2 would get g1 at t=200, but it is not
    # the head, so job 3 may take g1's free memory without a time limit.
    run = [running(8, "g0", limit=100.0), running(9, "g1", mem=30 * G, limit=200.0)]
    plan = decide(TWO_GPUS, [job(1), job(2, mem=20 * G), job(3, mem=5 * G)], run)
    assert started(plan) == {3: ("g1",)}
    assert plan.waiting == {
        1: "waiting for 1 free GPU (0 free)",
        2: "waiting for 20.0G on a shared GPU (largest free 8.0G)",
    }


@pytest.mark.parametrize(("limit", "starts"), [(250.0, True), (350.0, False)])
def test_jobs_started_in_the_same_pass_count_toward_the_shadow_time(
    limit: float, starts: bool
) -> None:
    # Jobs 1 and 2 start now (t=1000) on g0 and g1 and end at 1100 and 1300,
    # so job 3, which needs all three GPUs, is reserved them from t=1300.
    gpus = [gpu("g0"), gpu("g1"), gpu("g2")]
    pending = [job(1, limit=100.0), job(2, limit=300.0), job(3, 3), job(4, limit=limit)]
    plan = decide(gpus, pending, now=1000.0)
    assert (4 in started(plan)) is starts
    assert started(plan).keys() >= {1, 2}


def test_find_reservation_reports_the_shadow_time_and_gpus() -> None:
    capacity = Capacity.from_state(cluster(TWO_GPUS, [], BUSY_UNTIL_100))
    endings = [(100.0, 9, Hold(9, (0,)))]
    reservation = find_reservation(capacity, job(1, 2), endings, now=0.0)
    assert reservation is not None
    assert (reservation.shadow_time, reservation.gpus) == (100.0, frozenset({0, 1}))
    # An overdue job is assumed to end now, never in the past.
    late = find_reservation(capacity, job(1, 2), endings, now=150.0)
    assert late is not None
    assert late.shadow_time == 150.0
    assert find_reservation(capacity, job(1, 2), [], now=0.0) is None


# Registry and helpers --------------------------------------------------------


def test_get_policy_returns_fifo_by_name() -> None:
    assert "fifo" in POLICY_NAMES
    policy = get_policy("fifo")
    assert isinstance(policy, FifoBackfill)
    assert policy.name == "fifo"


def test_get_policy_lists_known_names_on_an_unknown_one() -> None:
    with pytest.raises(UsageError, match="unknown policy 'lifo'; known: fifo"):
        get_policy("lifo")


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (0, "0B"),
        (-5, "0B"),
        (900, "900B"),
        (512 * M, "512M"),
        (G, "1.0G"),
        (3 * G + G // 2, "3.5G"),
    ],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text
