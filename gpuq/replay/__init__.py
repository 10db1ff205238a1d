"""Live replay: a simulator workload run by a real daemon, measured as the simulator measures it.

`tracejob` is a job that behaves like one of the simulator's applications
(its step times and progress come from the Pollux tables), with time
compressed; it runs under `gpuq.runner`, so the daemon checkpoints, parks,
preempts and restarts it as any runner job. `run` submits a workload's jobs
to a live daemon at their arrival times and turns what happened into the
simulator's `SimResult`, so `gpuq replay` and `gpuq sim` report the same
metrics for the same workload.
"""
