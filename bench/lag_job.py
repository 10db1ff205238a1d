"""A job for `bench.bench_live_lag`: report a goodput model as a runner would, then sleep.

    python bench/lag_job.py SECONDS

Under gpuq (``GPUQ_CONTROL_SOCKET`` set) it says hello on its control
channel as a runner that sends metrics but cannot checkpoint (so no policy
can preempt it), sends one sample with a fitted throughput model, gradient
noise and batch limits drawn from its job id (the ranges of
`bench.bench_decide_lag.busy_state`), so `pollux` and `gpuq` search over
real models, and keeps the channel open while it sleeps. It needs no
PyTorch and no numpy: 64 of them sleep side by side on a small machine.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time

from gpuq import env
from gpuq.control import CONTROL_VERSION, Hello, Metrics, MetricsSample, to_dict
from gpuq.wire import encode


def model_sample(job_id: int) -> MetricsSample:
    """One sample with a model drawn from `job_id` (deterministic), measured on one GPU."""
    rng = random.Random(job_id)
    perf = (
        rng.uniform(0.02, 0.2),  # alpha_c
        rng.uniform(0.001, 0.01),  # beta_c
        rng.uniform(0.1, 0.5),  # alpha_n
        rng.uniform(0.01, 0.05),  # beta_n
        rng.uniform(0.01, 0.05),  # alpha_r
        rng.uniform(0.001, 0.01),  # beta_r
        rng.uniform(1.0, 3.0),  # gamma
    )
    init = rng.choice([64, 128, 256])
    return MetricsSample(
        time=time.time(),
        step=100,
        batch_size=init,
        local_batch_size=init,
        replicas=1,
        grad_sqr=1.0,
        grad_var=rng.uniform(1.0, 1000.0),
        perf_params=perf,
        batch_limits=(init, init * 16, 16, init * 2),
    )


def report(path: str, job_id: int) -> socket.socket:
    """Hello, wait for the welcome, send the sample; the open channel is returned."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(30.0)
    sock.connect(path)
    hello = Hello(CONTROL_VERSION, job_id, env.attempt(), os.getpid(), ("metrics",))
    sock.sendall(encode(to_dict(hello)))
    sock.makefile("rb").readline()  # the welcome; its metrics interval does not matter here
    sock.sendall(encode(to_dict(Metrics(model_sample(job_id)))))
    return sock


def main() -> None:
    """Report (under gpuq), then sleep for the seconds given."""
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3600.0
    path, job_id = env.control_socket(), env.job_id()
    channel = report(path, job_id) if path and job_id else None
    time.sleep(seconds)
    if channel is not None:
        channel.close()


if __name__ == "__main__":
    main()
