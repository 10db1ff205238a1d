"""On a machine with a real GPU: NVML latency, and a daemon on the NVML backend.

`python -m bench.gpu_check` (skips with a message when NVML is unavailable):

1. NVML sampling latency: median and p99 of `NvmlBackend.devices()` (one
   batched sample of every GPU with processes, memory and utilization).
2. A daemon on the NVML backend runs a real CUDA job given by UUID; `gpus`
   attributes the job's memory to gpuq and a process gpuq did not start to
   "other"; a job sees exactly its GPU UUID in CUDA_VISIBLE_DEVICES.
3. Packing on the real GPU: two `--gpu-mem` jobs share the GPU, each
   allocating within its share, both attributed to gpuq.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuq.errors import GpuUnavailable
from gpuq.gpus import GpuConfig, make_backend
from tests.daemon_harness import running_daemon, wait_for

GIB = 1024**3
HOLD = (
    "import os, sys, time, torch; n = int(sys.argv[1]); "
    "x = torch.empty(n, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize(); "
    "print('visible', os.environ['CUDA_VISIBLE_DEVICES'], torch.cuda.device_count(), "
    "torch.cuda.get_device_name(0), flush=True); time.sleep(float(sys.argv[2]))"
)


def nvml_latency(samples: int = 200) -> None:
    """Time batched samples of every device."""
    backend = make_backend(GpuConfig(backend="nvml"))
    devices = backend.devices()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        backend.devices()
        times.append(time.perf_counter() - start)
    times.sort()
    print(f"[nvml] driver {backend.driver_version()}, {len(devices)} device(s):")
    for d in devices:
        print(
            f"       {d.index} {d.name} {d.uuid} total {d.memory_total / GIB:.1f} GiB "
            f"used {d.memory_used / GIB:.2f} GiB util {d.utilization}"
        )
    print(
        f"[nvml] devices() median {statistics.median(times) * 1000:.2f} ms, "
        f"p99 {times[int(0.99 * len(times)) - 1] * 1000:.2f} ms over {samples} samples"
    )
    backend.close()


def daemon_on_nvml(root: Path) -> None:
    """Real CUDA jobs under a daemon on the NVML backend."""
    with running_daemon(root, gpus_toml='[gpus]\nbackend = "nvml"\n') as daemon:
        gpus = daemon.call("gpus")
        assert gpus["backend"] == "nvml", gpus
        uuid = gpus["gpus"][0]["uuid"]
        foreign = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(3 * GIB), "60"],
            env={**os.environ, "CUDA_VISIBLE_DEVICES": uuid},
        )
        try:
            job = daemon.submit([sys.executable, "-c", HOLD, str(2 * GIB), "20"], gpus=1)
            daemon.wait_state(job, "running")

            def attributed() -> dict[str, object] | None:
                g = daemon.call("gpus")["gpus"][0]
                seen = g["memory_gpuq"] >= 2 * GIB and g["memory_foreign"] >= 3 * GIB
                return g if seen else None

            g = wait_for(attributed, timeout=60, what="job and foreign memory in gpuq gpus")
            print(
                f"[daemon] whole-GPU job {job}: gpuq {g['memory_gpuq'] / GIB:.2f} GiB, "
                f"other {g['memory_foreign'] / GIB:.2f} GiB, jobs {g['jobs']}: OK"
            )
            daemon.call("cancel", ids=[job])
            daemon.wait_state(job, "cancelled")
            shares = [
                daemon.submit([sys.executable, "-c", HOLD, str(GIB), "15"], gpus=1, gpu_mem=4 * GIB)
                for _ in range(2)
            ]
            for s in shares:
                daemon.wait_state(s, "running")

            def both() -> dict[str, object] | None:
                g = daemon.call("gpus")["gpus"][0]
                packed = sorted(g["jobs"]) == sorted(shares) and g["memory_gpuq"] >= 2 * GIB
                return g if packed else None

            g = wait_for(both, timeout=60, what="two packed jobs on the GPU")
            print(
                f"[daemon] packed jobs {shares} on {uuid}: gpuq {g['memory_gpuq'] / GIB:.2f} GiB, "
                f"mode {g['mode']}: OK"
            )
            for s in shares:
                daemon.wait_state(s, "succeeded", timeout=60)
                out = daemon.cli("logs", str(s)).stdout.strip()
                assert out.startswith(f"visible {uuid} 1 "), out
            print(f"[daemon] each job saw CUDA_VISIBLE_DEVICES={uuid} and 1 device: OK")
        finally:
            foreign.kill()


def main() -> None:
    """Run the GPU checks, or say why they cannot run here."""
    try:
        nvml_latency()
    except GpuUnavailable as exc:
        print(f"skipped: {exc.message}")
        return
    root = Path(tempfile.mkdtemp(prefix="gq-gpu-"))
    try:
        daemon_on_nvml(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
