"""CoDDL's network packing (Proposition 2) and placement (Proposition 1).

The rules are in the docstring of gpuq/policies/afs/packing.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuq.policies.afs.packing import (
    Allocation,
    allowed_floor,
    is_power_of_two,
    packing_size,
    place,
    regulate,
)

UNCAPPED = 1 << 20


def allowed(share: int, per_node: int) -> bool:
    return share == 0 or (is_power_of_two(share) and share < per_node) or share % per_node == 0


@pytest.mark.parametrize(
    ("share", "per_node", "floor"),
    [(0, 4, 0), (1, 4, 1), (2, 4, 2), (3, 4, 2), (4, 4, 4), (5, 4, 4), (7, 4, 4), (9, 4, 8)]
    + [(6, 8, 4), (15, 8, 8), (17, 8, 16), (1, 1, 1), (3, 1, 3)],
)
def test_the_lower_bound_x_is_the_largest_packable_share(
    share: int, per_node: int, floor: int
) -> None:
    assert allowed_floor(share, per_node) == floor


@pytest.mark.parametrize(
    ("capacity", "size"), [((4, 4), 4), ((8,), 8), ((1, 1), 1), ((3, 3), None), ((4, 8), None)]
)
def test_packing_applies_to_equal_power_of_two_nodes_only(
    capacity: tuple[int, ...], size: int | None
) -> None:
    assert packing_size(capacity) == size


@pytest.mark.parametrize(
    ("shares", "caps", "regulated"),
    [
        # 3 + 1 on G = 4: x = (2, 1), one GPU left; job 2 is the only one that can take it.
        ({1: 3, 2: 1}, {}, {1: 2, 2: 2}),
        # 6 + 2 on G = 4: x = (4, 2), two left: job 2 doubles (job 1 would need 4).
        ({1: 6, 2: 2}, {}, {1: 4, 2: 4}),
        # 3 + 3 + 2 on G = 4: x = (2, 2, 2), two left: the first furthest below its share.
        ({1: 3, 2: 3, 3: 2}, {}, {1: 4, 2: 2, 3: 2}),
        # A cap stops a job from growing past its peak; the GPU stays idle.
        ({1: 3, 2: 1}, {1: 3, 2: 1}, {1: 2, 2: 1}),
        # 1 + 7: x = (1, 4); job 2 cannot grow by 4 within 3, so job 1 doubles twice.
        ({1: 1, 2: 7}, {}, {1: 4, 2: 4}),
        # The total is kept only where the packable values allow it (7 is not).
        ({1: 0, 2: 7}, {}, {1: 0, 2: 4}),
    ],
)
def test_regulation_hands_freed_gpus_to_jobs_furthest_below_their_share(
    shares: dict[int, int], caps: dict[int, int], regulated: dict[int, int]
) -> None:
    assert regulate(shares, 4, caps or dict.fromkeys(shares, UNCAPPED), list(shares)) == regulated


@st.composite
def full_shares(draw: st.DrawFn) -> tuple[int, int, dict[int, int]]:
    """A power-of-two G, m nodes and shares adding up to G * m (the paper's setting)."""
    per_node = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.integers(1, 6))
    left = per_node * nodes
    shares: dict[int, int] = {}
    key = 0
    while left > 0:
        share = draw(st.integers(0, left))
        shares[key] = share
        left -= share
        key += 1
        if key > 12:
            shares[key] = left
            left = 0
    return per_node, nodes, shares


@given(full_shares())
def test_regulation_preserves_the_total_and_the_lower_bound(
    case: tuple[int, int, dict[int, int]],
) -> None:
    per_node, _, shares = case
    regulated = regulate(shares, per_node, dict.fromkeys(shares, UNCAPPED), list(shares))
    assert sum(regulated.values()) == sum(shares.values())
    for key, share in shares.items():
        assert allowed(regulated[key], per_node)
        assert regulated[key] >= allowed_floor(share, per_node)


def check_packed(
    allocations: dict[int, Allocation], shares: dict[int, int], capacity: tuple[int, ...]
) -> None:
    """Proposition 1 on a power-of-two cluster, plus the invariants of every placement."""
    check_fits(allocations, shares, capacity)
    per_node = capacity[0]
    multi_node_jobs = [0] * len(capacity)
    for key, allocation in allocations.items():
        used = [i for i, count in enumerate(allocation) if count > 0]
        assert len(used) == math.ceil(shares[key] / per_node)
        if len(used) > 1:
            for i in used:
                multi_node_jobs[i] += 1
    assert max(multi_node_jobs) <= 1


def check_fits(
    allocations: dict[int, Allocation], shares: dict[int, int], capacity: tuple[int, ...]
) -> None:
    assert {key: sum(a) for key, a in allocations.items()} == {
        key: share for key, share in shares.items() if share > 0
    }
    for i, size in enumerate(capacity):
        assert sum(a[i] for a in allocations.values()) <= size
        assert all(a[i] >= 0 for a in allocations.values())


@st.composite
def current_allocations(
    draw: st.DrawFn, capacity: tuple[int, ...], keys: list[int]
) -> dict[int, Allocation]:
    """What the jobs hold now: random, but never over a node's capacity."""
    free = list(capacity)
    current: dict[int, Allocation] = {}
    for key in keys:
        wanted = [draw(st.integers(0, size)) for size in capacity]
        allocation = tuple(min(w, f) for w, f in zip(wanted, free, strict=True))
        free = [f - a for f, a in zip(free, allocation, strict=True)]
        current[key] = allocation
    return current


@given(full_shares(), st.data())
def test_placement_on_power_of_two_nodes_is_proposition_1(
    case: tuple[int, int, dict[int, int]], data: st.DataObject
) -> None:
    per_node, nodes, raw = case
    capacity = (per_node,) * nodes
    shares = regulate(raw, per_node, dict.fromkeys(raw, UNCAPPED), list(raw))
    current = data.draw(current_allocations(capacity, list(shares)))
    check_packed(place(shares, capacity, current, list(shares)), shares, capacity)


@given(st.lists(st.integers(1, 7), min_size=1, max_size=5), st.data())
def test_placement_on_other_nodes_preserves_shares_and_capacity(
    capacity_list: list[int], data: st.DataObject
) -> None:
    capacity = tuple(capacity_list)
    assume(packing_size(capacity) is None)
    left = sum(capacity)
    shares: dict[int, int] = {}
    for key in range(data.draw(st.integers(1, 8))):
        shares[key] = data.draw(st.integers(0, left))
        left -= shares[key]
    current = data.draw(current_allocations(capacity, list(shares)))
    check_fits(place(shares, capacity, current, list(shares)), shares, capacity)


def test_jobs_whose_share_is_unchanged_keep_their_gpus() -> None:
    capacity = (4, 4, 4)
    current = {1: (0, 2, 0), 2: (0, 0, 4), 3: (1, 0, 0)}
    placed = place({1: 2, 2: 4, 3: 2}, capacity, current, [1, 2, 3])
    assert placed[1] == (0, 2, 0) and placed[2] == (0, 0, 4)
    assert placed[3] == (2, 0, 0)  # resized: it stays where it already held a GPU


def test_a_job_spread_over_more_nodes_than_needed_is_repacked() -> None:
    placed = place({1: 2}, (4, 4), {1: (1, 1)}, [1])
    assert sorted(placed[1]) == [0, 2]


def test_when_kept_jobs_fragment_the_nodes_everything_is_placed_again() -> None:
    # Keeping jobs 1 and 2 would leave 3 + 3 free GPUs: no whole node for job 3.
    current = {1: (1, 0), 2: (0, 1), 3: (0, 0)}
    placed = place({1: 1, 2: 1, 3: 4, 4: 2}, (4, 4), current, [3, 4, 1, 2])
    check_packed(placed, {1: 1, 2: 1, 3: 4, 4: 2}, (4, 4))


def test_a_multi_node_job_prefers_the_nodes_it_holds() -> None:
    placed = place({1: 8}, (4, 4, 4, 4), {1: (0, 4, 0, 4)}, [1])
    assert placed[1] == (0, 4, 0, 4)
    placed = place({1: 8}, (4, 4, 4, 4), {1: (0, 0, 2, 4)}, [1])
    assert placed[1] == (0, 0, 4, 4)


def test_shares_over_the_cluster_are_refused() -> None:
    with pytest.raises(ValueError, match="exceed"):
        place({1: 5}, (4,), {}, [1])
