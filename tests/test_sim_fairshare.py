"""Fair share in the simulator: users in workloads, the accounting, and the acceptance runs.

The acceptance (two users, one submitting ten times the work of the other,
on a busy cluster, `gpuq` policy, 60 s ticks), as two precise criteria:

1. Max-min, when the light user asks for less than its share (jobs
   arriving over a day, `lab:0` thinned): whenever a light job waits, the
   light user holds at least 90% of its share on average; whenever any
   job waits, at least 90% of the GPUs are held (no budget keeps GPUs idle);
   and the light user's average JCT is within 1.5x of its average JCT alone
   on half the cluster (simulated too). Without fair share it is not.
2. Shares, when both users want more than their share (every job submitted
   at once): over the ticks in which both users have a job waiting (the
   window; an hour or more here), and over its first half hour, each
   user's GPU-time share is within 10% of its configured share (relative:
   |measured / configured - 1| <= 0.1), for shares 1:1 and 3:1.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuq.fairshare import FairShare
from gpuq.policies.interface import Decision
from gpuq.policies.registry import get_policy
from gpuq.sim import SimLab, Simulator, WorkloadJob, assign_users, copies_for_users
from gpuq.sim.fair import UserTick, all_backlogged, gpu_time_shares, max_min_shares
from gpuq.sim.metrics import SimResult
from gpuq.sim.workload import lab_workload, load_workload, write_workload
from tests.test_sim_engine import SMALL, Fifo, Scripted, job, solo_seconds

# ---- workloads with users -----------------------------------------------------------


def test_copies_give_each_user_its_multiple_of_the_same_jobs() -> None:
    work = copies_for_users(tuple(SMALL), {"heavy": 10, "light": 1})
    heavy = [job for job in work if job.user == "heavy"]
    light = [job for job in work if job.user == "light"]
    assert len(heavy) == 10 * len(light) == 10 * len(SMALL)
    assert sorted(j.application for j in heavy) == sorted(j.application for j in SMALL * 10)
    assert [job.time for job in work] == sorted(job.time for job in work)
    assert heavy[0].name == "cifar10-0-heavy-0"


def test_assigned_users_are_seeded_and_follow_the_weights() -> None:
    jobs = lab_workload(0, load=10.0)
    first = assign_users(jobs, {"heavy": 10, "light": 1}, seed=1)
    assert first == assign_users(jobs, {"heavy": 10, "light": 1}, seed=1)
    light = sum(job.user == "light" for job in first)
    assert 0 < light < len(jobs) / 5


def test_the_user_column_round_trips_and_is_written_only_when_used(tmp_path: Path) -> None:
    assert "user" not in write_workload(tuple(SMALL)).splitlines()[0]
    work = copies_for_users(tuple(SMALL[:2]), {"alice": 1, "bob": 2})
    text = write_workload(work)
    assert text.splitlines()[0].endswith(",user")
    path = tmp_path / "w.csv"
    path.write_text(text, encoding="utf-8")
    assert load_workload(path) == work


# ---- the engine's accounting ----------------------------------------------------------


def test_a_workload_without_users_runs_without_fair_share() -> None:
    policy = Fifo()
    result = Simulator(policy, SMALL, nodes=2).run()
    assert all(state.fair is None for state in policy.states)
    assert result.user_ticks == () and result.users() == {}
    assert "user" not in result.to_dict()["job_records"][0]


def test_users_are_charged_what_their_jobs_held_as_the_daemon_would() -> None:
    work = tuple(replace(job, user="alice" if i % 2 else "bob") for i, job in enumerate(SMALL))
    policy = Fifo()
    lab = SimLab({"alice": 2.0}, half_life=3600.0)
    result = Simulator(policy, work, nodes=2, lab=lab).run()
    assert {job.user for state in policy.states for job in state.jobs} == {"alice", "bob"}
    last = policy.states[-1].fair
    assert last is not None and last.of("alice").share == 2.0
    # Replaying the recorded ticks into a fresh accounting gives the same usage.
    account = FairShare(3600.0)
    for tick in result.user_ticks[:-1]:
        account.record_all(dict(tick.gpus), 60.0, tick.time + 60.0)
    final = policy.states[-1]
    assert final.fair is not None
    for user in ("alice", "bob"):
        if user in account.usage:
            assert final.fair.of(user).usage == pytest.approx(account.usage[user], rel=1e-9)
    users = result.users()
    held = sum(float(figures["gpu_time"]) for figures in users.values())
    assert held == pytest.approx(sum(job.gpu_time for job in result.jobs))


@pytest.mark.parametrize(("shares", "first"), [({"alice": 3.0}, "alice"), ({}, None)])
def test_users_jobs_taking_turns_on_a_node_progress_by_their_owners_shares(
    shares: dict[str, float], first: str | None
) -> None:
    """Two users' jobs over-subscribe one node: as the daemon's turns give it, alice's 3:1.

    Alice's job computes 3/4 of the time until it ends (4/3 of its time alone),
    then bob's runs alone; with equal shares both take half, as without a lab.
    """
    work = (
        replace(job("a", 0.0, "bert", 2, 48), user="alice"),
        replace(job("b", 0.0, "bert", 2, 48), user="bob"),
    )
    both = Scripted(lambda now, s: Decision({j.id: (2,) for j in s.jobs}))
    lab = SimLab(shares)
    result = Simulator(both, work, nodes=1, gpus_per_node=2, restart_penalty=0, lab=lab).run()
    solo = solo_seconds("bert", (2,), 48)
    jct = {record.user: record.jct for record in result.jobs}
    if first is None:
        assert jct == pytest.approx({"alice": 2 * solo, "bob": 2 * solo}, rel=0.01)
    else:
        assert jct == pytest.approx({"alice": 4 / 3 * solo, "bob": 2 * solo}, rel=0.01)


def test_backlog_and_shares_over_ticks() -> None:
    ticks = [
        UserTick(0.0, {"a": 6.0, "b": 2.0}, {"a": 1, "b": 1}, {"a": 3, "b": 2}),
        UserTick(60.0, {"a": 8.0}, {"a": 1}, {"a": 3}),
    ]
    assert [all_backlogged(tick) for tick in ticks] == [True, False]
    assert gpu_time_shares(ticks, all_backlogged) == {"a": 0.75, "b": 0.25}
    assert gpu_time_shares(ticks) == {"a": 14 / 16, "b": 2 / 16}
    assert max_min_shares({"a": 1.0, "b": 0.2}, {"a": 1.0, "b": 1.0}) == {
        "a": pytest.approx(0.8),
        "b": pytest.approx(0.2),
    }


# ---- the acceptance ------------------------------------------------------------------

GPUS_PER_NODE = 4


def simulate(work: tuple[WorkloadJob, ...], nodes: int, lab: SimLab | None = None) -> SimResult:
    """The default policy on `nodes` nodes of 4 GPUs."""
    return Simulator(get_policy("gpuq"), work, nodes=nodes, gpus_per_node=4, lab=lab).run()


def average_jct(result: SimResult, user: str) -> float:
    jcts = [job.jct for job in result.jobs if job.name.endswith(f"-{user}-0")]
    return sum(jcts) / len(jcts)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_ten_times_the_work_the_light_user_gets_what_it_asks_and_its_jct_holds() -> None:
    base = lab_workload(0)[::5]  # 6 jobs over the day
    work = copies_for_users(base, {"heavy": 10, "light": 1})
    nodes, share = 2, 4.0  # 8 GPUs; equal shares: 4 each
    shared = simulate(work, nodes)
    assert shared.gpu_utilization > 0.85  # a busy cluster
    alone = simulate(tuple(job for job in work if job.user == "light"), nodes // 2)
    light_waits = [t for t in shared.user_ticks if t.waiting.get("light", 0)]
    if light_waits:
        assert mean([t.gpus.get("light", 0.0) for t in light_waits]) >= 0.9 * share
    anyone_waits = [t for t in shared.user_ticks if sum(t.waiting.values())]
    assert mean([sum(t.gpus.values()) for t in anyone_waits]) >= 0.9 * nodes * GPUS_PER_NODE
    ratio = average_jct(shared, "light") / average_jct(alone, "light")
    assert ratio <= 1.5
    unfair = simulate(tuple(replace(job, user="") for job in work), nodes)
    assert average_jct(unfair, "light") / average_jct(alone, "light") > 1.5


@pytest.mark.parametrize(
    ("shares", "base_jobs"),
    [({"heavy": 1.0, "light": 1.0}, 8), ({"heavy": 3.0, "light": 1.0}, 6)],
)
def test_when_both_want_more_each_gets_its_configured_share(
    shares: dict[str, float], base_jobs: int
) -> None:
    base = tuple(replace(job, time=0.0) for job in lab_workload(0)[:base_jobs])
    work = copies_for_users(base, {"heavy": 10, "light": 1})
    result = simulate(work, 2, SimLab(shares))
    window = [tick for tick in result.user_ticks if all_backlogged(tick)]
    assert len(window) >= 60  # an hour of contention
    total = sum(shares.values())
    for ticks in (window, window[:30]):
        measured = gpu_time_shares(ticks)
        for user, configured in shares.items():
            assert measured[user] / (configured / total) == pytest.approx(1.0, abs=0.1)
