"""CoDDL's network packing and reuse-maximizing placement (AFS paper §4.4, App. E).

Two pure steps turn AFS's GPU counts into per-node allocations.

Regulation (`regulate`, Proposition 2)
    On a cluster whose nodes all have the same power-of-two GPU count G, a
    share must be 0, a power of two below G, or a multiple of G. Each share
    s is first rounded down to the largest such value x (the paper's lower
    bound), then the GPUs this frees are handed back while they last: a job
    at a multiple of G may take G more, a job at 2^l < G may double. The
    paper leaves the choice of job open; here the job furthest below its
    original share goes first (the plan changes least), ties in priority
    order, and never beyond the job's `caps` entry (its peak-throughput GPU
    count), so the total is preserved unless no job can use the GPUs.
    Other clusters (G not a power of two, or nodes of different sizes) keep
    the shares as they are: the paper's guarantees need 2^k GPUs per node.

Placement (`place`, Proposition 1 with the paper's migration rule)
    1. Keep: a job whose share equals what it holds, on the fewest nodes
       that can hold it, keeps exactly those GPUs. In gpuq every change of a
       job's GPUs is a checkpoint-restart, so unchanged allocations are what
       "reuse" buys; this maximizes the jobs that are not touched.
    2. The other jobs go in decreasing share (first-fit-decreasing; ties in
       priority order). A share of at least one node's worth on a power-of-two
       cluster takes whole free nodes, preferring nodes the job already uses.
       A smaller share goes on one node: the one where the job already holds
       the most GPUs, then the fullest node where it fits (best fit), then
       the first. On other clusters, a share that fits no single node spans
       nodes, the ones it already uses first, then the most free.
    3. If step 2 fails (kept jobs fragmented the nodes), place every job
       again from scratch with the same rules: on a power-of-two cluster
       whole-node jobs first, then the rest in decreasing power-of-two size,
       which always fits (each node's free GPUs stay a multiple of the next
       size). Migration is the last resort, as in the paper.

On a power-of-two cluster every job then uses exactly ceil(r / G) nodes and a
multi-node job owns its nodes, so at most one multi-node job is on any node.
Elsewhere a job may span partly used nodes and share them with another
multi-node job (a deviation from the paper's guarantees, documented in
`gpuq.policies.afs.policy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Allocation = tuple[int, ...]


def is_power_of_two(value: int) -> bool:
    """True for 1, 2, 4, 8, ..."""
    return value > 0 and value & (value - 1) == 0


def packing_size(capacity: Sequence[int]) -> int | None:
    """G when every node has the same power-of-two GPU count G, else None."""
    sizes = set(capacity)
    if len(sizes) != 1:
        return None
    (size,) = sizes
    return size if is_power_of_two(size) else None


def allowed_floor(share: int, per_node: int) -> int:
    """The largest share <= `share` that is 0, a power of two below G, or a multiple of G."""
    if share <= 0:
        return 0
    if share >= per_node:
        return share // per_node * per_node
    return 1 << (share.bit_length() - 1)


def _next_allowed(share: int, per_node: int) -> int:
    return share + per_node if share >= per_node else 2 * share


def regulate(
    shares: Mapping[int, int], per_node: int, caps: Mapping[int, int], order: Sequence[int]
) -> dict[int, int]:
    """Proposition 2: packable shares with the same total where the caps allow it."""
    result = {key: allowed_floor(share, per_node) for key, share in shares.items()}
    spare = sum(shares.values()) - sum(result.values())
    position = {key: i for i, key in enumerate(order)}
    while spare > 0:
        best: int | None = None
        best_rank: tuple[int, int] = (0, 0)
        for key, share in result.items():
            grown = _next_allowed(share, per_node)
            if share == 0 or grown - share > spare or grown > caps.get(key, grown):
                continue
            rank = (share - shares[key], position.get(key, len(position)))
            if best is None or rank < best_rank:
                best, best_rank = key, rank
        if best is None:
            break
        grown = _next_allowed(result[best], per_node)
        spare -= grown - result[best]
        result[best] = grown
    return result


def _min_nodes(count: int, capacity: Sequence[int]) -> int:
    """The fewest nodes whose GPUs add up to `count` (largest nodes first)."""
    total = 0
    for used, size in enumerate(sorted(capacity, reverse=True), start=1):
        total += size
        if total >= count:
            return used
    return len(capacity)


class _Free:
    """Free GPUs per node during one placement attempt."""

    def __init__(self, capacity: Sequence[int]) -> None:
        self.capacity = [max(size, 0) for size in capacity]
        self.free = list(self.capacity)

    def take(self, allocation: Allocation) -> bool:
        if len(allocation) != len(self.free):
            return False
        pairs = zip(allocation, self.free, strict=True)
        if any(count < 0 or count > free for count, free in pairs):
            return False
        for i, count in enumerate(allocation):
            self.free[i] -= count
        return True

    def whole_nodes(self, count: int, held: Allocation) -> Allocation | None:
        """`count` GPUs on entirely free nodes, preferring nodes in `held`."""
        empty = [i for i, free in enumerate(self.free) if free == self.capacity[i] and free > 0]
        empty.sort(key=lambda i: (-held[i], i))
        allocation = [0] * len(self.free)
        left = count
        for i in empty:
            if left <= 0:
                break
            allocation[i] = self.free[i]
            left -= self.free[i]
        if left != 0:
            return None
        return tuple(allocation) if self.take(tuple(allocation)) else None

    def one_node(self, count: int, held: Allocation) -> Allocation | None:
        """`count` GPUs on a single node: most reuse, then best fit, then first."""
        fits = [i for i, free in enumerate(self.free) if free >= count]
        if not fits:
            return None
        best = min(fits, key=lambda i: (-min(held[i], count), self.free[i], i))
        allocation = tuple(count if i == best else 0 for i in range(len(self.free)))
        self.take(allocation)
        return allocation

    def spread(self, count: int, held: Allocation) -> Allocation | None:
        """`count` GPUs over several nodes: held nodes first, then the most free."""
        if count > sum(self.free):
            return None
        nodes = sorted(range(len(self.free)), key=lambda i: (-held[i], -self.free[i], i))
        allocation = [0] * len(self.free)
        left = count
        for i in nodes:
            taken = min(self.free[i], left)
            allocation[i] = taken
            left -= taken
        self.take(tuple(allocation))
        return tuple(allocation)


def _well_formed(allocation: Allocation, share: int, capacity: Sequence[int]) -> bool:
    """True when `allocation` is exactly `share` GPUs on as few nodes as possible."""
    if len(allocation) != len(capacity) or any(count < 0 for count in allocation):
        return False
    used = sum(1 for count in allocation if count > 0)
    return sum(allocation) == share and used == _min_nodes(share, capacity)


def _attempt(
    shares: Mapping[int, int],
    capacity: Sequence[int],
    current: Mapping[int, Allocation],
    order: Sequence[int],
    keep: bool,
) -> dict[int, Allocation] | None:
    size = packing_size(capacity)
    free = _Free(capacity)
    nothing = (0,) * len(capacity)
    placed: dict[int, Allocation] = {}
    position = {key: i for i, key in enumerate(order)}
    todo = [key for key in shares if shares[key] > 0]
    if keep:
        for key in sorted(todo, key=lambda k: position.get(k, len(position))):
            held = current.get(key, ())
            if _well_formed(held, shares[key], capacity) and free.take(held):
                placed[key] = held
    rest = [key for key in todo if key not in placed]
    rest.sort(key=lambda k: (-shares[k], position.get(k, len(position)), k))
    for key in rest:
        share = shares[key]
        held = current.get(key, nothing)
        if len(held) != len(capacity):
            held = nothing
        if size is not None and share >= size:
            allocation = free.whole_nodes(share, held) if share % size == 0 else None
        else:
            allocation = free.one_node(share, held)
            if allocation is None and size is None:
                allocation = free.spread(share, held)
        if allocation is None:
            return None
        placed[key] = allocation
    return placed


def place(
    shares: Mapping[int, int],
    capacity: Sequence[int],
    current: Mapping[int, Allocation],
    order: Sequence[int],
) -> dict[int, Allocation]:
    """Per-node allocations for `shares` on nodes of `capacity` GPUs (module docstring).

    `current` is what each job holds now and `order` the priority used for
    ties. Jobs with share 0 are left out. Raises ValueError when the shares
    cannot be placed at all (more GPUs than the cluster has, or a share the
    packing rules forbid on a power-of-two cluster).
    """
    if sum(shares.values()) > sum(max(size, 0) for size in capacity):
        raise ValueError(f"shares {dict(shares)} exceed the cluster's {list(capacity)} GPUs")
    result = _attempt(shares, capacity, current, order, keep=True)
    if result is None:
        result = _attempt(shares, capacity, current, order, keep=False)
    if result is None:
        raise ValueError(f"shares {dict(shares)} cannot be packed on nodes {list(capacity)}")
    return result
