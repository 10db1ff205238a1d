"""The pure rules of live packing: what the daemon measures, and what it remembers of packs.

`gpuq.daemon.scheduler.introspect` turns runner samples and GPU samples
into the `JobView` fields Gandiva reads; `gpuq.daemon.scheduler.packs` is
the book of packs the daemon commits before acting; `gpuq.daemon.oom`
raises the memory need of a job that ran out of memory packed. The live
daemon runs them in tests/test_live_packing.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuq.daemon.oom import MIB, raised_memory
from gpuq.daemon.scheduler.introspect import Introspection, StepMeasurement, enrich
from gpuq.daemon.scheduler.packs import PackBook, PackRecord, anchor_of, guests_of
from gpuq.daemon.state import GpuSnapshot
from gpuq.models import GpuInfo, Job, JobSpec, JobState
from gpuq.policies.interface import ClusterState, GpuView, JobView, NodeView

G = 1024**3


def job(job_id: int, state: JobState = JobState.RUNNING, gpus: tuple[str, ...] = ("g0",)) -> Job:
    spec = JobSpec(command=("true",), cwd="/")
    return Job(job_id, spec, state, gpu_uuids=gpus, start_time=0.0, attempts=1)


def sample(time: float, step_seconds: float | None) -> dict[str, object]:
    return {"time": time, "step": int(time), "step_seconds": step_seconds}


# Step times: attributed to who computed beside the job throughout the window.


def test_a_job_computing_alone_is_measured_solo() -> None:
    seen = Introspection()
    a = job(1)
    seen.observe([a], {}, now=0.0)
    seen.observe([a], {1: sample(5.0, 0.2)}, now=5.0)
    assert seen.step(1) == StepMeasurement(0.2, (), 5.0)


def test_the_first_sample_of_a_job_seen_late_is_not_trusted() -> None:
    seen = Introspection()  # a daemon just restarted: who computed beside the job is unknown
    seen.observe([job(1)], {1: sample(5.0, 0.2)}, now=5.0)
    assert seen.step(1) is None


def test_a_window_that_straddles_a_pack_is_dropped_and_the_next_is_packed() -> None:
    seen = Introspection()
    a, b = job(1), job(2)
    seen.observe([a], {}, now=0.0)
    seen.observe([a], {1: sample(5.0, 0.2)}, now=5.0)
    seen.observe([a, b], {}, now=8.0)  # job 2 joins job 1's GPU
    seen.observe([a, b], {1: sample(10.0, 0.4)}, now=10.0)  # window 5-10: half solo
    assert seen.step(1) == StepMeasurement(0.2, (), 5.0), "the mixed window is not attributed"
    seen.observe([a, b], {1: sample(15.0, 0.56)}, now=15.0)
    assert seen.step(1) == StepMeasurement(0.56, (2,), 15.0)


def test_time_parked_for_a_turn_does_not_break_a_solo_window() -> None:
    seen = Introspection()
    a, b = job(1), job(2)
    seen.observe([a, replace(b, state=JobState.SUSPENDED)], {}, now=0.0)
    seen.observe([a, replace(b, state=JobState.SUSPENDED)], {1: sample(5.0, 0.2)}, now=5.0)
    turn = [replace(a, state=JobState.SUSPENDED), b]  # job 1 parked, job 2 alone on the GPU
    seen.observe(turn, {}, now=7.0)
    seen.observe([a, replace(b, state=JobState.SUSPENDED)], {1: sample(12.0, 0.21)}, now=12.0)
    assert seen.step(1) == StepMeasurement(0.21, (), 12.0)


def test_an_old_or_stepless_sample_changes_nothing() -> None:
    seen = Introspection()
    a = job(1)
    seen.observe([a], {}, now=0.0)
    seen.observe([a], {1: sample(5.0, 0.2)}, now=5.0)
    seen.observe([a], {1: sample(5.0, 0.9)}, now=6.0)  # the same sample again
    seen.observe([a], {1: sample(10.0, None)}, now=10.0)  # no step ended in the window
    assert seen.step(1) == StepMeasurement(0.2, (), 5.0)


def test_utilization_is_credited_only_to_a_job_computing_alone() -> None:
    seen = Introspection()
    a, b = job(1), job(2, gpus=("g1",))
    seen.observe([a, b], {}, now=1.0)
    snapshot = GpuSnapshot(
        devices=[GpuInfo("g0", 0, "x", 40 * G, 0, 30.0), GpuInfo("g1", 1, "x", 40 * G, 0, 50.0)]
    )
    seen.note_utilization(snapshot, [a, b], {1: 12 * G})
    seen.note_utilization(snapshot, [a, replace(b, gpu_uuids=("g0",))], {1: 10 * G})
    assert seen.utilization(1) == 30.0, "the shared sample is not credited"
    assert seen.utilization(2) == 50.0
    assert seen.memory(1) == 12 * G, "the largest seen"


def test_enrich_gives_the_policy_measurements_packs_and_memory() -> None:
    seen, book = Introspection(), PackBook()
    a = job(1)
    seen.observe([a], {}, now=0.0)
    seen.observe([a], {1: sample(5.0, 0.2)}, now=5.0)
    book.put(PackRecord(1, 2, ("g0",), "packed", "", 0.0, 0.0))
    book.failed.add(frozenset((2, 3)))
    book.raised[2] = 30 * G
    state = ClusterState(
        nodes=(NodeView("n", 2),),
        jobs=(JobView(1, 0.0), JobView(2, 0.0, memory_peak=12 * G)),
        gpus=(GpuView("g0", "n", 40 * G), GpuView("g1", "n", 40 * G, memory_foreign=G)),
        memory_margin=0.05,
    )
    enriched = {view.id: view for view in enrich(state, seen, book).jobs}
    assert (enriched[1].step_seconds, enriched[1].step_shared_with) == (0.2, ())
    assert enriched[1].packed_with == (2,) and enriched[2].packed_with == (1,)
    assert enriched[2].oom_partners == (3,)
    assert enriched[2].memory_peak == 30 * G, "the raised need counts"
    assert enrich(state, seen, book).gpu_memory == int(40 * G * 0.95) - G


# The book of packs.


def record(phase: str = "packed", leaving: int | None = None) -> PackRecord:
    return PackRecord(1, 2, ("g0",), phase, "packed with job 1: trial", 10.0, 1.0, leaving)


def saved_record() -> dict[str, object]:
    """The record of `record()` as the book saves it."""
    book = PackBook()
    book.put(record())
    saved: dict[str, object] = book.save()["records"][0]
    return saved


def test_the_book_survives_a_save_and_restore() -> None:
    book = PackBook()
    book.put(record("unpacking", leaving=2))
    book.failed.add(frozenset((3, 4)))
    book.raised[3] = 26 * G
    book.oom_requeues[3] = (1, 2)
    again = PackBook()
    again.restore(book.save())
    assert again.save() == book.save()
    assert again.records[frozenset((1, 2))] == record("unpacking", leaving=2)


@pytest.mark.parametrize(
    "saved",
    [
        {"version": 2},
        {"version": 1},
        {"version": 1, "records": [{"host": 1}], "failed": [], "raised": {}, "oom_requeues": {}},
        {"version": 1, "records": [], "failed": [[1, "x"]], "raised": {}, "oom_requeues": {}},
        {**PackBook().save(), "records": [{**saved_record(), "phase": "half"}]},
    ],
    ids=["other version", "missing parts", "damaged record", "damaged pair", "unknown phase"],
)
def test_a_book_that_is_not_one_is_refused(saved: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="pack book"):
        PackBook().restore(saved)


def test_an_unpack_under_way_is_no_longer_a_pack_for_the_policy() -> None:
    book = PackBook()
    book.put(record("packing"))
    assert book.partners(1) == (2,) and book.partners(2) == (1,)
    book.step(book.records[frozenset((1, 2))], phase="unpacking", leaving=2)
    assert book.partners(1) == book.partners(2) == ()
    assert book.of(2) is not None, "the record stays until job 2 has left"


def test_what_concerns_only_ended_jobs_is_forgotten() -> None:
    book = PackBook()
    book.put(record())
    book.failed.update({frozenset((1, 2)), frozenset((3, 4))})
    book.raised.update({1: G, 3: G})
    assert book.prune([1, 2, 3])
    assert set(book.records) == {frozenset((1, 2))}
    assert book.failed == {frozenset((1, 2))}
    assert book.raised == {1: G, 3: G}
    assert not book.prune([1, 2, 3]), "nothing more to forget"


def test_the_anchor_is_the_member_computing_and_the_others_follow_it() -> None:
    views = {
        1: JobView(1, 0.0, gpu_uuids=("g0",), suspended=True),
        2: JobView(2, 0.0, gpu_uuids=("g0",)),
        3: JobView(3, 0.0),
        4: JobView(4, 0.0),
    }
    assert anchor_of({1, 2}, views) == 2, "computing beats parked"
    assert anchor_of({1, 3}, views) == 1, "holding GPUs beats waiting in the queue"
    assert anchor_of({3, 4}, views) == 3
    assert guests_of([(2, 1), (3, 4), (5,)], views) == {1: 2, 4: 3}


# Out of memory while packed: how much more the job needs.


def test_a_job_out_of_memory_needs_more_than_it_had_beside_its_partner() -> None:
    raised = raised_memory(known=12 * G, usable=38 * G, partner=12 * G, margin=0.1)
    assert raised > 26 * G and raised % MIB == 0
    assert raised + 12 * G > 38 * G, "the pair no longer fits: memory alone keeps them apart"


def test_a_job_known_to_need_more_keeps_a_margin_above_it() -> None:
    assert raised_memory(known=30 * G, usable=38 * G, partner=12 * G, margin=0.1) == 33 * G
