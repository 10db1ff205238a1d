"""A decision as actions (gpuq/policies/actions.py): each change named, ordered, with a reason."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuq.policies.actions import Action, Kind, plan
from gpuq.policies.interface import ClusterState, Decision, JobView, NodeView

NODES = (NodeView("n0", 4), NodeView("n1", 4))


def state(*jobs: JobView) -> ClusterState:
    return ClusterState(nodes=NODES, jobs=jobs)


def running(job_id: int, allocation: tuple[int, int], **fields: object) -> JobView:
    return JobView(id=job_id, submit_time=0.0, allocation=allocation, **fields)  # type: ignore[arg-type]


def pending(job_id: int, **fields: object) -> JobView:
    return JobView(id=job_id, submit_time=0.0, **fields)  # type: ignore[arg-type]


def only(actions: tuple[Action, ...]) -> Action:
    assert len(actions) == 1, actions
    return actions[0]


def test_a_job_kept_where_it_runs_needs_no_action() -> None:
    assert plan(state(running(1, (2, 0))), Decision(allocations={1: (2, 0)})) == ()


def test_a_pending_job_given_gpus_starts_with_the_policys_note() -> None:
    action = only(plan(state(pending(1)), Decision(allocations={1: (0, 2)}, notes={1: "its turn"})))
    assert (action.kind, action.allocation, action.previous) == (Kind.START, (0, 2), ())
    assert action.reason == "started on 2 GPUs on n1: its turn"


def test_a_running_job_left_out_is_suspended_in_the_mode_the_policy_asks() -> None:
    decision = Decision(
        allocations={}, suspend_modes={1: "park"}, notes={1: "quantum ended, job 2's turn"}
    )
    action = only(plan(state(running(1, (1, 0))), decision))
    assert (action.kind, action.mode, action.previous) == (Kind.SUSPEND, "park", (1, 0))
    assert action.reason == "suspended by the policy: quantum ended, job 2's turn"


def test_another_count_is_a_resize_and_the_same_count_elsewhere_a_move() -> None:
    jobs = state(running(1, (2, 0)), running(2, (2, 0)))
    decision = Decision(allocations={1: (4, 0), 2: (0, 2)}, notes={1: "goodput +38%"})
    resize, move = plan(jobs, decision)
    assert (resize.kind, resize.job_id, resize.previous, resize.allocation) == (
        Kind.RESIZE, 1, (2, 0), (4, 0),
    )  # fmt: skip
    assert resize.reason == "resized 2 -> 4 GPUs: goodput +38%"
    assert (move.kind, move.job_id, move.reason) == (Kind.MOVE, 2, "moved to 2 GPUs on n1")


def test_other_gpus_of_the_same_node_are_a_move_where_the_decision_binds_them() -> None:
    job = running(1, (1, 0), gpu_uuids=("g0",))
    assert plan(state(job), Decision(allocations={1: (1, 0)}, bindings={1: ("g0",)})) == ()
    action = only(plan(state(job), Decision(allocations={1: (1, 0)}, bindings={1: ("g3",)})))
    assert (action.kind, action.gpu_uuids) == (Kind.MOVE, ("g3",))


def test_a_suspended_job_given_gpus_resumes_and_one_left_out_stays_suspended() -> None:
    parked = running(1, (1, 0), suspended=True)
    checkpointed = pending(2, suspended=True)
    assert plan(state(parked, checkpointed), Decision()) == ()
    resume = only(plan(state(parked, checkpointed), Decision(allocations={1: (1, 0)})))
    assert (resume.kind, resume.job_id, resume.previous) == (Kind.RESUME, 1, (1, 0))
    assert resume.reason == "resumed on 1 GPU on n0"


def test_packs_made_and_undone_name_the_partners() -> None:
    jobs = state(
        running(1, (1, 0), packed_with=(2,)),
        running(2, (1, 0), packed_with=(1,)),
        running(3, (0, 1)),
        pending(4),
    )
    decision = Decision(
        allocations={1: (1, 0), 2: (1, 0), 3: (0, 1), 4: (0, 1)},
        packed=((3, 4),),
        notes={1: "packed throughput 0.71 of time-sliced"},
    )
    actions = plan(jobs, decision)
    assert [(a.kind, a.job_id, a.partners) for a in actions] == [
        (Kind.UNPACK, 1, (2,)),
        (Kind.UNPACK, 2, (1,)),
        (Kind.START, 4, ()),
        (Kind.PACK, 3, (4,)),
        (Kind.PACK, 4, (3,)),
    ]
    assert actions[0].reason == "unpacked from job 2: packed throughput 0.71 of time-sliced"
    assert actions[3].reason == "packed with job 4"


def test_actions_that_free_gpus_come_before_those_that_take_them() -> None:
    jobs = state(pending(1), running(2, (4, 0)), running(3, (0, 2)), pending(4, suspended=True))
    decision = Decision(allocations={1: (4, 0), 3: (0, 1), 4: (0, 1)})
    kinds = [action.kind for action in plan(jobs, decision)]
    assert kinds == [Kind.SUSPEND, Kind.RESIZE, Kind.RESUME, Kind.START]


allocations = st.tuples(st.integers(0, 4), st.integers(0, 4))


@given(
    before=st.lists(st.tuples(allocations, st.booleans()), min_size=1, max_size=6),
    after=st.lists(allocations, min_size=1, max_size=6),
)
def test_carrying_out_the_actions_gives_every_job_the_decisions_allocation(
    before: list[tuple[tuple[int, int], bool]], after: list[tuple[int, int]]
) -> None:
    jobs = [
        JobView(id=i, submit_time=0.0, allocation=alloc, suspended=suspended)
        for i, (alloc, suspended) in enumerate(before)
    ]
    decision = Decision(allocations={i: alloc for i, alloc in enumerate(after) if i < len(jobs)})
    held = {job.id: job.allocation for job in jobs}
    for action in plan(state(*jobs), decision):
        assert action.previous == (held[action.job_id] if action.kind is not Kind.START else ())
        held[action.job_id] = action.allocation
    for job in jobs:
        target = decision.allocations.get(job.id, ())
        if sum(target) > 0:
            assert held[job.id] == target
        elif not job.suspended:
            assert sum(held[job.id]) == 0
