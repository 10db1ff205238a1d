"""A two-server PyTorch job for the multi-node tests: one all-reduce over gloo.

Each part joins the process group from the rendezvous environment gpuq
sets (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), adds its rank + 1 into
a tensor with every other part, and prints what it saw.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=90))
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(
        f"rank {rank} of {world} on {os.environ['GPUQ_NODE']}: sum {total.item():g}, "
        f"GPUs {os.environ['CUDA_VISIBLE_DEVICES']}, master {os.environ['MASTER_ADDR']}",
        flush=True,
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
