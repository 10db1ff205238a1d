"""The time-slicer: how the daemon shares the GPUs a time-slicing policy over-subscribes.

Pure tests of `gpuq.daemon.scheduler.slicer` against a small model of a
server: jobs compute, park, stop or checkpoint exactly as the slicer says, a
checkpoint costs a restart penalty, and time moves in passes of a few
seconds. The live daemon runs the same object (tests/test_live_timeslice.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from gpuq.daemon.scheduler.slicer import PARK_RESIDENT_BYTES, Slicer, Waiting
from gpuq.fairshare import Fairness, UserShare
from gpuq.policies.interface import ClusterState, Decision, GpuView, JobView, NodeView
from gpuq.sim.engine import sharing as sim_sharing

GIB = 1024**3
RUNNER = Waiting(frozenset({"park", "checkpoint", "stop"}), 2 * GIB)
PLAIN_KNOWN = Waiting(frozenset({"stop"}), 2 * GIB)
PLAIN_UNKNOWN = Waiting(frozenset({"stop"}), None)


@dataclass
class Server:
    """One node of `gpus` GPUs running single-GPU jobs as the slicer says."""

    gpus: int
    jobs: dict[int, JobView]
    waiting: dict[int, Waiting]
    memory: int = 16 * GIB
    penalty: float = 30.0
    slicer: Slicer = field(default_factory=lambda: Slicer(quantum=60.0))
    progress: dict[int, float] = field(default_factory=dict)
    computed: dict[int, float] = field(default_factory=dict)
    blocked_until: dict[int, float] = field(default_factory=dict)
    fair: Fairness | None = None
    moves: int = 0
    parks: int = 0
    moved: dict[int, int] = field(default_factory=dict)
    most_on_a_gpu: int = 0
    notes: dict[int, str] = field(default_factory=dict)
    modes: list[str] = field(default_factory=list)
    now: float = 0.0

    @classmethod
    def of(cls, gpus: int, jobs: int, waiting: Waiting = RUNNER, **kwargs: object) -> Server:
        views = {i: JobView(id=i, submit_time=0.0) for i in range(1, jobs + 1)}
        return cls(gpus, views, {i: waiting for i in views}, **kwargs)  # type: ignore[arg-type]

    def state(self) -> ClusterState:
        gpus = tuple(GpuView(f"g{i}", "n", self.memory) for i in range(self.gpus))
        cluster = ClusterState(
            nodes=(NodeView("n", self.gpus),),
            jobs=tuple(self.jobs.values()),
            gpus=gpus,
            fair=self.fair,
        )
        return self.slicer.present(cluster)

    def step(self, now: float, dt: float) -> None:
        """One pass at `now`, then `dt` seconds of computing as decided."""
        decision = Decision(allocations={i: (1,) for i in self.jobs})
        out = self.slicer.slice(self.state(), decision, self.waiting, now)
        self.notes = dict(out.decision.notes)
        for job_id, job in list(self.jobs.items()):
            if job_id in out.decision.allocations:
                if not job.gpu_uuids:
                    self.blocked_until[job_id] = now + self.penalty
                bound = out.decision.bindings.get(job_id) or job.gpu_uuids or self.free_gpu()
                assert not job.gpu_uuids or bound == job.gpu_uuids, "a held job moved"
                self.jobs[job_id] = replace(job, gpu_uuids=bound, suspended=False, allocation=(1,))
            elif job.gpu_uuids and not job.suspended:
                mode = out.decision.suspend_modes[job_id]
                self.modes.append(mode)
                if mode in ("park", "stop"):
                    self.parks += 1
                    self.jobs[job_id] = replace(job, suspended=True)
                else:
                    self.moves += 1
                    self.moved[job_id] = self.moved.get(job_id, 0) + 1
                    self.jobs[job_id] = replace(job, gpu_uuids=(), allocation=())
        computing = [i for i, j in self.jobs.items() if j.gpu_uuids and not j.suspended]
        on_gpu = [uuid for i in computing for uuid in self.jobs[i].gpu_uuids]
        assert len(on_gpu) == len(set(on_gpu)), "two jobs computed on one GPU"
        held = [uuid for job in self.jobs.values() for uuid in job.gpu_uuids]
        self.most_on_a_gpu = max([self.most_on_a_gpu, *(held.count(u) for u in held)])
        for job_id in computing:
            self.computed[job_id] = self.computed.get(job_id, 0.0) + dt
            useful = min(dt, max(0.0, now + dt - self.blocked_until.get(job_id, 0.0)))
            self.progress[job_id] = self.progress.get(job_id, 0.0) + useful

    def free_gpu(self) -> tuple[str, ...]:
        """A GPU no job holds (where the slicer no longer binds, the daemon's binding picks)."""
        held = {uuid for job in self.jobs.values() for uuid in job.gpu_uuids}
        return (next(f"g{i}" for i in range(self.gpus) if f"g{i}" not in held),)

    def arrive(self, job_id: int) -> None:
        """A new job joins the server, waiting as `waiting[0]` says."""
        self.jobs[job_id] = JobView(id=job_id, submit_time=self.now)
        self.waiting[job_id] = self.waiting[0]

    def run(self, seconds: float, dt: float = 5.0) -> None:
        """Passes every `dt` seconds for `seconds` more."""
        end = self.now + seconds
        while self.now < end:
            self.step(self.now, dt)
            self.now += dt


def test_six_jobs_on_four_gpus_each_get_two_thirds_with_little_lost_to_switching() -> None:
    server = Server.of(4, 6)
    hours = 4 * 3600.0
    server.run(hours)
    shares = [server.computed[i] / hours for i in server.jobs]
    assert shares == pytest.approx([4 / 6] * 6, rel=0.05)
    lost = 1 - sum(server.progress.values()) / (4 * hours)
    assert lost < 0.03
    assert server.parks > server.moves > 0  # mostly parks; a few moves balance the pins


def test_jobs_arriving_apart_share_the_restarts_that_even_out_their_turns() -> None:
    """Moves take the GPU of a job computing alone, and the job moved least moves.

    Jobs arrive a little apart, so their turns end at different times. No
    GPU ever holds more than two jobs (a move onto a shared GPU would leave
    the mover behind, to move again), each job moves about as often as the
    others, and so each job's progress, not only its GPU time, is near 4/6.
    """
    server = Server.of(4, 0, slicer=Slicer(quantum=6.0), penalty=3.0)
    server.waiting = {0: RUNNER}
    for job_id, arrival in enumerate((0.0, 0.8, 2.0, 2.6, 40.4, 43.2), start=1):
        server.run(arrival - server.now, dt=0.2)
        server.arrive(job_id)
    server.run(120.0 - server.now, dt=0.2)
    computed, progress, moved = dict(server.computed), dict(server.progress), dict(server.moved)
    window = 200 * 6.0
    server.run(window, dt=0.2)
    assert server.most_on_a_gpu == 2
    moves = [server.moved.get(i, 0) - moved.get(i, 0) for i in server.jobs]
    assert max(moves) - min(moves) <= 2, moves
    shares = [(server.computed[i] - computed[i]) / window for i in server.jobs]
    assert shares == pytest.approx([4 / 6] * 6, rel=0.05)
    progressed = [(server.progress[i] - progress[i]) / window for i in server.jobs]
    assert progressed == pytest.approx([4 / 6] * 6, rel=0.05)


def test_without_moves_pins_would_fix_each_gpus_share() -> None:
    """The reason for rebalancing: never moving, two GPUs hold two jobs and two hold one."""
    server = Server.of(4, 6, slicer=Slicer(quantum=60.0, rebalance=float("inf")))
    server.waiting = {i: Waiting(frozenset({"park"}), 2 * GIB) for i in server.jobs}
    server.run(4 * 3600.0)
    shares = sorted(round(server.computed[i] / (4 * 3600.0), 2) for i in server.jobs)
    assert shares == [0.5, 0.5, 0.5, 0.5, 1.0, 1.0]


def test_a_turn_lasts_a_quantum_and_the_next_pass_is_at_its_end() -> None:
    server = Server.of(1, 2, slicer=Slicer(quantum=60.0))
    first = server.slicer.slice(
        server.state(), Decision(allocations={1: (1,), 2: (1,)}), server.waiting, 0.0
    )
    assert list(first.decision.allocations) == [1]
    assert first.wake == 60.0
    server.run(60.0, dt=20.0)
    assert set(server.computed) == {1}
    server.step(60.0, 20.0)
    assert server.notes[1] == "quantum ended, job 2's turn"
    assert server.modes == ["park"]


def test_a_job_parked_on_a_gpu_only_computes_there_again() -> None:
    server = Server.of(2, 3)
    server.run(3600.0)  # the step asserts that a held job never changes GPUs
    assert all(server.computed[i] > 0 for i in server.jobs)


def test_a_job_is_checkpointed_when_the_next_ones_memory_does_not_fit_beside_it() -> None:
    big = Waiting(frozenset({"park", "checkpoint"}), 15 * GIB)
    server = Server.of(1, 2, waiting=big)
    server.run(125.0)
    assert server.modes[0] == "checkpoint"
    small = Server.of(1, 2, waiting=Waiting(frozenset({"park", "checkpoint"}), 14 * GIB))
    small.run(125.0)
    assert small.modes[0] == "park"  # 14 GiB beside a parked job's context fits in 15.2


def test_a_plain_job_is_stopped_only_when_its_memory_is_known_and_fits() -> None:
    server = Server.of(1, 2, waiting=PLAIN_KNOWN)
    server.run(125.0)
    assert server.modes[0] == "stop"
    too_big = Server.of(1, 2, waiting=Waiting(frozenset({"stop"}), 10 * GIB))
    too_big.run(300.0)
    assert too_big.modes == [] and set(too_big.computed) == {1}
    unknown = Server.of(1, 2, waiting=PLAIN_UNKNOWN)
    unknown.run(300.0)
    assert unknown.modes == [] and set(unknown.computed) == {1}
    assert "job 1 cannot take turns" in unknown.notes[2]
    assert unknown.notes[1] == "not time-sliced: it can neither park, stop nor checkpoint"


def test_a_job_its_user_suspended_is_never_given_a_turn() -> None:
    server = Server.of(1, 2)
    server.jobs[1] = replace(server.jobs[1], gpu_uuids=("g0",), suspended=True, allocation=(1,))
    server.waiting[1] = Waiting(frozenset(), 2 * GIB, resumable=False)
    server.run(600.0)
    assert 1 not in server.computed


def test_a_job_leaving_its_gpus_holds_them_until_it_has_left() -> None:
    slicer = Slicer(quantum=60.0)
    jobs = (
        JobView(id=1, submit_time=0.0, allocation=(1,), gpu_uuids=("g0",)),
        JobView(id=2, submit_time=0.0),
    )
    state = ClusterState(nodes=(NodeView("n", 1),), jobs=jobs, gpus=(GpuView("g0", "n", 16 * GIB),))
    leaving = {1: Waiting(RUNNER.modes, GIB, leaving=True), 2: RUNNER}
    out = slicer.slice(state, Decision(allocations={1: (1,), 2: (1,)}), leaving, 100.0)
    assert dict(out.decision.allocations) == {}


def one_gpu_hand_over(leaving: Waiting, parked: Waiting) -> Decision:
    """Job 1 leaves g0 by checkpoint, job 2 waits parked on g0: what computes now."""
    slicer = Slicer(quantum=60.0)
    jobs = (
        JobView(id=1, submit_time=0.0, allocation=(1,), gpu_uuids=("g0",)),
        JobView(id=2, submit_time=0.0, allocation=(1,), gpu_uuids=("g0",), suspended=True),
    )
    state = ClusterState(nodes=(NodeView("n", 1),), jobs=jobs, gpus=(GpuView("g0", "n", 16 * GIB),))
    decision = Decision(allocations={1: (1,), 2: (1,)})
    return slicer.slice(state, decision, {1: leaving, 2: parked}, 100.0).decision


def test_a_checkpointed_job_hands_its_gpu_over_once_its_checkpoint_is_saved() -> None:
    """Its process only exits then: the next job need not wait for that."""
    saving = Waiting(RUNNER.modes, 2 * GIB, leaving=True)
    assert dict(one_gpu_hand_over(saving, RUNNER).allocations) == {}
    saved = replace(saving, saved=True)
    assert one_gpu_hand_over(saved, RUNNER).bindings == {2: ("g0",)}


def test_the_next_job_waits_for_an_exit_when_its_memory_does_not_fit_beside_it() -> None:
    saved = Waiting(RUNNER.modes, 9 * GIB, leaving=True, saved=True)
    big = Waiting(RUNNER.modes, 9 * GIB)
    assert dict(one_gpu_hand_over(saved, big).allocations) == {}


def test_a_node_no_longer_over_subscribed_brings_its_waiting_jobs_back() -> None:
    server = Server.of(2, 3)
    server.run(600.0)
    del server.jobs[next(i for i, j in server.jobs.items() if j.gpu_uuids and not j.suspended)]
    server.run(300.0)
    computing = [i for i, j in server.jobs.items() if j.gpu_uuids and not j.suspended]
    assert len(computing) == 2
    assert not server.slicer.shares


def test_the_turns_survive_a_save_and_restore() -> None:
    server = Server.of(4, 6)
    server.run(1800.0)
    copy = Slicer(quantum=60.0)
    copy.restore(server.slicer.save())
    decision = Decision(allocations={i: (1,) for i in server.jobs})
    expected = server.slicer.slice(server.state(), decision, server.waiting, 1800.0)
    assert copy.slice(server.state(), decision, server.waiting, 1800.0) == expected


@pytest.mark.parametrize("saved", [{}, {"version": 2}, {"version": 1, "credit": 3}])
def test_memory_it_cannot_read_is_refused(saved: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Slicer().restore(saved)


def test_a_non_positive_quantum_is_refused() -> None:
    with pytest.raises(ValueError, match="quantum"):
        Slicer(quantum=0)


def test_a_parked_jobs_resident_memory_is_its_context() -> None:
    assert RUNNER.resident("park") == PARK_RESIDENT_BYTES
    assert RUNNER.resident("stop") == 2 * GIB


def test_a_packed_pair_takes_its_turns_as_one_job() -> None:
    """Jobs 1 and 2 packed on g0 beside job 3: the pair adds one GPU of demand, not two.

    On one GPU, the pair and job 3 take turns: when job 3's turn comes both
    members wait (parked); when the pair's comes, the guest computes on its
    anchor's GPU beside it.
    """
    pair = {i: JobView(id=i, submit_time=0.0, allocation=(1,), gpu_uuids=("g0",)) for i in (1, 2)}
    jobs = {**pair, 3: JobView(id=3, submit_time=0.0, allocation=(1,))}
    gpus = (GpuView("g0", "n", 16 * GIB),)
    decision = Decision(allocations={i: (1,) for i in jobs}, packed=((1, 2),))
    slicer = Slicer(quantum=60.0)
    waiting = dict.fromkeys(jobs, RUNNER)

    def state() -> ClusterState:
        return ClusterState(nodes=(NodeView("n", 1),), jobs=tuple(jobs.values()), gpus=gpus)

    first = slicer.slice(state(), decision, waiting, 0.0).decision
    assert set(first.allocations) == {3} and first.bindings[3] == ("g0",)
    assert first.suspend_modes[1] == first.suspend_modes[2] == "park"
    assert "packed with job 1: waiting for its turn with it" in first.notes[2]
    jobs.update({i: replace(job, suspended=True) for i, job in pair.items()})
    jobs[3] = replace(jobs[3], gpu_uuids=("g0",))

    later = slicer.slice(state(), decision, waiting, 61.0).decision
    assert 3 not in later.allocations, "the pair's turn"
    assert later.bindings[1] == later.bindings[2] == ("g0",)


def test_a_packed_guest_on_a_node_not_over_subscribed_is_left_to_compute() -> None:
    jobs = (
        JobView(id=1, submit_time=0.0, allocation=(1,), gpu_uuids=("g0",)),
        JobView(id=2, submit_time=0.0, allocation=(1,), gpu_uuids=("g0",)),
    )
    state = ClusterState(nodes=(NodeView("n", 1),), jobs=jobs, gpus=(GpuView("g0", "n", 16 * GIB),))
    decision = Decision(allocations={1: (1,), 2: (1,)}, packed=((1, 2),))
    out = Slicer(quantum=60.0).slice(state, decision, {1: RUNNER, 2: RUNNER}, 0.0)
    assert out.decision == decision and out.sliced == frozenset()


def test_memory_shares_are_not_members_and_their_gpus_are_not_shared_in_turns() -> None:
    # Two GPUs: g1 holds two memory-share jobs (the decision binds them there);
    # jobs 1 and 2 want one whole GPU each.
    gpus = tuple(GpuView(f"g{i}", "n", 16 * GIB) for i in range(2))
    shares = [
        JobView(id=i, submit_time=0.0, gpu_mem=GIB, gpu_uuids=("g1",), allocation=(1,))
        for i in (3, 4)
    ]
    whole = [JobView(id=1, submit_time=0.0, gpu_uuids=("g0",), allocation=(1,))]
    whole.append(JobView(id=2, submit_time=0.0))
    state = ClusterState(nodes=(NodeView("n", 2),), jobs=tuple([*whole, *shares]), gpus=gpus)
    decision = Decision(
        allocations={i: (1,) for i in (1, 2, 3, 4)}, bindings={3: ("g1",), 4: ("g1",)}
    )
    slicer = Slicer(quantum=60.0)
    assert slicer.needed(state, decision), "two whole-GPU jobs on the one unshared GPU"
    out = slicer.slice(state, decision, {i: RUNNER for i in (1, 2, 3, 4)}, 0.0)
    assert set(out.sliced) == {1, 2}
    assert out.decision.allocations[3] == out.decision.allocations[4] == (1,)
    assert out.decision.bindings.get(2, ()) != ("g1",)


def test_no_turns_are_needed_while_no_node_is_over_subscribed() -> None:
    server = Server.of(2, 2)
    decision = Decision(allocations={i: (1,) for i in server.jobs})
    assert not server.slicer.needed(server.state(), decision)
    crowded = Server.of(2, 3)
    assert crowded.slicer.needed(crowded.state(), Decision(allocations={1: (1,), 2: (1,), 3: (1,)}))


def test_a_job_with_known_memory_the_decision_does_not_bind_takes_turns() -> None:
    # gandiva gives --gpu-mem jobs whole GPUs in turns: their memory says they can be stopped.
    server = Server.of(1, 2, waiting=PLAIN_KNOWN)
    server.jobs = {i: replace(job, gpu_mem=GIB) for i, job in server.jobs.items()}
    decision = Decision(allocations={1: (1,), 2: (1,)})
    assert server.slicer.needed(server.state(), decision)
    out = server.slicer.slice(server.state(), decision, server.waiting, 0.0)
    assert set(out.sliced) == {1, 2}


@pytest.mark.parametrize(("shares", "bob"), [((1.0, 1.0), 1.0), ((5.0, 1.0), 4 / 6)])
def test_in_lab_mode_turns_follow_the_users_shares_not_their_job_counts(
    shares: tuple[float, float], bob: float
) -> None:
    """Turns are weighted by the owners' shares over what their jobs ask.

    Alice's five jobs and bob's one share four GPUs: with equal shares bob's job
    computes all the time (its half is two GPUs, more than one job can use) and
    alice's five share the other three; with alice's share five times bob's, as
    if every job were alike (4/6 each).
    """
    server = Server.of(4, 6)
    server.jobs = {
        i: replace(job, user="bob" if i == 6 else "alice") for i, job in server.jobs.items()
    }
    alice, bobs = shares
    server.fair = Fairness({"alice": UserShare(share=alice), "bob": UserShare(share=bobs)})
    hours = 2 * 3600.0
    server.run(hours)
    computed = {i: server.computed[i] / hours for i in server.jobs}
    assert computed[6] == pytest.approx(bob, rel=0.05)
    assert [computed[i] for i in range(1, 6)] == pytest.approx([(4 - bob) / 5] * 5, rel=0.05)


@pytest.mark.parametrize("shares", [(1.0, 1.0), (5.0, 1.0), (1.0, 3.0), (2.0, 1.0)])
def test_the_simulator_gives_each_job_the_part_the_turns_give_it(
    shares: tuple[float, float],
) -> None:
    """Live and simulated lab turns agree: `gpuq sim` runs the rule the slicer realizes.

    Four of alice's one-GPU jobs and two of bob's on four GPUs, over eight hours of turns.
    """
    server = Server.of(4, 6)
    server.jobs = {
        i: replace(job, user="bob" if i > 4 else "alice") for i, job in server.jobs.items()
    }
    fair = Fairness({"alice": UserShare(share=shares[0]), "bob": UserShare(share=shares[1])})
    server.fair = fair
    hours = 8 * 3600.0
    server.run(hours)
    owners = {i: job.user for i, job in server.jobs.items()}
    simulated = sim_sharing((4,), {i: (1,) for i in server.jobs}, (), 0.0, 0.0, owners, fair)
    for i in server.jobs:
        assert server.computed[i] / hours == pytest.approx(simulated[i][0], rel=0.05)
