"""Scheduling policies, pure functions of a `ClusterState` and the time.

`get_policy(name)` returns a policy by the name used in the configuration and
on the command line; `POLICY_NAMES` lists them. The daemon and the simulator
both go through this registry, so they always run the same code.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuq.errors import UsageError
from gpuq.policies.fifo import FifoBackfill
from gpuq.policies.interface import Policy

_FACTORIES: dict[str, Callable[[], Policy]] = {
    FifoBackfill.name: FifoBackfill,
}

POLICY_NAMES: tuple[str, ...] = tuple(sorted(_FACTORIES))
"""Names `get_policy` accepts."""


def get_policy(name: str) -> Policy:
    """A fresh policy object by name; an unknown name lists the known ones."""
    factory = _FACTORIES.get(name)
    if factory is None:
        known = ", ".join(POLICY_NAMES)
        raise UsageError(f"unknown policy {name!r}; known: {known}")
    return factory()


__all__ = ["POLICY_NAMES", "get_policy"]
