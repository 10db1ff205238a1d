"""Live replay: a simulator workload run by a real daemon, measured as the simulator measures it.

`tracejob` is a job that behaves like one of the simulator's applications
(it is the simulator's own job, its step times and progress from the
Pollux tables, adaptive as Pollux's agent where the policy runs adaptive
jobs), with time compressed; it runs under `gpuq.runner`, so the daemon
checkpoints, parks, preempts, resizes and restarts it as any runner job,
and its policy sees the model it reports. `run` submits a workload's jobs
to a live daemon at their arrival times and turns what happened into the
simulator's `SimResult`, so `gpuq replay` and `gpuq sim` report the same
metrics for the same workload. `forkserver` and `launcher` start trace jobs
in a fraction of a second, and `timescale` gives the daemon the
simulator's time constants compressed.
"""
