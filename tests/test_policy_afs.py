"""AFS on throughput tables: comparator (3), AFS-L, AFS-P and processor sharing.

The rules are in the docstring of gpuq/policies/afs/core.py; the test vectors
are those of optimus_afs.md C.2 item 4, computed by hand from Algorithm 1.
The policy on cluster states is tested in test_policy_afs_policy.py, packing
and placement in test_policy_afs_packing.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuq.policies.afs.core import (
    AfsJob,
    afs_l,
    afs_p,
    peak_gpus,
    prefers_longer,
    processor_sharing,
    tie_winner,
)

positive = st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False)
gain = st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def now_next(draw: st.DrawFn) -> tuple[float, float]:
    """A job's throughput now and with one GPU more, never lower (p' >= p)."""
    now = draw(positive)
    return now, now + draw(gain)


@st.composite
def sublinear_tables(draw: st.DrawFn, max_gpus: int = 6) -> tuple[float, ...]:
    """thr[0..K]: increasing, strictly sublinear (each GPU adds less than thr(1))."""
    first = draw(st.floats(1.0, 100.0))
    table = [0.0, first]
    for _ in range(draw(st.integers(1, max_gpus - 1))):
        table.append(table[-1] + first * draw(st.floats(0.01, 0.95)))
    return tuple(table)


# -- comparator (3) ---------------------------------------------------------


@pytest.mark.parametrize(
    ("shorter", "longer", "expected"),
    [
        # (3): (p'_b - p_b) / p'_b  >  (p'_a - p_a) / p_a
        ((10, 18), (10, 20), False),  # 0.5 vs 0.8: the shorter job keeps priority
        ((18, 24), (10, 20), True),  # 0.5 vs 0.333: the longer, efficient job wins
        ((10, 15), (10, 20), False),  # 0.5 vs 0.5: equal sides, strict ">" is false
        ((0, 10), (10, 20), False),  # a job with no GPU yet: infinite right side
        ((10, 11), (0, 10), True),  # the longer job has no GPU: 1 > 0.1
        ((10, 20), (0, 10), False),  # ... but not against linear scaling: 1 > 1 fails
    ],
)
def test_comparator_is_inequality_3_with_strict_greater(
    shorter: tuple[float, float], longer: tuple[float, float], expected: bool
) -> None:
    assert prefers_longer(*shorter, *longer) is expected


@given(now_next(), now_next())
def test_comparator_is_never_true_in_both_role_orders(
    a: tuple[float, float], b: tuple[float, float]
) -> None:
    assert not (prefers_longer(*a, *b) and prefers_longer(*b, *a))


@given(now_next(), now_next(), now_next())
def test_comparator_is_transitive(
    a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]
) -> None:
    # Appendix C: b beats a and c beats b, so c beats a.
    if prefers_longer(*a, *b) and prefers_longer(*b, *c):
        assert prefers_longer(*a, *c)


def avg_jct_gain_b1(
    w_a: Fraction, p_a: Fraction, q_a: Fraction, p_b: Fraction, q_b: Fraction, q_b2: Fraction
) -> Fraction:
    """Eq. (1): avgJCT(a) - avgJCT(b1); q is p' (one GPU more), q_b2 is p'_{b,2}."""
    return w_a / q_a - w_a / p_a + w_a / (2 * q_b2) * (q_b / p_a - p_b / q_a)


def avg_jct_gain_b2(
    w_a: Fraction,
    w_b: Fraction,
    p_a: Fraction,
    q_a: Fraction,
    p_b: Fraction,
    q_b: Fraction,
    q_a2: Fraction,
    q_b2: Fraction,
) -> Fraction:
    """Eq. (2): avgJCT(a) - avgJCT(b2)."""
    return (
        w_a / q_a
        - w_b / q_b
        + p_b / (2 * q_b2) * (w_b / p_b - w_a / q_a)
        - p_a / (2 * q_a2) * (w_a / p_a - w_b / q_b)
    )


fractions = st.fractions(min_value=Fraction(1, 100), max_value=100)


@given(fractions, fractions, fractions, fractions, fractions, fractions)
def test_eq_1_and_2_under_the_afs_assumption_are_a_multiple_of_3(
    w_a: Fraction, w_b: Fraction, p_a: Fraction, q_a: Fraction, p_b: Fraction, q_b: Fraction
) -> None:
    # p'_{a,2} = p_{a,1} and p'_{b,2} = p'_{b,1}: both equal (w_a / 2p'_a) (LHS - RHS).
    lhs, rhs = (q_b - p_b) / q_b, (q_a - p_a) / p_a
    expected = w_a / (2 * q_a) * (lhs - rhs)
    assert avg_jct_gain_b1(w_a, p_a, q_a, p_b, q_b, q_b2=q_b) == expected
    assert avg_jct_gain_b2(w_a, w_b, p_a, q_a, p_b, q_b, q_a2=p_a, q_b2=q_b) == expected
    # Hence (1) is positive exactly when (3) holds, whatever the lengths (away
    # from equality, where converting to floats may round either way).
    if abs(lhs - rhs) > Fraction(1, 10**6):
        assert (expected > 0) is prefers_longer(float(p_a), float(q_a), float(p_b), float(q_b))


def test_eq_1_and_2_reduce_to_3_symbolically() -> None:
    sympy = pytest.importorskip("sympy")
    w_a, w_b, p_a, q_a, p_b, q_b = sympy.symbols("w_a w_b p_a q_a p_b q_b", positive=True)
    factor = w_a / (2 * q_a) * ((q_b - p_b) / q_b - (q_a - p_a) / p_a)
    eq1 = avg_jct_gain_b1(w_a, p_a, q_a, p_b, q_b, q_b2=q_b)
    eq2 = avg_jct_gain_b2(w_a, w_b, p_a, q_a, p_b, q_b, q_a2=p_a, q_b2=q_b)
    assert sympy.simplify(eq1 - factor) == 0
    assert sympy.simplify(eq2 - factor) == 0


# -- AFS-L --------------------------------------------------------------------

VECTORS = [
    pytest.param(
        4,
        [AfsJob(1, (0, 10, 18, 24, 28), 100), AfsJob(2, (0, 10, 20, 30, 40), 1000)],
        (1, 2, 1, 2),
        {1: 2, 2: 2},
        id="two jobs: A B A B",
    ),
    pytest.param(
        6,
        [
            AfsJob(1, (0, 10, 18, 24, 28, 30, 31), 100),
            AfsJob(2, (0, 10, 19, 27, 34, 40, 45), 1000),
            AfsJob(3, (0, 10, 12, 13, 13.5, 13.8, 14), 50),
        ],
        (3, 1, 2, 1, 2, 1),
        {1: 3, 2: 2, 3: 1},
        id="three jobs: C A B A B A",
    ),
    pytest.param(
        2,
        [AfsJob(1, (0, 1, 1.5), 300), AfsJob(2, (0, 1, 1.5), 100), AfsJob(3, (0, 1, 1.5), 200)],
        (2, 3),
        {1: 0, 2: 1, 3: 1},
        id="more jobs than GPUs: SRTF",
    ),
]


@pytest.mark.parametrize(("gpus", "jobs", "order", "counts"), VECTORS)
@pytest.mark.parametrize("explicit_stage_one", [True, False])
def test_afs_l_test_vectors(
    gpus: int,
    jobs: list[AfsJob],
    order: tuple[int, ...],
    counts: dict[int, int],
    explicit_stage_one: bool,
) -> None:
    shares = afs_l(jobs, gpus, explicit_stage_one=explicit_stage_one)
    assert shares.order == order
    assert dict(shares.counts) == counts


@given(st.lists(sublinear_tables(), min_size=1, max_size=8), st.integers(1, 12), st.data())
def test_stage_one_gives_one_gpu_each_in_increasing_length(
    tables: list[tuple[float, ...]], gpus: int, data: st.DataObject
) -> None:
    lengths = data.draw(st.lists(st.floats(1.0, 1e6), min_size=len(tables), max_size=len(tables)))
    jobs = [AfsJob(i, table, lengths[i]) for i, table in enumerate(tables)]
    shares = afs_l(jobs, gpus)
    first = shares.order[: min(gpus, len(jobs))]
    assert sorted(first) == sorted(set(first))  # one GPU each before any second one
    assert [jobs[k].length(1) for k in first] == sorted(jobs[k].length(1) for k in first)
    if gpus <= len(jobs):  # SRTF: the shortest on one GPU run, the others wait
        assert set(first) == {job.key for job in sorted(jobs, key=lambda j: j.length(1))[:gpus]}
        assert all(count <= 1 for count in shares.counts.values())


@given(st.lists(sublinear_tables(), min_size=1, max_size=6), st.integers(1, 12), st.data())
def test_literal_pseudo_code_equals_explicit_stage_one_for_sublinear_jobs(
    tables: list[tuple[float, ...]], gpus: int, data: st.DataObject
) -> None:
    lengths = data.draw(
        st.lists(st.floats(1.0, 1e6), min_size=len(tables), max_size=len(tables), unique=True)
    )
    jobs = [AfsJob(i, table, lengths[i]) for i, table in enumerate(tables)]
    assume(len({job.length(1) for job in jobs}) == len(jobs))
    assert afs_l(jobs, gpus) == afs_l(jobs, gpus, explicit_stage_one=False)


def test_explicit_stage_one_covers_a_linearly_scaling_job() -> None:
    # From 1 to 2 GPUs A doubles: (3) is 1 > 1, false, so the literal
    # pseudo-code gives A its second GPU before B gets a first.
    jobs = [AfsJob(1, (0, 10, 20), 100), AfsJob(2, (0, 10, 20), 1000)]
    assert dict(afs_l(jobs, 2).counts) == {1: 1, 2: 1}
    assert dict(afs_l(jobs, 2, explicit_stage_one=False).counts) == {1: 2, 2: 0}


def test_equal_lengths_make_the_scanned_job_play_the_shorter_one() -> None:
    # Line 9 swaps on ">=": with A and B equally long on one GPU each, the
    # scanned job B plays "a"; (3) is false both ways (0.47 vs 0.8, 0.44 vs
    # 0.9), so "a" keeps priority and B gets the third GPU.
    jobs = [AfsJob(1, (0, 10, 18), 100), AfsJob(2, (0, 10, 19), 100)]
    assert afs_l(jobs, 3).order == (1, 2, 2)


def test_unknown_lengths_rank_after_known_ones_in_stage_one() -> None:
    jobs = [AfsJob(1, (0, 1.0)), AfsJob(2, (0, 1.0), 500), AfsJob(3, (0, 1.0))]
    assert afs_l(jobs, 2).order == (2, 1)


@pytest.mark.parametrize(
    ("table", "peak"), [((0, 5), 1), ((0, 5, 9, 8, 7), 2), ((0, 5, 9, 9, 10), 4), ((0, 5, 5), 1)]
)
def test_peak_is_the_smallest_count_with_the_highest_throughput(
    table: tuple[float, ...], peak: int
) -> None:
    assert peak_gpus(table) == peak


def test_jobs_stop_at_their_peak_and_spare_gpus_stay_idle() -> None:
    jobs = [AfsJob(1, (0, 10, 15, 14, 13), 100), AfsJob(2, (0, 10, 12, 11, 10), 200)]
    assert dict(afs_l(jobs, 8).counts) == {1: 2, 2: 2}
    assert sum(afs_l(jobs, 8, cap_at_peak=False).counts.values()) == 8
    assert dict(afs_p(jobs, 8).counts) == {1: 2, 2: 2}


@given(st.lists(sublinear_tables(), min_size=1, max_size=8), st.integers(0, 40))
def test_afs_l_hands_out_every_gpu_a_job_can_use(
    tables: list[tuple[float, ...]], gpus: int
) -> None:
    jobs = [AfsJob(i, table, 10.0 * (i + 1)) for i, table in enumerate(tables)]
    shares = afs_l(jobs, gpus)
    assert sum(shares.counts.values()) == len(shares.order)
    assert len(shares.order) == min(gpus, sum(peak_gpus(t) for t in tables))
    assert all(shares.counts[job.key] <= peak_gpus(job.throughput) for job in jobs)


@pytest.mark.parametrize(
    ("throughput", "remaining"),
    [((), 1.0), ((1.0, 2.0), 1.0), ((0.0,), 1.0), ((0.0, 0.0), 1.0), ((0.0, 1.0), -1.0)],
)
def test_malformed_jobs_are_refused(throughput: tuple[float, ...], remaining: float) -> None:
    with pytest.raises(ValueError, match="job 7"):
        AfsJob(7, throughput, remaining)


def test_job_keys_must_be_unique() -> None:
    with pytest.raises(ValueError, match="unique"):
        afs_l([AfsJob(1, (0, 1.0)), AfsJob(1, (0, 2.0))], 2)


# -- AFS-P ----------------------------------------------------------------------


@given(st.lists(sublinear_tables(), min_size=1, max_size=8), st.integers(0, 40), st.integers())
def test_afs_p_gives_every_job_a_gpu_when_jobs_do_not_outnumber_gpus(
    tables: list[tuple[float, ...]], extra: int, seed: int
) -> None:
    jobs = [AfsJob(i, table) for i, table in enumerate(tables)]
    gpus = len(jobs) + extra
    shares = afs_p(jobs, gpus, seed=seed)
    assert all(count >= 1 for count in shares.counts.values())
    assert shares.order[: len(jobs)] == tuple(job.key for job in jobs)
    assert len(shares.order) == min(gpus, sum(peak_gpus(t) for t in tables))


def test_afs_p_follows_3_where_it_decides_whatever_the_seed() -> None:
    # B's second GPU adds 90%, A's only 10%: (3) with a = A holds, so B wins
    # every comparison until A's gain ratio catches up.
    efficient, inefficient = AfsJob(1, (0, 10, 19, 27, 34)), AfsJob(2, (0, 10, 11, 11.5, 11.8))
    for seed in range(20):
        shares = afs_p([inefficient, efficient], 5, seed=seed)
        assert dict(shares.counts) == {1: 4, 2: 1}


def test_afs_p_breaks_ties_with_a_seeded_coin_fixed_per_pair() -> None:
    # A: 10 -> 18, B: 10 -> 19 on a second GPU: (3) is false in both role orders.
    a, b = AfsJob(1, (0, 10, 18)), AfsJob(2, (0, 10, 19))
    assert not prefers_longer(10, 18, 10, 19) and not prefers_longer(10, 19, 10, 18)
    winners = {seed: tie_winner(seed, 1, 2) for seed in range(32)}
    assert set(winners.values()) == {1, 2}  # the coin does depend on the seed
    for seed, winner in winners.items():
        assert tie_winner(seed, 2, 1) == winner
        assert afs_p([a, b], 3, seed=seed).order[-1] == winner
        assert afs_p([b, a], 3, seed=seed).order[-1] == winner


def test_afs_p_needs_processor_sharing_when_jobs_outnumber_gpus() -> None:
    with pytest.raises(ValueError, match="processor_sharing"):
        afs_p([AfsJob(1, (0, 1.0)), AfsJob(2, (0, 1.0))], 1)


@pytest.mark.parametrize(
    ("queue", "holding", "gpus", "running"),
    [
        # Lowest counters first, ties in queue order.
        ([(1, 2), (2, 0), (3, 1), (4, 0)], set(), 2, (2, 4)),
        ([(1, 1), (2, 1), (3, 1)], set(), 2, (1, 2)),
        # Non-preemptive: a job inside its unit keeps its GPU against lower counters.
        ([(1, 3), (2, 0), (3, 0)], {1}, 2, (2, 1)),
        ([(1, 3), (2, 5), (3, 0)], {1, 2}, 2, (1, 2)),
        # More holders than GPUs (the cluster shrank): the lowest counters stay.
        ([(1, 3), (2, 5), (3, 0)], {1, 2}, 1, (1,)),
        ([(1, 0)], set(), 0, ()),
    ],
)
def test_processor_sharing_runs_holders_then_lowest_counters(
    queue: list[tuple[int, int]], holding: set[int], gpus: int, running: tuple[int, ...]
) -> None:
    assert processor_sharing(queue, holding, gpus) == running


@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=12),
    st.sets(st.integers(0, 11)),
    st.integers(0, 8),
)
def test_processor_sharing_fills_gpus_with_the_lowest_counters(
    counters: list[int], holding: set[int], gpus: int
) -> None:
    queue = list(enumerate(counters))
    holding = {key for key in holding if key < len(counters)}
    running = processor_sharing(queue, holding, gpus)
    assert len(running) == min(gpus, len(queue))
    started = [key for key in running if key not in holding]
    waiting = [key for key, _ in queue if key not in running and key not in holding]
    if started and waiting:
        assert max(counters[k] for k in started) <= min(counters[k] for k in waiting)
    if len(holding) <= gpus:
        assert holding <= set(running)


def test_lengths_are_remaining_over_throughput() -> None:
    job = AfsJob(1, (0, 4.0, 8.0), 100)
    assert (job.length(0), job.length(1), job.length(2)) == (math.inf, 25.0, 12.5)
