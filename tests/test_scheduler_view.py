"""Readiness and the policy's view, pure parts of the scheduler pass.

See the docstrings of gpuq/daemon/scheduler/readiness.py and view.py.
"""

from __future__ import annotations

from dataclasses import replace

from gpuq.daemon.scheduler.readiness import readiness
from gpuq.daemon.scheduler.view import ViewCache, build_state, new_model
from gpuq.daemon.state import GpuSnapshot
from gpuq.models import GpuInfo, Job, JobSpec, JobState, parse_dependency
from gpuq.policies.interface import GpuView, JobView

G = 1024**3
NOW = 1_000_000.0


def queued(job_id: int, **spec: object) -> Job:
    return Job(job_id, JobSpec(command=("true",), cwd="/", **spec), JobState.QUEUED)  # type: ignore[arg-type]


def states(**known: JobState) -> dict[int, JobState]:
    return {int(key.removeprefix("job")): value for key, value in known.items()}


def test_a_job_with_nothing_to_wait_for_is_ready() -> None:
    result = readiness([queued(1)], lambda _: None, {}, NOW)
    assert [job.id for job in result.ready] == [1]
    assert (result.waiting, result.never, result.next_begin) == ({}, {}, None)


def test_a_later_begin_waits_and_sets_when_to_look_again() -> None:
    result = readiness([queued(1, begin=NOW + 60)], lambda _: None, {}, NOW)
    assert result.ready == []
    assert result.waiting[1].startswith("begins at ")
    assert result.next_begin == NOW + 60


def test_a_retry_not_due_yet_waits_with_its_own_reason() -> None:
    job = Job(1, JobSpec(command=("true",), cwd="/"), JobState.QUEUED, retry_at=NOW + 4)
    result = readiness([job], lambda _: None, {}, NOW)
    assert (result.ready, result.waiting, result.next_begin) == ([], {}, NOW + 4)


def test_dependencies_wait_are_met_or_can_never_be_met() -> None:
    known = states(job5=JobState.RUNNING, job6=JobState.SUCCEEDED, job7=JobState.FAILED)
    pending = [
        queued(1, after=(parse_dependency("5"),)),
        queued(2, after=(parse_dependency("6:ok"),)),
        queued(3, after=(parse_dependency("7:ok"),)),
        queued(4, after=(parse_dependency("8:any"),)),  # 8 existed at submit, removed since
    ]
    result = readiness(pending, known.get, {}, NOW)
    assert [job.id for job in result.ready] == [2]
    assert result.waiting == {1: "waiting for job 5 (ok)"}
    assert result.never == {
        3: "dependency 7:ok can never be satisfied: job 7 failed",
        4: "dependency 8:any can never be satisfied: job 8 no longer exists",
    }


def test_an_array_limit_counts_running_tasks_and_tasks_started_in_this_pass() -> None:
    tasks = [
        Job(i, JobSpec(command=("true",), cwd="/", array_parallel=2), JobState.QUEUED, array_id=9)
        for i in (10, 11, 12)
    ]
    result = readiness(tasks, lambda _: None, {9: 1}, NOW)
    assert [job.id for job in result.ready] == [10]
    assert result.waiting == {
        11: "array limit: 2 tasks at a time",
        12: "array limit: 2 tasks at a time",
    }


def snapshot() -> GpuSnapshot:
    devices = [
        GpuInfo("g0", 0, "Fake", 40 * G, 0, node="n1"),
        GpuInfo("g1", 1, "Fake", 40 * G, 0, node="n1", link_group="link0"),
    ]
    return GpuSnapshot(devices=devices, foreign_memory={"g1": 2 * G})


def test_the_view_has_the_gpus_ready_jobs_and_running_jobs_with_their_reservations() -> None:
    running = Job(
        3,
        JobSpec(command=("true",), cwd="/", gpus=1, gpu_mem=6 * G, time_limit=60.0),
        JobState.RUNNING,
        submit_time=5.0,
        start_time=7.0,
        gpu_uuids=("g1",),
        gpu_mem_reserved=6 * G,
    )
    ready = [queued(1, gpus=2, priority=4), queued(2, gpus=1, gpu_mem_auto=True, name="fit")]
    state = build_state(ready, [running], snapshot(), 0.1, 512 * 1024**2, lambda job: 9 * G)
    assert [(n.name, n.gpus) for n in state.nodes] == [("n1", 2)]
    assert state.gpus == (
        GpuView("g0", "n1", 40 * G, 0, index=0),
        GpuView("g1", "n1", 40 * G, 2 * G, link_group="link0", index=1),
    )
    assert (state.memory_margin, state.foreign_tolerance) == (0.1, 512 * 1024**2)
    one, two, three = state.jobs  # in id order
    assert (one.gpus_requested, one.priority, one.gpu_uuids, one.allocation) == (2, 4, (), ())
    assert two.gpu_mem == 9 * G  # learned for --gpu-mem auto
    assert (three.gpu_uuids, three.allocation, three.gpu_mem) == (("g1",), (1,), 6 * G)
    assert (three.start_time, three.time_limit) == (7.0, 60.0)


def test_a_whole_gpu_job_started_with_a_reservation_as_a_packed_guest_is_no_memory_share() -> None:
    guest = Job(
        4,
        JobSpec(command=("true",), cwd="/", gpus=1),
        JobState.SUSPENDED,
        submit_time=5.0,
        start_time=7.0,
        gpu_uuids=("g0",),
        gpu_mem_reserved=6 * G,  # what the daemon reserved for it beside its host
    )
    (view,) = build_state([], [guest], snapshot(), 0.1, 0, lambda job: None).jobs
    assert (view.gpu_uuids, view.gpu_mem, view.suspended) == (("g0",), None, True)


def test_every_job_carries_its_run_time_and_service_and_running_ones_if_preemptible() -> None:
    spec = JobSpec(command=("true",), cwd="/", gpus=2)
    earlier = Job(1, spec, JobState.QUEUED, submit_time=1.0, run_seconds=30.0)
    running = Job(
        2,
        spec,
        JobState.RUNNING,
        submit_time=2.0,
        gpu_uuids=("g0", "g1"),
        run_seconds=10.0,
        running_since=NOW - 5.0,
    )
    state = build_state(
        [earlier], [running], snapshot(), 0.0, 0, lambda job: None, NOW, lambda job: job.id == 2
    )
    waiting, holding = state.jobs
    assert (waiting.run_time, waiting.attained_service) == (30.0, 60.0)
    assert (holding.run_time, holding.attained_service) == (15.0, 30.0)
    assert holding.preemptible


def test_every_attempt_after_the_first_counts_as_a_restart_for_pollux() -> None:
    spec = JobSpec(command=("true",), cwd="/", gpus=1, gpus_max=4)
    jobs = [
        Job(1, spec, JobState.QUEUED),
        Job(2, spec, JobState.QUEUED, attempts=2),  # resized or suspended once, restarting
    ]
    running = Job(3, spec, JobState.RUNNING, attempts=3, gpu_uuids=("g0",))
    state = build_state(jobs, [running], snapshot(), 0.0, 0, lambda job: None, NOW)
    assert [job.num_restarts for job in state.jobs] == [0, 1, 2]


def test_an_adaptive_job_asks_for_its_minimum_and_may_use_its_maximum() -> None:
    spec = JobSpec(command=("true",), cwd="/", gpus=1, gpus_max=8)
    rigid = JobSpec(command=("true",), cwd="/", gpus=2)
    state = build_state(
        [Job(1, spec, JobState.QUEUED), Job(2, rigid, JobState.QUEUED)],
        [],
        snapshot(),
        0.0,
        0,
        lambda job: None,
    )
    adaptive, fixed = state.jobs
    assert (adaptive.adaptive, adaptive.min_gpus, adaptive.max_gpus) == (True, 1, 8)
    assert (fixed.adaptive, fixed.min_gpus, fixed.max_gpus) == (False, 2, 2)


def test_what_a_runner_reported_becomes_the_jobs_model() -> None:
    spec = JobSpec(command=("true",), cwd="/", gpus=1, gpus_max=4)
    sample = {
        "time": NOW,
        "step": 40,
        "epoch": 2,
        "batch_size": 256,
        "replicas": 2,
        "memory_peak_bytes": 3 * G,
        "grad_sqr": 1.0,
        "grad_var": 50.0,
        "perf_params": [0.1, 0.01, 0.5, 0.05, 0.05, 0.01, 1.0],
        "batch_limits": [128, 2048, 16, 512],
    }
    silent = Job(2, spec, JobState.QUEUED)
    state = build_state(
        [Job(1, spec, JobState.QUEUED, attempts=1), silent],
        [],
        snapshot(),
        0.0,
        0,
        lambda job: None,
        NOW,
        measured={1: sample, 2: {}},
    )
    measured, unmeasured = state.jobs
    assert (measured.epoch, measured.batch_size, measured.memory_peak) == (2, 256, 3 * G)
    assert (measured.init_batch_size, measured.max_batch_size) == (128, 2048)
    assert (measured.local_bsz_bounds, measured.max_profiled_gpus) == ((16, 512), 2)
    assert measured.goodput is not None
    assert measured.goodput.init_batch_size == 128
    assert measured.goodput.grad.var == 50.0 / 128  # tr(Sigma) reported; the model's is per M0
    assert unmeasured.goodput is None and unmeasured.batch_size == 0


def test_a_sample_without_limits_gives_no_model() -> None:
    sample = {"time": NOW, "step": 1, "perf_params": [0.1] * 7, "grad_sqr": 1.0, "grad_var": 1.0}
    job = Job(1, JobSpec(command=("true",), cwd="/", gpus=1), JobState.QUEUED)
    [view] = build_state(
        [job], [], snapshot(), 0.0, 0, lambda job: None, NOW, measured={1: sample}
    ).jobs
    assert view.goodput is None


def test_a_waiting_jobs_view_is_kept_across_passes_until_what_it_is_made_of_changes() -> None:
    spec = JobSpec(command=("true",), cwd="/", gpus=1, gpus_max=4)
    sample: dict[str, object] = {"time": NOW, "epoch": 1, "batch_limits": [128, 2048, 16, 512]}
    job, other = Job(1, spec, JobState.QUEUED), Job(2, spec, JobState.QUEUED)
    cache = ViewCache()

    def views(ready: list[Job], samples: dict[int, dict[str, object]]) -> list[JobView]:
        state = build_state(
            ready, [], snapshot(), 0.0, 0, lambda job: None, NOW, measured=samples, cache=cache
        )
        return list(state.jobs)

    first = views([job, other], {1: sample})
    assert views([job, other], {1: sample})[0] is first[0]  # the same job and sample: kept
    requeued = replace(job, attempts=1)  # the daemon replaces a Job whenever it changes
    assert views([requeued, other], {1: sample})[0] is not first[0]
    newer = {**sample, "epoch": 2}
    assert views([requeued, other], {1: newer})[0].epoch == 2
    assert [view.id for view in views([other], {})] == [2]  # a job gone from the queue is gone


def test_a_running_jobs_run_time_moves_with_the_clock_even_with_a_cache() -> None:
    spec = JobSpec(command=("true",), cwd="/", gpus=1)
    running = Job(1, spec, JobState.RUNNING, gpu_uuids=("g0",), running_since=NOW)
    cache = ViewCache()
    for later in (10.0, 20.0):
        [view] = build_state(
            [], [running], snapshot(), 0.0, 0, lambda job: None, NOW + later, cache=cache
        ).jobs
        assert view.run_time == later


def test_a_sample_brings_a_new_model_when_its_fit_changed() -> None:
    fit = [0.1, 0.01, 0.5, 0.05, 0.05, 0.01, 1.0]
    assert new_model({}, {"perf_params": fit})
    assert not new_model({"perf_params": fit}, {"perf_params": list(fit), "grad_sqr": 2.0})
    assert new_model({"perf_params": fit}, {"perf_params": [0.2, *fit[1:]]})
    assert not new_model({"perf_params": fit}, {"step": 3})  # a sample without a model
