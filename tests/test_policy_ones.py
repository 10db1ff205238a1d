"""The `ones` policy, rule by rule (see the docstrings of gpuq/policies/ones/)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuq.goodput import GoodputFunction, GradParams, PerfParams
from gpuq.policies.interface import ClusterState, Decision, JobView, NodeView, capacity_violations
from gpuq.policies.ones.fitness import Progress, census, throughput_table, utilization
from gpuq.policies.ones.genome import (
    EMPTY,
    Assignment,
    Genome,
    Layout,
    counts_of_rows,
    decode,
    encode,
    from_counts,
    gene_rows,
    normalize,
    reorder,
    rule_batches,
    to_counts,
    violations,
)
from gpuq.policies.ones.limits import (
    BatchBounds,
    LimitState,
    effective_limit,
    job_rules,
    observe,
    ran,
    reject,
    start,
    warming_up,
)
from gpuq.policies.ones.operators import Context, crossover, fill, mutate, pin, refresh
from gpuq.policies.ones.policy import OnesPolicy

PERF = PerfParams(0.05, 0.002, 0.3, 0.02, 0.05, 0.005, 1.2)
MODEL = GoodputFunction(PERF, GradParams(1.0, 50.0), 128)


def job(job_id: int, **fields: object) -> JobView:
    """A CIFAR-like job: M0 128, at most 4096, 32-1024 per GPU, with a model and an oracle."""
    defaults: dict[str, object] = {
        "submit_time": float(job_id),
        "batch_size": 128,
        "init_batch_size": 128,
        "max_batch_size": 4096,
        "local_bsz_bounds": (32, 1024),
        "goodput": MODEL,
        "remaining_iterations": 1000.0,
    }
    defaults.update(fields)
    return JobView(job_id, **defaults)  # type: ignore[arg-type]


def cluster(*jobs: JobView, nodes: int = 2, per_node: int = 4) -> ClusterState:
    return ClusterState(tuple(NodeView(f"n{i}", per_node) for i in range(nodes)), jobs)


def context(
    jobs: list[JobView], layout: Layout, limits: list[int] | None = None, seed: int = 0
) -> Context:
    """Operator inputs: limits at the maximum unless given, exact remaining work, no pins."""
    bounds = [BatchBounds.of(j) for j in jobs]
    limit = limits or [b.max_total for b in bounds]
    rules = job_rules([j.id for j in jobs], bounds, limit, layout.gpus)
    work = [
        None if j.remaining_iterations is None else j.remaining_iterations * j.batch_size
        for j in jobs
    ]
    return Context(
        rules,
        layout,
        throughput_table(jobs, rules, layout),
        Progress.of(work, [w or 0.0 for w in work], math.inf),
        np.asarray(limit, dtype=np.int64),
        np.array([not j.running for j in jobs], dtype=np.bool_),
        np.argsort([j.submit_time for j in jobs], kind="stable").astype(np.int64),
        np.random.default_rng(seed),
        np.asarray(layout.node_gpus, dtype=np.int64),
        np.zeros(len(jobs), dtype=np.bool_),
        np.zeros((len(jobs), layout.nodes), dtype=np.int64),
    )


# Genome ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [
        pytest.param({}, id="idle"),
        pytest.param({1: Assignment((2, 0), 256)}, id="one-job"),
        pytest.param({1: Assignment((1, 2), 301), 2: Assignment((3, 0), 3)}, id="uneven-split"),
        pytest.param({5: Assignment((4, 4), 4096)}, id="whole-cluster"),
    ],
)
def test_encode_then_decode_gives_back_the_schedule(schedule: dict[int, Assignment]) -> None:
    layout = Layout((4, 4))
    assert decode(encode(schedule, layout), layout) == schedule


def test_a_genome_has_one_gene_per_gpu_so_no_gpu_holds_two_jobs() -> None:
    layout = Layout((2, 2))
    genome = encode({1: Assignment((2, 0), 64), 2: Assignment((0, 1), 32)}, layout)
    assert genome.jobs.tolist() == [1, 1, 2, EMPTY]
    assert genome.local_bsz.tolist() == [32, 32, 32, 0]


def test_encode_refuses_an_overcommitted_node_unless_lenient() -> None:
    layout = Layout((2,))
    schedule = {1: Assignment((2,), 64), 2: Assignment((1,), 32)}
    with pytest.raises(ValueError, match="free GPUs"):
        encode(schedule, layout)
    assert decode(encode(schedule, layout, strict=False), layout) == {1: Assignment((2,), 64)}


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_counts_and_genomes_convert_both_ways(data: st.DataObject) -> None:
    layout = Layout(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    jobs = [job(i) for i in range(data.draw(st.integers(1, 5)))]
    rules = job_rules([j.id for j in jobs], [BatchBounds.of(j) for j in jobs], [4096] * 5, 16)
    counts = np.zeros((len(jobs), layout.nodes), dtype=np.int64)
    for node, size in enumerate(layout.node_gpus):
        for _ in range(data.draw(st.integers(0, size))):
            counts[data.draw(st.integers(0, len(jobs) - 1)), node] += 1
    batch = rule_batches(counts, rules)
    genome = from_counts(counts, batch, rules, layout)
    assert violations(genome, rules, layout) == []
    again, again_batch = to_counts(genome, rules, layout)
    assert again.tolist() == counts.tolist()
    assert again_batch.tolist() == batch.tolist()


# Batch bounds and limits ---------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "limit", "batch"),
    [
        pytest.param(1, 256, 256, id="limit-fits-on-one-gpu"),
        pytest.param(1, 4096, 1024, id="one-gpu-holds-at-most-its-local-max"),
        pytest.param(4, 4096, 4096, id="four-gpus-reach-the-max"),
        pytest.param(8, 128, 0, id="too-many-gpus-for-the-limit"),
        pytest.param(4, 128, 128, id="limit-spread-over-four"),
        pytest.param(0, 4096, 0, id="no-gpus"),
    ],
)
def test_ones_runs_the_largest_batch_its_limit_and_gpus_allow(
    gpus: int, limit: int, batch: int
) -> None:
    bounds = BatchBounds.of(job(1))
    assert bounds.batch_for(gpus, limit) == batch


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 64),
    st.integers(0, 4096),
    st.integers(1, 64),
    st.integers(1, 512),
    st.integers(1, 12),
    st.integers(1, 5000),
)
def test_vectorized_rules_match_batch_for(
    init: int, extra: int, low: int, span: int, cap: int, limit: int
) -> None:
    bounds = BatchBounds.of(
        job(
            1,
            init_batch_size=init,
            batch_size=init,
            max_batch_size=init + extra,
            local_bsz_bounds=(low, low + span),
            max_gpus=cap,
        )
    )
    rules = job_rules([1], [bounds], [limit], 16)
    expected = [bounds.batch_for(n, limit) for n in range(17)]
    assert rules.batch[0].tolist() == expected
    allowed = [n for n in range(17) if expected[n]]
    assert (rules.n_min[0], rules.n_max[0]) == ((allowed[0], allowed[-1]) if allowed else (0, 0))
    assert allowed == list(range(allowed[0], allowed[-1] + 1)) if allowed else True


@pytest.mark.parametrize(
    ("fields", "first"),
    [
        pytest.param({}, 128, id="user-batch-on-one-gpu"),
        pytest.param({"batch_size": 2048}, 1024, id="capped-at-one-gpu"),
        pytest.param({"batch_size": 64}, 128, id="never-below-init"),
        pytest.param({"local_bsz_bounds": (8, 64)}, 128, id="init-wider-than-one-gpu"),
        pytest.param({"max_batch_size": 0, "batch_size": 512}, 512, id="fixed-batch-job"),
    ],
)
def test_start_limits_a_new_job_to_one_gpus_worth(fields: dict[str, object], first: int) -> None:
    view = job(1, **fields)
    state = start(view, BatchBounds.of(view))
    assert (state.limit, state.floor, state.running) == (first, first, False)


BOUNDS = BatchBounds(128, 4096, 32, 1024, 64)
WARM = LimitState(limit=512, floor=128, epoch=3, batch=512, running=True)


@pytest.mark.parametrize(
    ("before", "epoch", "running", "after"),
    [
        pytest.param(WARM, 3, True, 512, id="no-new-epoch-no-change"),
        pytest.param(WARM, 4, True, 1024, id="scale-up-doubles-per-epoch"),
        pytest.param(WARM, 5, True, 2048, id="two-epochs-two-doublings"),
        pytest.param(WARM, 9, True, 4096, id="capped-at-max-batch"),
        pytest.param(replace(WARM, batch=256), 4, True, 512, id="doubles-the-batch-it-ran"),
        pytest.param(replace(WARM, limit=2048), 3, False, 512, id="preempted-keeps-its-batch"),
        pytest.param(replace(WARM, running=False, limit=2048), 4, False, 2048, id="waiting"),
    ],
)
def test_limit_transitions_on_observation(
    before: LimitState, epoch: int, running: bool, after: int
) -> None:
    view = job(1, allocation=(1,) if running else (), epoch=epoch)
    assert observe(before, view, BOUNDS).limit == after


@pytest.mark.parametrize(
    ("run_time", "floor", "max_gpus"),
    [
        pytest.param(0.0, 128, 1, id="new-job-on-one-gpu"),
        pytest.param(59.0, 2048, 2, id="start-batch-wider-than-one-gpu"),
        pytest.param(60.0, 128, 64, id="warmed-up"),
    ],
)
def test_warm_up_keeps_a_job_on_the_fewest_gpus_for_its_start_batch(
    run_time: float, floor: int, max_gpus: int
) -> None:
    state = LimitState(floor, floor, 0)
    assert warming_up(BOUNDS, state, run_time, 60.0).max_gpus == max_gpus


@pytest.mark.parametrize(
    ("limit", "after"),
    [
        pytest.param(1024, 512, id="rejection-halves"),
        pytest.param(200, 128, id="not-below-the-floor"),
        pytest.param(128, 128, id="at-the-floor"),
    ],
)
def test_each_rejection_halves_the_limit_down_to_the_floor(limit: int, after: int) -> None:
    assert reject(LimitState(limit, 128, 0)).limit == after


def test_deployment_records_the_batch_a_job_runs_with() -> None:
    state = LimitState(1024, 128, 0)
    assert ran(state, 512) == LimitState(1024, 128, 0, batch=512, running=True)
    assert ran(state, 0) == state


@pytest.mark.parametrize(
    ("run_time", "rate", "intervals", "limit"),
    [
        pytest.param(100.0, 0.01, 1.0, 2048, id="shorter-than-one-gap"),
        pytest.param(400.0, 0.01, 1.0, 512, id="four-gaps-quarter-limit"),
        pytest.param(400.0, 0.01, 2.0, 1024, id="grace-of-two-gaps"),
        pytest.param(1e6, 0.01, 1.0, 128, id="floor"),
        pytest.param(1e6, None, 1.0, 2048, id="no-arrival-rate-no-penalty"),
    ],
)
def test_scale_down_penalizes_long_running_jobs(
    run_time: float, rate: float | None, intervals: float, limit: int
) -> None:
    state = LimitState(2048, 128, 0)
    assert effective_limit(state, run_time, rate, intervals) == limit


# Fitness ---------------------------------------------------------------------


def test_a_degenerate_beta_gives_exact_sruf() -> None:
    layout = Layout((4, 4))
    jobs = [job(1, remaining_iterations=100.0), job(2, remaining_iterations=300.0)]
    ctx = context(jobs, layout)
    progress = Progress.of([100.0 * 128, 300.0 * 128], [500.0 * 128, 300.0 * 128], math.inf)
    assert progress.sample(np.random.default_rng(0)).tolist() == [12800.0, 38400.0]
    counts = np.array([[[2, 0], [0, 1]]])
    score = utilization(census(counts), ctx.table, progress.sample(np.random.default_rng(0)))
    x1 = MODEL.throughput(1, 2, 1024, 0)  # batch 2048 (the limit allows 4096) over 2 GPUs
    x2 = MODEL.throughput(1, 1, 1024, 0)
    assert score[0] == pytest.approx(2 * 12800 / x1 + 1 * 38400 / x2)


def test_sampled_progress_has_its_mode_at_the_oracle_progress() -> None:
    progress = Progress.of([300.0, None], [1000.0, 0.0], 20.0)
    alpha, beta = progress.alpha[0], progress.beta[0]
    assert (alpha - 1) / (alpha + beta - 2) == pytest.approx(0.7)
    rng = np.random.default_rng(1)
    draws = np.array([progress.sample(rng) for _ in range(2000)])
    assert (draws[:, 0] >= 0).all() and (draws[:, 0] <= 1000).all()
    assert (draws[:, 1] == 300.0).all()  # unknown work: the median of the known, no noise


def test_the_score_charges_a_restart_for_every_moved_job() -> None:
    layout = Layout((2, 2))
    jobs = [job(1), job(2)]
    ctx = context(jobs, layout)
    live = np.array([[1, 0], [0, 1]])
    moved = np.array([[[0, 1], [0, 1]]])
    work = np.array([[1.0, 1.0]])
    plain = utilization(census(moved, live), ctx.table, work)
    charged = utilization(census(moved, live), ctx.table, work, restart_penalty=30.0)
    assert charged[0] - plain[0] == pytest.approx(30.0)


def test_throughput_depends_on_the_nodes_a_job_spans() -> None:
    layout = Layout((2, 2))
    jobs = [job(1)]
    table = context(jobs, layout).table
    assert 0 < table[0, 2, 2] < table[0, 2, 1]
    assert table[0, 0].tolist() == [0.0, 0.0, 0.0]


# Operators -------------------------------------------------------------------

SYNC_BOUND = GoodputFunction(
    PerfParams(0.01, 0.0001, 2.0, 0.5, 1.0, 0.1, 1.0), GradParams(1, 1), 128
)


def counts_of(ctx: Context, schedule: dict[int, Assignment]) -> np.ndarray:
    return to_counts(encode(schedule, ctx.layout), ctx.rules, ctx.layout)[0]


def test_refresh_frees_the_gpus_of_finished_jobs() -> None:
    layout = Layout((2,))
    ctx = context([job(1, allocation=(1,), goodput=SYNC_BOUND)], layout)
    genome = encode({1: Assignment((1,), 1024), 99: Assignment((1,), 1024)}, layout)
    counts = refresh(genome, ctx)
    assert counts.tolist() == [[1]]  # job 99 is gone; job 1 gains nothing from a second GPU


def test_refresh_shrinks_an_over_limit_job_by_whole_gpus() -> None:
    layout = Layout((4,))
    ctx = context([job(1, allocation=(4,), goodput=SYNC_BOUND)], layout, limits=[512])
    counts = refresh(encode({1: Assignment((4,), 1024)}, layout), ctx)
    assert counts.tolist() == [[2]]  # 256 per GPU kept: 512 / 256 = 2 GPUs
    assert rule_batches(counts, ctx.rules).tolist() == [512]


def test_refresh_places_a_new_job_by_taking_a_gpu_from_the_largest_job() -> None:
    layout = Layout((4,))
    jobs = [job(1, allocation=(3,)), job(2, allocation=(1,)), job(3)]
    ctx = context(jobs, layout)
    genome = encode({1: Assignment((3,), 3072), 2: Assignment((1,), 1024)}, layout)
    assert refresh(genome, ctx).tolist() == [[2], [1], [1]]


def test_refresh_does_not_preempt_jobs_at_their_fewest_gpus_for_a_new_job() -> None:
    layout = Layout((2,))
    jobs = [job(1, allocation=(1,)), job(2, allocation=(1,)), job(3)]
    ctx = context(jobs, layout)
    genome = encode({1: Assignment((1,), 1024), 2: Assignment((1,), 1024)}, layout)
    assert refresh(genome, ctx).tolist() == [[1], [1], [0]]


def test_fill_gives_an_idle_gpu_to_the_job_with_the_largest_gain() -> None:
    layout = Layout((1,))
    jobs = [job(1, remaining_iterations=900.0), job(2, remaining_iterations=100.0)]
    ctx = context(jobs, layout)
    counts = np.zeros((2, 1), dtype=np.int64)
    fill(counts, ctx, ctx.everyone)
    assert counts.tolist() == [[0], [1]]  # same speed, less work: the larger completion rate


def test_fill_without_scale_up_only_starts_waiting_jobs() -> None:
    layout = Layout((4,))
    ctx = context([job(1, allocation=(1,)), job(2)], layout)
    counts = counts_of(ctx, {1: Assignment((1,), 1024)})
    fill(counts, ctx, ctx.everyone, scale_up=False)
    assert counts.tolist() == [[1], [1]]


def test_crossover_of_a_candidate_with_itself_gives_it_back() -> None:
    layout = Layout((4, 4))
    jobs = [job(1), job(2), job(3)]
    ctx = context(jobs, layout)
    parent = refresh(Genome.empty(8), ctx)
    genes = gene_rows(parent, layout)
    first, second = crossover(genes, genes, ctx)
    assert first.tolist() == second.tolist() == parent.tolist()


def test_memoized_operators_give_what_a_fresh_context_computes_and_draw_the_same() -> None:
    layout = Layout((4, 4))
    jobs = [job(1), job(2, remaining_iterations=50.0), job(3)]
    warm = context(jobs, layout, seed=4)
    members = [refresh(Genome.empty(8), warm) for _ in range(3)]
    genes = [gene_rows(counts, layout) for counts in members]
    for _ in range(2):  # the second round hits the memo
        state = warm.rng.bit_generator.state
        cold = context(jobs, layout, seed=4)
        cold.rng.bit_generator.state = state
        for a, b in ((0, 1), (1, 2), (0, 0)):
            from_warm, from_cold = (
                crossover(genes[a], genes[b], warm),
                crossover(genes[a], genes[b], cold),
            )
            assert [c.tolist() for c in from_warm] == [c.tolist() for c in from_cold]
        assert refresh(Genome.empty(8), warm).tolist() == refresh(Genome.empty(8), cold).tolist()
        assert warm.rng.bit_generator.state == cold.rng.bit_generator.state
    assert warm.memo


def test_gene_rows_name_the_job_row_of_every_gene_of_the_genome() -> None:
    layout = Layout((4, 4))
    jobs = [job(1), job(2), job(3)]
    ctx = context(jobs, layout)
    counts = np.array([[1, 2], [0, 1], [2, 0]], dtype=np.int64)
    genome = from_counts(counts, rule_batches(counts, ctx.rules), ctx.rules, layout)
    genes = gene_rows(counts, layout)
    assert genes.tolist() == [0, 2, 2, EMPTY, 0, 0, 1, EMPTY]
    assert genes.tolist() == ctx.rules.rows(genome.jobs).tolist()
    assert counts_of_rows(genes, 3, layout).tolist() == counts.tolist()


@pytest.mark.parametrize(("rate", "same"), [(0.0, True), (1.0, False)])
def test_mutation_preempts_jobs_at_its_rate_and_refills_from_the_others(
    rate: float, same: bool
) -> None:
    layout = Layout((2,))
    jobs = [job(1, allocation=(1,)), job(2, allocation=(1,)), job(3), job(4)]
    ctx = context(jobs, layout)
    counts = counts_of(ctx, {1: Assignment((1,), 1024), 2: Assignment((1,), 1024)})
    child = mutate(counts, ctx, rate)
    assert (child.tolist() == counts.tolist()) is same
    if not same:
        assert child.tolist() == [[0], [0], [1], [1]]


def test_reorder_packs_a_scattered_job_and_leaves_compact_ones_alone() -> None:
    layout = Layout((4, 4, 4))
    counts = np.array([[1, 1, 0], [0, 0, 3], [2, 0, 0]])
    reorder(counts, layout)
    assert counts.tolist() == [[2, 0, 0], [0, 0, 3], [2, 0, 0]]


def test_pin_puts_held_jobs_back_on_their_live_gpus_and_evicts_others() -> None:
    layout = Layout((2, 2))
    ctx = context([job(1), job(2), job(3)], layout)
    live = np.array([[2, 0], [0, 0], [0, 0]])
    ctx = replace(ctx, pinned=np.array([True, False, False]), live=live)
    counts = np.array([[0, 2], [1, 0], [1, 0]])
    pin(counts, ctx)
    assert counts.tolist() == [[2, 0], [0, 0], [0, 0]]
    counts = np.array([[0, 0], [2, 0], [0, 2]])
    pin(counts, ctx)
    assert counts.tolist() == [[2, 0], [0, 0], [0, 2]]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Context, list[Genome]]:
    """Random cluster, jobs with random bounds and limits, and random (invalid) genomes."""
    layout = Layout(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    jobs = []
    for i in range(draw(st.integers(1, 8))):
        low = draw(st.sampled_from([1, 8, 32]))
        init = draw(st.sampled_from([8, 64, 128]))
        jobs.append(
            job(
                i,
                init_batch_size=init,
                batch_size=init,
                max_batch_size=draw(st.sampled_from([0, init, 4 * init, 64 * init])),
                local_bsz_bounds=(low, low * draw(st.sampled_from([1, 4, 32]))),
                max_gpus=draw(st.integers(1, 8)),
                remaining_iterations=draw(st.floats(1, 1e4)),
                allocation=draw(st.sampled_from([(), (1,)])),
                goodput=draw(st.sampled_from([MODEL, SYNC_BOUND, None])),
            )
        )
    limits = [draw(st.integers(1, 8192)) for _ in jobs]
    ctx = context(jobs, layout, limits, seed=draw(st.integers(0, 99)))
    if draw(st.booleans()):  # some running jobs are held where they are
        live = refresh(Genome.empty(layout.gpus), ctx)
        held = np.array([draw(st.booleans()) for _ in jobs]) & (live.sum(axis=1) > 0)
        ctx = replace(ctx, pinned=held, live=live)
    choices = st.sampled_from([EMPTY, 99, *range(len(jobs))])
    genomes = [
        Genome(
            np.array(draw(st.lists(choices, min_size=layout.gpus, max_size=layout.gpus))),
            np.array(
                draw(st.lists(st.integers(1, 512), min_size=layout.gpus, max_size=layout.gpus))
            ),
        )
        for _ in range(2)
    ]
    return ctx, genomes


def assert_valid(counts: np.ndarray, ctx: Context) -> None:
    assert (counts.sum(axis=0) <= ctx.capacity).all()
    assert counts[ctx.pinned].tolist() == ctx.live[ctx.pinned].tolist()
    genome = from_counts(counts, rule_batches(counts, ctx.rules), ctx.rules, ctx.layout)
    assert violations(genome, ctx.rules, ctx.layout) == []


@settings(max_examples=80, deadline=None)
@given(scenarios())
def test_every_operator_keeps_exclusive_gpus_and_batch_limits(
    scenario: tuple[Context, list[Genome]],
) -> None:
    ctx, (a, b) = scenario
    refreshed = [refresh(g, ctx) for g in (a, b)]
    for counts in refreshed:
        assert_valid(counts, ctx)
    genes = [gene_rows(c, ctx.layout) for c in refreshed]
    for child in crossover(genes[0], genes[1], ctx):
        assert_valid(child, ctx)
    for rate in (0.3, 1.0):
        assert_valid(mutate(refreshed[0], ctx, rate), ctx)
    counts = refreshed[1].copy()
    reorder(counts, ctx.layout, ctx.pinned)
    assert_valid(counts, ctx)
    assert counts.sum(axis=1).tolist() == refreshed[1].sum(axis=1).tolist()
    raw, _ = to_counts(a, ctx.rules, ctx.layout)
    pin(raw, ctx)
    normalize(raw, ctx.rules, ctx.pinned)
    assert_valid(raw, ctx)


# The policy --------------------------------------------------------------------


def apply(state: ClusterState, decision: Decision, epochs: int = 0) -> ClusterState:
    """Run `decision` for a tick: running jobs advance `epochs` epochs."""
    jobs = []
    for view in state.jobs:
        allocation = tuple(decision.allocations.get(view.id, ()))
        jobs.append(
            replace(
                view,
                allocation=allocation,
                batch_size=decision.batch_sizes.get(view.id, view.batch_size),
                epoch=view.epoch + (epochs if any(allocation) else 0),
                run_time=view.run_time + (60.0 if any(allocation) else 0.0),
            )
        )
    return replace(state, jobs=tuple(jobs))


def gpus_of(decision: Decision) -> dict[int, int]:
    return {job_id: sum(a) for job_id, a in decision.allocations.items()}


def test_ones_chooses_batch_sizes_itself() -> None:
    assert (OnesPolicy.name, OnesPolicy.capabilities.adaptive_jobs) == ("ones", False)
    assert OnesPolicy().decide(cluster(), 0.0) == Decision()


def test_new_jobs_start_on_one_gpu_with_one_gpus_worth() -> None:
    decision = OnesPolicy().decide(cluster(job(1), job(2, batch_size=2048)), 0.0)
    assert gpus_of(decision) == {1: 1, 2: 1}
    assert decision.batch_sizes == {1: 128, 2: 1024}


def test_the_batch_at_most_doubles_per_completed_epoch() -> None:
    policy = OnesPolicy(seed=1)
    state = cluster(job(1), nodes=1, per_node=8)
    batches = []
    for _ in range(5):
        decision = policy.decide(state, 0.0)
        batches.append(decision.batch_sizes[1])
        state = apply(state, decision, epochs=1)
    assert batches == [128, 256, 512, 1024, 2048]


def test_running_jobs_change_only_after_each_finished_an_epoch() -> None:
    policy = OnesPolicy(seed=2)
    state = cluster(job(1), job(2), nodes=1, per_node=8)
    first = policy.decide(state, 0.0)
    state = apply(state, first)
    state = replace(state, jobs=(replace(state.jobs[0], epoch=1), state.jobs[1]))
    held = policy.decide(state, 60.0)
    assert held.allocations == first.allocations
    assert held.batch_sizes == first.batch_sizes
    assert "held until every running job finishes an epoch" in held.notes[1]
    state = apply(state, held, epochs=1)
    changed = policy.decide(state, 120.0)
    assert changed != held
    assert changed.batch_sizes[1] == 256  # two epochs done, but one doubling of what it ran
    assert set(changed.batch_sizes.values()) <= {128, 256}


def test_with_per_job_gating_only_jobs_that_finished_an_epoch_change() -> None:
    policy = OnesPolicy(seed=2, gating="job")
    state = cluster(job(1), job(2), nodes=1, per_node=8)
    first = policy.decide(state, 0.0)
    state = apply(state, first)
    state = replace(state, jobs=(replace(state.jobs[0], epoch=1), state.jobs[1]))
    second = policy.decide(state, 60.0)
    assert (second.allocations[2], second.batch_sizes[2]) == (first.allocations[2], 128)
    assert second.notes[2].endswith("held until it finishes an epoch")
    assert second.batch_sizes[1] == 256


@pytest.mark.parametrize(("fill_idle", "started"), [(True, {3: 1}), (False, {})])
def test_between_changes_idle_gpus_go_to_waiting_jobs_only_if_allowed(
    fill_idle: bool, started: dict[int, int]
) -> None:
    policy = OnesPolicy(seed=3, fill_between_updates=fill_idle)
    state = cluster(job(1), job(2), nodes=1, per_node=4)
    first = policy.decide(state, 0.0)
    state = apply(state, first)
    state = replace(state, jobs=(*state.jobs, job(3)))
    held = policy.decide(state, 60.0)
    assert {k: v for k, v in gpus_of(held).items() if k == 3} == started
    assert {k: held.allocations[k] for k in (1, 2)} == dict(first.allocations)


def test_max_hold_lifts_the_gate_when_epochs_stall() -> None:
    policy = OnesPolicy(seed=4, mutation_rate=1.0, max_hold=300.0)
    state = cluster(job(1), job(2), nodes=1, per_node=2)
    state = apply(state, policy.decide(state, 0.0))
    state = replace(state, jobs=(*state.jobs, job(3, remaining_iterations=1.0)))
    assert 3 not in policy.decide(state, 60.0).allocations
    assert 3 in policy.decide(state, 300.0).allocations  # far shorter than the others


def test_a_preempted_job_keeps_its_batch_as_limit_then_halves_per_rejection() -> None:
    policy = OnesPolicy(seed=5, mutation_rate=1.0)
    state = cluster(job(1, remaining_iterations=1e6), nodes=1, per_node=1)
    for tick in range(3):
        decision = policy.decide(state, 60.0 * tick)
        state = apply(state, decision, epochs=1)
    assert decision.batch_sizes == {1: 512}
    state = replace(state, jobs=(*state.jobs, job(2, remaining_iterations=10.0)))
    limits = []
    for tick in range(3, 6):
        decision = policy.decide(state, 60.0 * tick)
        assert gpus_of(decision) == {2: 1}  # the short job runs; its batch grows each epoch
        limits.append(policy.limit_state(1).limit)  # type: ignore[union-attr]
        state = apply(state, decision, epochs=1)
    assert limits == [1024, 256, 128]  # doubled, then 512 on preemption, halved per change


def check_decision(state: ClusterState, decision: Decision) -> None:
    assert capacity_violations(state, decision) == []
    assert decision.allocations.keys() == decision.batch_sizes.keys()
    views = {view.id: view for view in state.jobs}
    for job_id, allocation in decision.allocations.items():
        bounds = BatchBounds.of(views[job_id])
        gpus, batch = sum(allocation), decision.batch_sizes[job_id]
        assert 1 <= gpus <= bounds.max_gpus
        assert bounds.min_total <= batch <= bounds.max_total
        assert gpus * bounds.local_min <= batch <= gpus * bounds.local_max


@st.composite
def states(draw: st.DrawFn) -> ClusterState:
    """A random cluster whose running jobs fit, with random jobs and models."""
    nodes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    free = list(nodes)
    jobs = []
    for i in range(draw(st.integers(0, 10))):
        allocation = tuple(draw(st.integers(0, f)) if draw(st.booleans()) else 0 for f in free)
        free = [f - a for f, a in zip(free, allocation, strict=True)]
        init = draw(st.sampled_from([8, 128]))
        low = draw(st.sampled_from([1, 4, 32]))
        jobs.append(
            job(
                i,
                allocation=allocation,
                init_batch_size=init,
                batch_size=draw(st.sampled_from([init, 2 * init, 16 * init])),
                max_batch_size=draw(st.sampled_from([0, 8 * init, 64 * init])),
                local_bsz_bounds=(low, low * draw(st.sampled_from([1, 8, 64]))),
                max_gpus=draw(st.integers(1, 16)),
                epoch=draw(st.integers(0, 3)),
                run_time=draw(st.floats(0, 1e4)),
                remaining_iterations=draw(st.one_of(st.none(), st.floats(0, 1e5))),
                goodput=draw(st.sampled_from([MODEL, SYNC_BOUND, None])),
            )
        )
    return ClusterState(tuple(NodeView(f"n{i}", g) for i, g in enumerate(nodes)), tuple(jobs))


@settings(max_examples=40, deadline=None)
@given(states(), st.integers(0, 3), st.sampled_from(["global", "job"]))
def test_decisions_fit_the_cluster_and_the_batch_bounds(
    state: ClusterState, seed: int, gating: str
) -> None:
    policy = OnesPolicy(seed=seed, population=6, arrival_rate=0.01, gating=gating)
    for tick in range(3):
        decision = policy.decide(state, 60.0 * tick)
        check_decision(state, decision)
        state = apply(state, decision, epochs=tick % 2)


@settings(max_examples=15, deadline=None)
@given(states())
def test_the_same_seed_and_states_give_the_same_decisions(state: ClusterState) -> None:
    first, second = OnesPolicy(seed=7, population=4), OnesPolicy(seed=7, population=4)
    for tick in range(3):
        decision = first.decide(state, 60.0 * tick)
        assert second.decide(state, 60.0 * tick) == decision
        state = apply(state, decision, epochs=1)
