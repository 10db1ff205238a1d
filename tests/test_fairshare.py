"""Fair share across users, rule by rule (`gpuq.fairshare`, `gpuq.policies.fairness`).

Decayed usage, Slurm's fair-share factor, aging, the per-user limits, the
max-min budgets, and how `fifo` and `gpuq` use them; then the daemon's
accounting (`gpuq.daemon.scheduler.usage`) on a stand-in daemon state.
The simulator's acceptance runs are in tests/test_sim_fairshare.py.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.config import LabConfig
from gpuq.daemon.scheduler import usage
from gpuq.daemon.state import DaemonState
from gpuq.fairshare import (
    DEFAULT_AGING,
    FORGET_BELOW,
    Fairness,
    FairShare,
    UserShare,
    accrued,
    decayed,
    effective_priority,
    fair_share_factor,
    limit_reason,
    queued_limit_reason,
    turn_shares,
)
from gpuq.models import JobState
from gpuq.policies.fairness import budgets, ranks
from gpuq.policies.fifo import FifoBackfill, queue_order
from gpuq.policies.gpuq.policy import GpuqPolicy
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView
from gpuq.policies.registry import LIVE_POLICY_NAMES, get_policy
from tests.test_policy_pollux import LINEAR

DAY = 86400.0
HOUR = 3600.0
G = 1024**3
NOW = 10 * HOUR

# ---- decayed usage ------------------------------------------------------------------


@pytest.mark.parametrize(("elapsed", "left"), [(0.0, 1.0), (DAY, 0.5), (2 * DAY, 0.25)])
def test_usage_halves_every_half_life(elapsed: float, left: float) -> None:
    assert decayed(1000.0, elapsed, DAY) == pytest.approx(1000.0 * left)


def test_a_gpu_second_just_used_counts_one_and_a_long_run_counts_less() -> None:
    assert accrued(1.0, 1.0, DAY) == pytest.approx(1.0, rel=1e-5)
    assert accrued(4.0, 60.0, DAY) == pytest.approx(240.0, rel=1e-3)
    # A GPU held for a whole half-life counts what it would at a constant
    # decay: h / ln 2 * (1 - 1/2), less than the h GPU-seconds it held.
    assert accrued(1.0, DAY, DAY) == pytest.approx(DAY / (2 * math.log(2)))
    assert accrued(0.0, 60.0, DAY) == accrued(2.0, 0.0, DAY) == 0.0


@given(st.lists(st.floats(1.0, 5000.0), min_size=1, max_size=20))
def test_usage_does_not_depend_on_how_often_it_is_updated(steps: list[float]) -> None:
    often, once = FairShare(DAY), FairShare(DAY)
    now = 0.0
    for step in steps:
        now += step
        often.record("alice", 2.0, step, now)
    once.record("alice", 2.0, now, now)
    assert often.usage["alice"] == pytest.approx(once.usage["alice"], rel=1e-9)


def test_holding_charges_the_time_since_the_last_update() -> None:
    account = FairShare(DAY, {}, 100.0)
    account.hold({"alice": 2.0, "bob": 1.0}, 160.0)
    assert account.usage["alice"] == pytest.approx(120.0, rel=1e-3)
    assert account.usage["bob"] == pytest.approx(60.0, rel=1e-3)
    account.hold({"alice": 2.0}, 160.0)  # no time passed: nothing more
    assert account.usage["alice"] == pytest.approx(120.0, rel=1e-3)


def test_stored_usage_is_decayed_to_now_and_tiny_usage_forgotten() -> None:
    records = {"alice": (1000.0, 0.0), "bob": (FORGET_BELOW * 1.5, 0.0)}
    account = FairShare.from_records(records, DAY, DAY)
    assert account.usage == {"alice": pytest.approx(500.0)}
    assert account.updated == DAY


def test_half_life_must_be_positive() -> None:
    with pytest.raises(ValueError, match="half_life"):
        FairShare(0.0)


# ---- Slurm's fair-share factor --------------------------------------------------------


@pytest.mark.parametrize(
    ("usage_norm", "share_norm", "factor"),
    [(0.0, 0.5, 1.0), (0.5, 0.5, 0.5), (1.0, 0.5, 0.25), (0.25, 0.5, 2**-0.5), (0.3, 0.0, 0.0)],
)
def test_factor_is_two_to_the_minus_usage_over_share(
    usage_norm: float, share_norm: float, factor: float
) -> None:
    assert fair_share_factor(usage_norm, share_norm) == pytest.approx(factor)


def test_standings_normalize_usage_and_shares_over_the_users_known() -> None:
    account = FairShare(DAY, {"alice": 300.0, "bob": 100.0}, 0.0)
    shares = {"alice": 3.0, "bob": 1.0, "carol": 4.0}.get
    standing = account.standings(["alice", "bob"], lambda user: shares(user) or 1.0)
    # carol neither used GPUs nor waits: she does not dilute the others' shares.
    assert set(standing) == {"alice", "bob"}
    assert standing["alice"].share_norm == pytest.approx(0.75)
    assert standing["alice"].usage_norm == pytest.approx(0.75)
    assert standing["alice"].factor == pytest.approx(0.5)  # exactly its share
    assert standing["bob"].factor == pytest.approx(0.5)
    fresh = account.standings(["alice", "bob", "dave"], lambda user: 1.0)
    assert fresh["dave"].factor == 1.0  # no usage: the highest factor
    assert fresh["alice"].factor < fresh["bob"].factor < fresh["dave"].factor


def test_nobody_used_anything_so_everyone_has_factor_one() -> None:
    standing = FairShare(DAY).standings(["alice", "bob"], lambda user: 1.0)
    assert [s.factor for s in standing.values()] == [1.0, 1.0]


# ---- aging -----------------------------------------------------------------------------


def test_aging_adds_one_per_aging_period_waited() -> None:
    assert effective_priority(0.25, 0.0) == 0.25
    assert effective_priority(0.25, DEFAULT_AGING) == pytest.approx(1.25)
    assert effective_priority(0.25, 3 * HOUR, aging=HOUR) == pytest.approx(3.25)
    assert effective_priority(0.5, -10.0) == 0.5


@given(
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
    st.floats(0.0, 10 * DAY),
    st.floats(1.0, 10 * DAY),
    st.floats(0.0, 10 * DAY),
)
def test_a_job_submitted_more_than_one_aging_period_later_never_ranks_first(
    factor_old: float, factor_new: float, submitted: float, later: float, waited: float
) -> None:
    newer = submitted + DEFAULT_AGING + later
    now = newer + waited
    old = effective_priority(factor_old, now - submitted)
    new = effective_priority(factor_new, now - newer)
    assert old > new


# ---- per-user limits -------------------------------------------------------------------


def test_limits_name_the_user_and_the_limit() -> None:
    assert limit_reason("alice", 6, 2, 4, max_gpus=8) == "user alice at max_gpus 8 (holds 6)"
    assert limit_reason("alice", 4, 2, 4, max_gpus=8) is None
    assert limit_reason("bob", 0, 3, 1, max_running=3) == "user bob at max_running 3 (3 running)"
    assert limit_reason("bob", 100, 100, 8) is None  # 0: no limit
    assert queued_limit_reason("carol", 5, 5) == (
        "carol has 5 job(s) waiting; 1 more would pass the lab's limit of 5 (max_queued)"
    )
    assert queued_limit_reason("carol", 4, 5) is None
    assert queued_limit_reason("carol", 3, 5, adding=3) is not None  # an array counts whole
    assert queued_limit_reason("carol", 3, 5, adding=2) is None
    assert queued_limit_reason("carol", 400, 0) is None


# ---- max-min budgets -------------------------------------------------------------------


def test_a_user_wanting_less_than_its_share_gets_all_it_wants() -> None:
    assert budgets({"heavy": 40, "light": 3}, {"heavy": 1, "light": 1}, 16) == {
        "heavy": 13,
        "light": 3,
    }


def test_users_wanting_more_split_by_their_shares() -> None:
    assert budgets({"a": 40, "b": 40}, {"a": 1, "b": 1}, 16) == {"a": 8, "b": 8}
    assert budgets({"a": 40, "b": 40}, {"a": 3, "b": 1}, 16) == {"a": 12, "b": 4}
    three = budgets({"a": 40, "b": 40, "c": 2}, {"a": 2, "b": 1, "c": 1}, 16)
    assert three == {"a": 9, "b": 5, "c": 2}


def test_demands_that_fit_are_all_met() -> None:
    assert budgets({"a": 5, "b": 3}, {"a": 1, "b": 1}, 16) == {"a": 5, "b": 3}


def test_remainders_go_to_the_higher_fair_share_factor() -> None:
    demand, shares = {"a": 9, "b": 9}, {"a": 1.0, "b": 1.0}
    assert budgets(demand, shares, 7, {"a": 0.2, "b": 0.9}) == {"a": 3, "b": 4}
    assert budgets(demand, shares, 7, {"a": 0.9, "b": 0.2}) == {"a": 4, "b": 3}


@given(
    st.dictionaries(st.sampled_from("abcde"), st.integers(0, 40), min_size=1),
    st.dictionaries(st.sampled_from("abcde"), st.floats(0.1, 10.0)),
    st.integers(0, 64),
)
def test_budgets_are_max_min_fair(
    demands: dict[str, int], shares: dict[str, float], total: int
) -> None:
    given_ = budgets(demands, shares, total)
    assert all(0 <= given_[u] <= demands[u] for u in demands)
    assert sum(given_.values()) == min(total, sum(demands.values()))
    # Max-min: a user short of its demand holds at least the share-weighted
    # level of every other user, within a GPU each way (whole GPUs).
    for u in demands:
        if given_[u] < demands[u]:
            for v in demands:
                level = (given_[v] - 1) / shares.get(v, 1.0) * shares.get(u, 1.0)
                assert given_[u] + 1 >= level - 1e-9


# ---- queue order -----------------------------------------------------------------------


def job(job_id: int, user: str, submit: float, gpus: int = 1, **fields: Any) -> JobView:
    base = JobView(job_id, submit, gpus_requested=gpus, min_gpus=gpus, max_gpus=gpus, user=user)
    return replace(base, **fields)


def fair(**factors: float) -> Fairness:
    return Fairness({user: UserShare(factor=factor) for user, factor in factors.items()})


def lab(*jobs: JobView, count: int = 2, standing: Fairness | None = None) -> ClusterState:
    gpus = tuple(GpuView(f"GPU-{i}", "n1", 40 * G, index=i) for i in range(count))
    return ClusterState(
        nodes=(NodeView("n1", count),),
        jobs=tuple(sorted(jobs, key=lambda j: j.id)),
        gpus=gpus,
        fair=standing,
    )


def test_the_user_furthest_below_its_share_goes_first_then_first_come() -> None:
    jobs = [job(1, "heavy", 0.0), job(2, "heavy", 10.0), job(3, "light", 20.0)]
    state = lab(*jobs, standing=fair(heavy=0.25, light=0.9))
    assert [j.id for j in queue_order(jobs, ranks(state, 100.0))] == [3, 1, 2]
    assert [j.id for j in queue_order(jobs)] == [1, 2, 3]  # no fair share: as before


def test_a_job_waiting_long_enough_goes_first_whoever_owns_it() -> None:
    jobs = [job(1, "heavy", 0.0), job(2, "light", DAY)]
    state = lab(*jobs, standing=fair(heavy=0.25, light=1.0))
    assert [j.id for j in queue_order(jobs, ranks(state, DAY + 60.0))] == [1, 2]


def test_priority_classes_stay_strict_over_fair_share() -> None:
    jobs = [job(1, "light", 0.0), job(2, "heavy", 10.0, priority=5)]
    state = lab(*jobs, standing=fair(heavy=0.1, light=1.0))
    assert [j.id for j in queue_order(jobs, ranks(state, 60.0))] == [2, 1]


def test_one_user_or_no_fair_share_ranks_nothing() -> None:
    jobs = [job(1, "alice", 0.0), job(2, "alice", 10.0)]
    assert ranks(lab(*jobs, standing=fair(alice=0.3)), 60.0) == {}
    assert ranks(lab(job(1, "a", 0.0), job(2, "b", 0.0)), 60.0) == {}


# ---- the policies ----------------------------------------------------------------------


def started(decision: Decision) -> list[int]:
    return sorted(decision.allocations)


@pytest.mark.parametrize("policy", [FifoBackfill(), GpuqPolicy(population=16, generations=10)])
def test_a_job_of_a_user_at_max_gpus_waits_with_the_reason(policy: Any) -> None:
    running = job(1, "alice", 0.0, 2, gpu_uuids=("GPU-0", "GPU-1"), allocation=(2,))
    waiting = [job(2, "alice", 10.0), job(3, "bob", 20.0)]
    standing = replace(fair(alice=0.5, bob=0.5), max_gpus=2)
    decision = policy.decide(lab(running, *waiting, count=4, standing=standing), NOW)
    assert 2 not in decision.allocations
    assert decision.notes[2] == "user alice at max_gpus 2 (holds 2)"
    assert 3 in decision.allocations


@pytest.mark.parametrize("policy", [FifoBackfill(), GpuqPolicy(population=16, generations=10)])
def test_a_user_at_max_running_starts_no_more_jobs(policy: Any) -> None:
    waiting = [job(1, "alice", 0.0), job(2, "alice", 1.0), job(3, "alice", 2.0), job(4, "bob", 3.0)]
    standing = replace(fair(alice=0.5, bob=0.5), max_running=2)
    decision = policy.decide(lab(*waiting, count=4, standing=standing), NOW)
    assert started(decision) == [1, 2, 4]
    assert decision.notes[3] == "user alice at max_running 2 (2 running)"


def test_the_policies_declaring_fair_share_are_the_two_tested_to_apply_it() -> None:
    # A lab daemon refuses the others (gpuq.policies.registry.check_lab_policy): a policy
    # that declares fair_share must pass the limit tests above, so add it to them.
    declared = {name for name in LIVE_POLICY_NAMES if get_policy(name).capabilities.fair_share}
    assert declared == {"fifo", "gpuq"}


def test_rigid_jobs_start_in_fair_share_order() -> None:
    waiting = [job(1, "heavy", 0.0), job(2, "heavy", 1.0), job(3, "light", 2.0)]
    policy = GpuqPolicy(timeslice="off")
    decision = policy.decide(lab(*waiting, standing=fair(heavy=0.2, light=0.8)), NOW)
    assert started(decision) == [1, 3]
    assert decision.notes[2].startswith("waiting for 1 free GPU")


def elastic(job_id: int, user: str, **fields: Any) -> JobView:
    """A simulator-style job: runs on any count up to 8, scales linearly."""
    base = JobView(
        job_id,
        0.0,
        adaptive=True,
        max_gpus=8,
        goodput=LINEAR,
        init_batch_size=64,
        max_batch_size=64 * 64,
        local_bsz_bounds=(1, 64),
        max_profiled_gpus=8,
        user=user,
    )
    return replace(base, **fields)


def sized(decision: Decision, jobs: list[JobView]) -> dict[str, int]:
    held: dict[str, int] = {}
    for one in jobs:
        held[one.user] = held.get(one.user, 0) + sum(decision.allocations.get(one.id, ()))
    return held


@pytest.mark.parametrize(
    ("shares", "light_jobs", "expected"),
    [
        ({}, 4, {"heavy": 8, "light": 8}),  # both want more than half: the shares
        ({"light": 3.0}, 4, {"heavy": 4, "light": 12}),
        ({}, 1, {"heavy": 8, "light": 8}),  # one light job can use 8 GPUs
    ],
)
def test_the_goodput_search_splits_gpus_by_share_whatever_the_job_counts(
    shares: dict[str, float], light_jobs: int, expected: dict[str, int]
) -> None:
    """Twelve heavy jobs against a few light ones: budgets split by user, not by job."""
    jobs = [elastic(i, "heavy") for i in range(12)]
    jobs += [elastic(100 + i, "light") for i in range(light_jobs)]
    standing = Fairness(
        {user: UserShare(share=shares.get(user, 1.0)) for user in ("heavy", "light")}
    )
    state = ClusterState(nodes=(NodeView("n1", 8), NodeView("n2", 8)), jobs=tuple(jobs))
    policy = GpuqPolicy(population=30, generations=20)
    assert sized(policy.decide(replace(state, fair=standing), NOW), jobs) == expected
    unfair = sized(GpuqPolicy(population=30, generations=20).decide(state, NOW), jobs)
    assert unfair["heavy"] > expected["heavy"]  # Pollux alone: fair per job, not per user


def test_one_user_decides_exactly_as_without_fair_share() -> None:
    jobs = [elastic(i, "alice", submit_time=float(i)) for i in range(6)]
    state = ClusterState(nodes=(NodeView("n1", 4), NodeView("n2", 4)), jobs=tuple(jobs))
    standing = Fairness({"alice": UserShare(factor=0.3)})
    with_fair = GpuqPolicy(seed=3, population=30, generations=20).decide(
        replace(state, fair=standing), NOW
    )
    without = GpuqPolicy(seed=3, population=30, generations=20).decide(state, NOW)
    assert with_fair == without


# ---- the daemon's accounting ---------------------------------------------------------


@dataclass
class _Store:
    records: dict[str, tuple[float, float]] = field(default_factory=dict)
    saves: int = 0

    def user_usage(self) -> dict[str, tuple[float, float]]:
        return dict(self.records)

    def save_user_usage(self, usage_: dict[str, float], now: float) -> None:
        self.records = {user: (value, now) for user, value in usage_.items()}
        self.saves += 1


@dataclass
class _Config:
    lab: LabConfig


@dataclass(frozen=True)
class _Spec:
    user: str


@dataclass(frozen=True)
class _Job:
    id: int
    spec: _Spec
    state: JobState
    gpu_uuids: tuple[str, ...] = ()
    submit_time: float = 0.0


class _Daemon:
    """The few parts of `DaemonState` the accounting reads."""

    def __init__(self, jobs: list[_Job], store: _Store) -> None:
        self.config = _Config(LabConfig(enabled=True, half_life=DAY, shares=(("bob", 3.0),)))
        self.store = store
        self.active = {j.id: j for j in jobs}
        self.fair_ledger: usage.Ledger | None = None


def test_the_daemon_charges_holders_persists_and_shows_the_policy() -> None:
    store = _Store({"alice": (1000.0, 0.0)})
    jobs = [
        _Job(1, _Spec("alice"), JobState.RUNNING, ("GPU-0", "GPU-1")),
        _Job(2, _Spec("bob"), JobState.QUEUED, submit_time=0.0),
        _Job(3, _Spec("carol"), JobState.SUSPENDED, ("GPU-2",)),  # suspended: not charged
    ]
    daemon = cast(DaemonState, _Daemon(jobs, store))
    cluster = usage.fair_view(daemon, ClusterState(nodes=(), jobs=()), DAY)
    assert cluster.fair is not None
    assert cluster.fair.of("alice").usage == pytest.approx(500.0)  # decayed from the store
    assert cluster.fair.of("bob").share == 3.0
    assert store.saves == 0  # just loaded
    usage.fair_view(daemon, cluster, DAY + 60.0)
    assert usage.ledger(daemon, DAY + 60.0).account.usage["alice"] == pytest.approx(
        500.0 * 2 ** (-60 / DAY) + 120.0, rel=1e-4
    )
    assert "carol" not in usage.ledger(daemon, DAY + 60.0).account.usage
    assert store.saves == 1  # a minute later: saved
    assert store.records["alice"][1] == DAY + 60.0
    rows = usage.share_rows(daemon, DAY + 60.0)
    assert [row["user"] for row in rows] == ["alice", "bob", "carol"]
    bob = rows[1]
    assert bob["factor"] == 1.0 and bob["priority"] == pytest.approx(1.0 + (DAY + 60.0) / DAY)
    assert rows[0]["priority"] is None


# ---- preemption for fair share -----------------------------------------------------------


def holding(job_id: int, user: str, gpu: int, started: float, **fields: Any) -> JobView:
    """A running one-GPU runner job of `user` on GPU `gpu`, started at `started`."""
    return job(
        job_id,
        user,
        started,
        gpu_uuids=(f"GPU-{gpu}",),
        allocation=(1,),
        start_time=started,
        preemptible=True,
        **fields,
    )


def test_a_user_under_its_share_preempts_the_newest_runner_job_of_one_over_it() -> None:
    heavy = [holding(i, "heavy", i - 1, NOW - 1000.0 + i) for i in range(1, 5)]
    state = lab(*heavy, job(5, "light", NOW - 5.0), count=4, standing=fair(heavy=0.5, light=0.5))
    decision = GpuqPolicy(timeslice="off").decide(state, NOW)
    assert 4 not in decision.allocations  # the most recently started: the least work to redo
    assert decision.notes[4] == (
        "preempted for job 5 (fair share: light holds 0 of 1 GPUs, heavy 4 of 3)"
    )
    assert all(decision.allocations.get(i) == (1,) for i in (1, 2, 3))


def test_fair_share_preempts_only_after_the_grace_period_and_only_runner_jobs() -> None:
    fresh = [holding(i, "heavy", i - 1, NOW - 100.0) for i in range(1, 5)]
    state = lab(*fresh, job(5, "light", NOW - 5.0), count=4, standing=fair(heavy=0.5, light=0.5))
    assert sorted(GpuqPolicy(timeslice="off").decide(state, NOW).allocations) == [1, 2, 3, 4]
    later = GpuqPolicy(timeslice="off", fair_grace=60.0).decide(state, NOW)
    assert sorted(later.allocations) == [1, 2, 3, 5]
    assert later.notes[4].startswith("preempted for job 5 (fair share")
    plain = [replace(job, preemptible=False) for job in fresh]
    state = lab(*plain, job(5, "light", NOW - 5.0), count=4, standing=fair(heavy=0.5, light=0.5))
    assert sorted(GpuqPolicy(fair_grace=0.0, timeslice="off").decide(state, NOW).allocations) == [
        1,
        2,
        3,
        4,
    ]


def test_a_user_at_its_share_preempts_nobody() -> None:
    heavy = [holding(i, "heavy", i - 1, NOW - 1000.0) for i in (1, 2)]
    light = [holding(i, "light", i - 1, NOW - 1000.0) for i in (3, 4)]
    state = lab(
        *heavy, *light, job(5, "light", NOW - 5.0), job(6, "heavy", NOW - 5.0),
        count=4, standing=fair(heavy=0.5, light=0.5),
    )  # fmt: skip
    decision = GpuqPolicy(timeslice="off").decide(state, NOW)
    assert sorted(decision.allocations) == [1, 2, 3, 4]


# ---- turns on an over-subscribed node -------------------------------------------------


def shared(**shares: float) -> Fairness:
    return Fairness({user: UserShare(share=share) for user, share in shares.items()})


def test_without_shares_each_job_is_owed_the_gpus_over_what_they_ask() -> None:
    members = {1: ("alice", 2), 2: ("bob", 1), 3: ("bob", 3)}
    assert turn_shares(4, members, None) == dict.fromkeys(members, 4 / 6)
    assert turn_shares(6, members, shared(alice=5.0)) == dict.fromkeys(members, 1.0)  # room for all
    assert turn_shares(4, {1: ("alice", 2), 2: ("alice", 4)}, shared(alice=5.0)) == {
        1: 4 / 6,
        2: 4 / 6,
    }


@pytest.mark.parametrize(
    ("shares", "bob", "alices"),
    [((1.0, 1.0), 1.0, 3 / 5), ((5.0, 1.0), 4 / 6, 4 / 6), ((1.0, 3.0), 1.0, 3 / 5)],
)
def test_several_users_jobs_take_turns_by_their_owners_shares(
    shares: tuple[float, float], bob: float, alices: float
) -> None:
    """Alice's five one-GPU jobs and bob's one on four GPUs (the slicer's test, by the rule).

    Bob's half of the node is two GPUs, more than his one job can use: it
    computes all the time and the rest goes to alice's five.
    """
    members = {i: ("alice", 1) for i in range(1, 6)} | {6: ("bob", 1)}
    parts = turn_shares(4, members, shared(alice=shares[0], bob=shares[1]))
    assert parts[6] == pytest.approx(bob)
    assert [parts[i] for i in range(1, 6)] == pytest.approx([alices] * 5)


@given(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 8)), min_size=1, max_size=12),
    st.integers(1, 16),
    st.tuples(*[st.floats(0.1, 10.0)] * 3),
)
def test_turns_fill_the_node_never_give_more_than_all_and_follow_the_weights(
    jobs: list[tuple[str, int]], gpus: int, shares: tuple[float, float, float]
) -> None:
    members = dict(enumerate(jobs))
    fair = shared(a=shares[0], b=shares[1], c=shares[2])
    parts = turn_shares(gpus, members, fair)
    assert all(0.0 <= part <= 1.0 + 1e-12 for part in parts.values())
    used = sum(parts[j] * size for j, (_, size) in members.items())
    assert used == pytest.approx(min(gpus, sum(size for _, size in jobs)))
    # Where neither is held back by its GPUs' limit, parts go as the owners' weights.
    asked = {user: sum(s for u, s in jobs if u == user) for user, _ in jobs}
    weight = {j: fair.of(user).share / asked[user] for j, (user, _) in members.items()}
    if len(asked) < 2:
        weight = dict.fromkeys(members, 1.0)
    free = [j for j in members if parts[j] < 1.0 - 1e-9]
    for j, k in itertools.pairwise(free):
        assert parts[j] / parts[k] == pytest.approx(weight[j] / weight[k])
