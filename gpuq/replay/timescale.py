"""The daemon's settings for a replay at `speedup`: the simulator's time constants, compressed.

A daemon replaying a workload `speedup` times faster than real must also
decide, restart and take turns that much faster, or the policy it runs is
not the policy `gpuq sim` runs. `live_settings` gives the `[scheduler]`
section that matches `gpuq sim`'s defaults:

- `interval`: the simulator's tick (60 s) / speedup. The daemon also
  decides on every submission and exit, which the simulator does not (it
  waits for the tick); runners report at least that often
  (`gpuq.daemon.control.report_interval`), as each simulated decision sees
  the models of the tick before.
- `pollux` and `gpuq`: `restart_penalty` = the simulator's (30 s) / speedup,
  the delta of REALLOC_FACTOR, whose job ages are real seconds live.
- `gandiva`: `quantum`, the turn on an over-subscribed GPU. The simulator
  shares such GPUs as a fluid (each job at GPUs / demand of its speed); a
  live turn ends at the job's next iteration boundary and the next one
  resumes, a cost of a trace job's tick or so per turn whatever the
  speedup, so the turn is `GANDIVA_QUANTUM` simulated seconds (5 minutes;
  the paper's is 60 s) to keep that cost near 2% while a turn stays short
  against the jobs.
- `tiresias`: its service threshold (GPU-hours) / speedup.
- `fifo`: nothing but the interval.

Other policies are given by name only. A policy spec with options of its own
(`pollux:p=-0.5`) keeps them; the scaled ones are added unless given.
"""

from __future__ import annotations

from gpuq.policies.registry import split_policy_spec

SIM_INTERVAL = 60.0
"""The simulator's tick (`gpuq sim --interval` default), in simulated seconds."""
SIM_RESTART_PENALTY = 30.0
"""The simulator's restart penalty (`gpuq sim --restart-penalty` default)."""
GANDIVA_QUANTUM = 300.0
"""Simulated seconds of a live gandiva turn (module docstring)."""
TIRESIAS_THRESHOLD = 16.0
"""Tiresias's default service threshold, GPU-hours (`gpuq.policies.tiresias`)."""


def live_policy(spec: str, speedup: float) -> str:
    """`spec` (`NAME[:KEY=VALUE...]`) with its time constants divided by `speedup`."""
    name, options = split_policy_spec(spec)
    scaled: dict[str, str] = {}
    if name in ("pollux", "gpuq"):
        scaled["restart_penalty"] = f"{SIM_RESTART_PENALTY / speedup:g}"
    elif name == "gandiva":
        scaled["quantum"] = f"{GANDIVA_QUANTUM / speedup:g}"
    elif name == "tiresias":
        scaled["thresholds_gpu_hours"] = f"{TIRESIAS_THRESHOLD / speedup:g}"
    given = spec.split(":")[1:]
    extra = [f"{key}={value}" for key, value in scaled.items() if key not in options]
    return ":".join([name, *given, *extra])


def live_settings(spec: str, speedup: float) -> str:
    """The `[scheduler]` section of a daemon that replays under `spec` at `speedup`."""
    return (
        f'[scheduler]\npolicy = "{live_policy(spec, speedup)}"\n'
        f"interval = {SIM_INTERVAL / speedup:g}\n"
    )
