"""``python -m gpuq.runner.integrations.torchrun``: torchrun with gpuq's exit status.

Takes exactly torchrun's arguments. Two things differ from plain torchrun,
both for jobs run by gpuq:

- Exit status: when the ranks suspended (every rank exited with
  `gpuq.runner.SUSPEND_EXIT_CODE` after rank 0 wrote ``suspended.json``)
  this exits with that code too; plain torchrun reports any nonzero exit of
  a worker as a failure and exits with 1.
- Signals: torchrun starts each worker in a session of its own, so a signal
  gpuq sends to the job's process group reaches only the launcher, and
  SIGUSR1 would kill it. Unless ``--signals-to-handle`` is given, SIGUSR1
  joins torchrun's forwarded signals (SIGTERM, SIGINT, SIGHUP, SIGQUIT): the
  launcher passes it on to every worker, the workers agree to suspend at the
  next step and exit, and the launcher waits for them (torchrun's limit is
  30 seconds before it kills them, which bounds the time to save).

- Workers per node: ``--nproc-per-node=gpuq`` starts one worker per GPU
  gpuq gave this attempt (``GPUQ_GPU_UUIDS``; one outside gpuq), so an
  adaptive job (``gpuq submit --gpus 1-8``) runs with the world size of
  whatever GPUs the policy gives it, each time it starts.

A suspend is recognised by the acknowledgement file of this attempt in
``GPUQ_CHECKPOINT_DIR``, not by exit codes alone: rank 0 writes it only once
the checkpoint is complete.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from gpuq import env
from gpuq.runner import SUSPEND_EXIT_CODE
from gpuq.runner.job import ACK_FILE

TORCHRUN_DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
FORWARDED_SIGNALS = TORCHRUN_DEFAULT_SIGNALS + ",SIGUSR1"
"""What the launcher forwards to the workers unless told otherwise."""


def suspended(environ: Mapping[str, str] | None = None) -> bool:
    """True when this attempt's ranks acknowledged a checkpoint suspend."""
    directory = env.checkpoint_dir(environ)
    if env.job_id(environ) is None or directory is None:
        return False
    try:
        record = json.loads((Path(directory) / ACK_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(record, dict)
        and record.get("mode") == "checkpoint"
        and record.get("attempt") == env.attempt(environ)
    )


def gpuq_workers(argv: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """`argv` with `--nproc-per-node gpuq` (or `=gpuq`) as this attempt's GPU count."""
    count = str(max(len(env.gpu_uuids(environ)), 1))
    out: list[str] = []
    for index, arg in enumerate(argv):
        if arg in ("--nproc-per-node=gpuq", "--nproc_per_node=gpuq"):
            arg = arg.replace("=gpuq", f"={count}")
        elif (
            arg == "gpuq"
            and index > 0
            and argv[index - 1] in ("--nproc-per-node", "--nproc_per_node")
        ):
            arg = count
        out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run torchrun with `argv`; return its status, or SUSPEND_EXIT_CODE after a suspend."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    argv = gpuq_workers(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)  # type: ignore[no-untyped-call]
    if args.signals_to_handle == TORCHRUN_DEFAULT_SIGNALS:
        args.signals_to_handle = FORWARDED_SIGNALS
    try:
        run(args)  # type: ignore[no-untyped-call]
    except (ChildFailedError, SignalException):
        if suspended():
            return SUSPEND_EXIT_CODE
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
