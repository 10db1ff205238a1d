"""gpuqd: the per-server daemon that owns all state and runs the jobs."""
