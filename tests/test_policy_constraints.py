"""Placement constraints in every policy: a job runs only on the nodes it may use.

A job's `JobView.nodes` (from `gpuq submit --node`, `--exclude-node`,
`--label`) names the nodes it may hold GPUs on. On a cluster of two nodes,
a and b, with two GPUs each:

- every registered policy, the simulator's included, never gives a
  constrained job GPUs on a node outside its set;
- every policy the daemon runs puts a job constrained to b on b, even
  where a is just as free (and puts the same job unconstrained on a, where
  it goes first);
- when b is full with a job that cannot be preempted or moved, the job
  waits, with a reason, while a's GPUs stay free for others;
- `gpuq` preempts a lower-priority job for a constrained one only on its
  nodes;
- `confine`, the guard of policies that decide counts only, moves a job
  placed outside its nodes onto them, or makes it wait with a reason.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.policies.confine import confine
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView
from gpuq.policies.registry import LIVE_POLICY_NAMES, POLICY_NAMES, get_policy

G = 1024**3
NOW = 1000.0


def two_nodes(*jobs: JobView) -> ClusterState:
    """Nodes a and b with two 40G GPUs each, listed one by one as the daemon does."""
    gpus = tuple(
        GpuView(f"{node}-{i}", node, 40 * G, index=i) for node in ("a", "b") for i in range(2)
    )
    return ClusterState(
        nodes=(NodeView("a", 2), NodeView("b", 2)), jobs=tuple(jobs), gpus=gpus, interval=60.0
    )


def waiting(job_id: int, nodes: frozenset[str] | None = None, gpus: int = 1) -> JobView:
    return JobView(
        job_id,
        submit_time=NOW - 10,
        gpus_requested=gpus,
        min_gpus=gpus,
        max_gpus=gpus,
        nodes=nodes,
    )


def holding_b(job_id: int) -> JobView:
    """A job running on both GPUs of b, which no policy preempts or moves.

    The caller cannot preempt it, and it restarted so often that Pollux's
    charge for reallocating it is total (Pollux reallocates any job).
    """
    return JobView(
        job_id,
        submit_time=NOW - 100,
        gpus_requested=2,
        min_gpus=2,
        max_gpus=2,
        allocation=(0, 2),
        gpu_uuids=("b-0", "b-1"),
        start_time=NOW - 90,
        run_time=90.0,
        num_restarts=100,
        preemptible=False,
    )


def decide(name: str, state: ClusterState) -> Decision:
    return get_policy(name).decide(state, NOW)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_no_policy_places_a_job_outside_its_nodes(name: str) -> None:
    jobs = [waiting(1, frozenset({"b"})), waiting(2), waiting(3, frozenset({"a"}), gpus=2)]
    decision = decide(name, two_nodes(*jobs))
    assert decision.allocations.get(1, (0, 0))[0] == 0
    assert decision.allocations.get(3, (0, 0))[1] == 0
    for uuid in decision.bindings.get(1, ()):
        assert uuid.startswith("b-")


@pytest.mark.parametrize("name", LIVE_POLICY_NAMES)
def test_a_job_constrained_to_b_lands_on_b(name: str) -> None:
    free = decide(name, two_nodes(waiting(1)))
    assert free.allocations[1] == (1, 0)  # unconstrained, it goes to a first

    constrained = decide(name, two_nodes(waiting(1, frozenset({"b"}))))
    assert constrained.allocations[1] == (0, 1)
    for uuid in constrained.bindings.get(1, ()):
        assert uuid.startswith("b-")


@pytest.mark.parametrize("name", LIVE_POLICY_NAMES)
def test_a_job_waits_while_its_only_node_is_full(name: str) -> None:
    state = two_nodes(holding_b(7), waiting(1, frozenset({"b"})))
    decision = decide(name, state)
    assert decision.allocations.get(1, (0, 0)) == (0, 0)
    assert decision.allocations[7] == (0, 2)  # the job on b keeps its GPUs
    assert decision.notes.get(1)

    unconstrained = decide(name, two_nodes(holding_b(7), waiting(1)))
    assert unconstrained.allocations[1] == (1, 0)


@pytest.mark.parametrize("name", LIVE_POLICY_NAMES)
def test_a_job_excluded_from_a_node_runs_on_the_other(name: str) -> None:
    decision = decide(name, two_nodes(waiting(1, frozenset({"b"})), waiting(2, frozenset({"b"}))))
    assert decision.allocations[1] == (0, 1)
    assert decision.allocations[2] == (0, 1)


def test_confine_moves_a_job_placed_outside_its_nodes_to_a_free_one() -> None:
    state = two_nodes(waiting(1, frozenset({"b"})))
    moved = confine(state, Decision(allocations={1: (1, 0)}, notes={1: "started"}))
    assert moved.allocations[1] == (0, 1)
    assert moved.notes[1] == "started; moved off a to its nodes (b)"


def test_confine_leaves_a_job_waiting_when_its_nodes_are_full() -> None:
    state = two_nodes(holding_b(7), waiting(1, frozenset({"b"})))
    kept = confine(state, Decision(allocations={7: (0, 2), 1: (1, 0)}))
    assert kept.allocations == {7: (0, 2)}
    assert kept.notes[1] == (
        "waiting: the policy chose a, where it may not run, and its nodes (b) have too few "
        "free GPUs"
    )


def test_confine_lets_a_running_job_keep_what_it_holds() -> None:
    running = JobView(
        5, submit_time=0.0, allocation=(1, 0), gpu_uuids=("a-0",), nodes=frozenset({"b"})
    )
    decision = Decision(allocations={5: (1, 0)})
    assert confine(two_nodes(running), decision) is decision


def running_on(job_id: int, node: str, started: float) -> JobView:
    """A low-priority job on both GPUs of `node`, which checkpoints (it may be preempted)."""
    return JobView(
        job_id,
        submit_time=0.0,
        gpus_requested=2,
        min_gpus=2,
        max_gpus=2,
        allocation=(2, 0) if node == "a" else (0, 2),
        gpu_uuids=(f"{node}-0", f"{node}-1"),
        start_time=started,
        run_time=NOW - started,
    )


def test_gpuq_preempts_for_a_constrained_job_only_on_its_nodes() -> None:
    urgent = replace(waiting(1, frozenset({"b"})), priority=5)
    # The job on b started first: unconstrained, the job on a (started last) would yield.
    state = two_nodes(running_on(7, "a", NOW - 50), running_on(8, "b", NOW - 500), urgent)
    decision = decide("gpuq", state)
    assert decision.allocations[1] == (0, 1)
    assert decision.allocations[7] == (2, 0)
    assert 8 not in decision.allocations
    assert decision.notes[8] == "preempted for job 1 (priority 5 over 0)"

    anywhere = decide("gpuq", replace(state, jobs=(*state.jobs[:2], replace(urgent, nodes=None))))
    assert 7 not in anywhere.allocations and anywhere.allocations[8] == (0, 2)
