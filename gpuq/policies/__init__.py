"""Scheduling policies, pure functions of a `ClusterState` and the time.

`gpuq.policies.registry` is the one table of policies by name: the daemon,
the simulator, `gpuq sim`, `gpuq doctor` and the benchmarks all build them
there (`get_policy`), so they always run the same code.
"""
