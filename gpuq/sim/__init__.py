"""A trace-driven simulator that runs gpuq's elastic policies on the Pollux tables.

The policies under `gpuq.policies` are the very objects the daemon runs;
here they decide for a simulated cluster whose jobs progress as the Pollux
paper's measurements say (`gpuq.sim.apps`). Workloads come bundled
(`bundled_workload`), from CSV files (`load_workload`) or from the paper's
generator (`generate_workload`); `Simulator(policy, workload).run()` returns
a `SimResult` with the metrics the papers report.

    from gpuq.policies.registry import get_policy
    from gpuq.sim import Simulator, bundled_workload

    policy = get_policy("tiresias")
    result = Simulator(policy, bundled_workload("workload-1")).run()
    print(result.summary()["avg_jct"])

Every number in the tables is tiny linear algebra; run with
`OPENBLAS_NUM_THREADS=1` on small machines, where a threaded BLAS spends
more time waking threads than computing.
"""

from __future__ import annotations

from gpuq.sim.apps import APPLICATION_NAMES, APPLICATIONS, Application, get_application
from gpuq.sim.engine import SimProgress, SimulationError, Simulator
from gpuq.sim.fair import SimLab
from gpuq.sim.metrics import JobRecord, SimResult
from gpuq.sim.workload import (
    BUNDLED_WORKLOADS,
    WorkloadJob,
    assign_users,
    bundled_workload,
    copies_for_users,
    generate_workload,
    load_workload,
    write_workload,
)

__all__ = [
    "APPLICATIONS",
    "APPLICATION_NAMES",
    "BUNDLED_WORKLOADS",
    "Application",
    "JobRecord",
    "SimLab",
    "SimProgress",
    "SimResult",
    "SimulationError",
    "Simulator",
    "WorkloadJob",
    "assign_users",
    "bundled_workload",
    "copies_for_users",
    "generate_workload",
    "get_application",
    "load_workload",
    "write_workload",
]
