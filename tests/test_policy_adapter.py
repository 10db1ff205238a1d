"""`ElasticAdapter`: an elastic policy behind the daemon's `Policy` protocol.

See the docstring of gpuq/policies/adapter.py for the rules tested here.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.policies.adapter import ElasticAdapter
from gpuq.policies.base import ClusterView, GpuState, JobRequest, Plan, RunningJob
from gpuq.policies.baselines import FifoPolicy
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import Capabilities, ClusterState, Decision
from gpuq.policies.tiresias import TiresiasPolicy

G = 1024**3
M = 1024**2


def gpus(*nodes: int, foreign: dict[int, int] | None = None) -> tuple[GpuState, ...]:
    """GPUs `GPU-<index>` on nodes `a`, `b`, ... with the given counts."""
    out: list[GpuState] = []
    for node, count in enumerate(nodes):
        for _ in range(count):
            index = len(out)
            used = (foreign or {}).get(index, 0)
            out.append(GpuState(f"GPU-{index}", "abcdefgh"[node], 40 * G, used))
    return tuple(out)


def request(
    job_id: int, count: int = 1, *, priority: int = 0, submit: float = 0.0, mem: int | None = None
) -> JobRequest:
    return JobRequest(job_id, priority, submit, count, mem)


def started(plan: Plan) -> dict[int, tuple[str, ...]]:
    return {placement.job_id: placement.gpu_uuids for placement in plan.start}


class Fixed:
    """An elastic policy that returns a given decision."""

    name = "fixed"
    capabilities = Capabilities()

    def __init__(self, allocations: dict[int, tuple[int, ...]]) -> None:
        self.allocations = allocations
        self.seen: list[ClusterState] = []

    def decide(self, state: ClusterState, now: float) -> Decision:
        self.seen.append(state)
        return Decision(allocations=self.allocations)


# -- same jobs as the daemon's fifo --------------------------------------------------


SIMPLE_VIEWS = [
    ClusterView(gpus(4), (request(1, 2), request(2, 4, submit=1), request(3, 2, submit=2))),
    ClusterView(
        gpus(2, 2),
        (request(1, 3), request(2, 2, priority=5, submit=9), request(3, 1, submit=1)),
        (RunningJob(10, ("GPU-0",)),),
    ),
    ClusterView(gpus(4, 4), tuple(request(i, 1 + i % 3, submit=i) for i in range(1, 9))),
    ClusterView(gpus(2), (request(1, 3), request(2, 1, submit=1))),  # 1 is impossible
]


@given(
    st.sampled_from(SIMPLE_VIEWS)
    | st.builds(
        lambda nodes, jobs, busy, blocked: ClusterView(
            gpus(*nodes, foreign={i: G for i in blocked}),
            tuple(request(i, c, priority=p, submit=s) for i, (c, p, s) in enumerate(jobs)),
            tuple(RunningJob(100 + i, (f"GPU-{i}",)) for i in busy),
        ),
        st.lists(st.integers(1, 4), min_size=1, max_size=3),
        st.lists(st.tuples(st.integers(1, 5), st.integers(0, 2), st.integers(0, 9)), max_size=10),
        st.sets(st.integers(0, 3)),
        st.sets(st.integers(4, 6)),
    )
)
@settings(max_examples=200, deadline=None)
def test_with_elastic_fifo_the_adapter_starts_the_jobs_fifo_starts(view: ClusterView) -> None:
    # No time limits, so the daemon's fifo makes no reservations either.
    ours = ElasticAdapter(FifoPolicy()).decide(view, 100.0)
    theirs = FifoBackfill().decide(view, 100.0)
    assert set(started(ours)) == set(started(theirs))
    assert set(ours.waiting) == set(theirs.waiting)
    taken = [uuid for uuids in started(ours).values() for uuid in uuids]
    held = {uuid for job in view.running for uuid in job.gpu_uuids}
    assert len(taken) == len(set(taken))
    assert held.isdisjoint(taken)


def test_nodes_offer_only_gpus_whole_jobs_may_use() -> None:
    view = ClusterView(
        gpus(2, 2, foreign={1: G}),
        (request(1),),
        (RunningJob(7, ("GPU-2",), gpu_mem=G), RunningJob(8, ("GPU-3",))),
    )
    policy = Fixed({})
    ElasticAdapter(policy).decide(view, 10.0)
    state = policy.seen[0]
    assert [(node.name, node.gpus) for node in state.nodes] == [("a", 1), ("b", 1)]
    assert [(job.id, job.allocation) for job in state.jobs] == [(1, ()), (8, (0, 1))]
    assert state.jobs[1].attained_service == 10.0


def test_a_complete_allocation_starts_on_free_gpus_of_the_chosen_nodes() -> None:
    view = ClusterView(gpus(2, 2), (request(1, 3),), (RunningJob(9, ("GPU-2",)),))
    plan = ElasticAdapter(Fixed({1: (2, 1), 9: (0, 1)})).decide(view, 0.0)
    assert started(plan) == {1: ("GPU-0", "GPU-1", "GPU-3")}
    assert plan.waiting == {}


def test_a_partial_offer_waits() -> None:
    view = ClusterView(gpus(4), (request(1, 4),))
    plan = ElasticAdapter(Fixed({1: (2,)})).decide(view, 0.0)
    assert plan.start == ()
    assert plan.waiting[1] == "policy fixed offered 2 of 4 GPUs"


def test_running_jobs_the_policy_would_preempt_keep_their_gpus_with_a_reason() -> None:
    # Job 5 has 4 GPUs x 5 h = 20 GPU-hours: Tiresias demotes it and runs job 1 instead.
    held = RunningJob(5, ("GPU-0", "GPU-1", "GPU-2", "GPU-3"), start_time=0.0)
    view = ClusterView(gpus(4), (request(1, 4, submit=0),), (held,))
    plan = ElasticAdapter(TiresiasPolicy()).decide(view, 5 * 3600.0)
    assert plan.start == ()
    assert (
        plan.waiting[5] == "policy tiresias would preempt this job; the daemon cannot do that yet"
    )
    assert plan.waiting[1] == "waiting for GPUs the policy expects running jobs to release"


def test_resizing_a_running_job_is_reported_not_done() -> None:
    view = ClusterView(gpus(4), (), (RunningJob(5, ("GPU-0", "GPU-1")),))
    plan = ElasticAdapter(Fixed({5: (4,)})).decide(view, 0.0)
    assert plan.start == ()
    assert "would grow this job to 4 GPUs" in plan.waiting[5]


def test_shared_and_cpu_jobs_go_through_fifo_after_the_elastic_starts() -> None:
    view = ClusterView(
        gpus(2),
        (request(1, 1), request(2, 1, mem=10 * G, submit=1), request(3, 0, submit=2)),
    )
    plan = ElasticAdapter(FifoPolicy()).decide(view, 0.0)
    placed = started(plan)
    assert placed[1] == ("GPU-0",)
    assert placed[2] == ("GPU-1",)  # the whole-GPU job's GPU is taken
    assert placed[3] == ()
    assert [p.gpu_mem for p in plan.start if p.job_id == 2] == [10 * G]


def test_an_impossible_request_waits_with_fifos_reason() -> None:
    view = ClusterView(gpus(2), (request(1, 3),))
    plan = ElasticAdapter(FifoPolicy()).decide(view, 0.0)
    assert plan.waiting == {1: "needs 3 GPUs; this server has 2"}
