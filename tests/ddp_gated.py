"""The DDP example, held before one step's boundary until a file appears (tests only).

torchrun runs this in place of examples/runner_ddp/train.py. With
``GATE_STEP=n`` and ``GATE_FILE=path`` in the environment, every rank waits in
``gq.step()`` after step n has been printed and before step n + 1's boundary,
until `path` exists. A test signals the job while it waits, so the suspend
lands mid-training however slowly the test itself is scheduled.
"""

from __future__ import annotations

import os
import runpy
import time
from pathlib import Path
from typing import Any

import gpuq.runner as gq
from gpuq.runner.job import current_job

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "runner_ddp" / "train.py"


def main() -> None:
    """Wrap `gq.step` with the gate, then run the example as __main__."""
    gate_step = int(os.environ.get("GATE_STEP", "-1"))
    gate = Path(os.environ.get("GATE_FILE", "/nonexistent"))
    real_step = gq.step

    def gated_step(loss: Any = None) -> None:
        if current_job().step == gate_step:
            while not gate.exists():
                time.sleep(0.01)
        real_step(loss=loss)

    gq.step = gated_step
    runpy.run_path(str(EXAMPLE), run_name="__main__")


if __name__ == "__main__":
    main()
