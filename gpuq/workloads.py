"""The workloads `gpuq sim` and `gpuq replay` accept, named in one light place.

The simulator resolves them (`gpuq.sim.run.resolve_workload`); the commands'
help and the simulator's error hint both quote `WORKLOAD_FORMS`, so the two
cannot list different ones. It imports nothing, as `gpuq --help` reads it.
"""

from __future__ import annotations

BUNDLED_TRACES: tuple[tuple[str, int], ...] = (
    ("workload", 4),
    ("workload-0.5", 4),
    ("philly", 4),
    ("saturn", 5),
)
"""Each family of bundled traces and how many it has (`NAME-1` to `NAME-N`)."""

BUNDLED_WORKLOADS = tuple(
    f"{family}-{number}" for family, count in BUNDLED_TRACES for number in range(1, count + 1)
)
"""Every bundled trace's name: Pollux's 1x and 0.5x load traces, Sia's Philly and Saturn."""

WORKLOAD_FORMS = (
    "a CSV file, a bundled trace ("
    + ", ".join(f"{family}-1..{count}" for family, count in BUNDLED_TRACES)
    + "), gen:SEED[:tuned|realistic][:LOAD] or lab:SEED[:tuned|realistic][:LOAD]"
)
"""Every form of workload name, as help text and error hints say it."""
