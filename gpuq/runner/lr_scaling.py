"""The learning-rate rules of goodput tuning, AdaScale's gain and the progress a step makes.

Pure functions of the noise estimate (`gpuq.goodput.GradParams`, per M0
samples) and the batch sizes, called by `gpuq.runner.tuning.BatchTuner` around
every optimizer step; see that module for how they are used.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from gpuq.goodput import GradParams

LrScaling = Literal["adascale", "sqrt", "linear"]
LR_SCALING_RULES: tuple[str, ...] = get_args(LrScaling)
PRIOR = GradParams(0.0, 1.0)
"""Gradient statistics before any are measured: efficiency 1 at every batch size."""


def gain(grad: GradParams | None, init_batch: int, batch: int) -> float:
    """AdaScale's gain r = S * efficiency, as `gpuq.goodput.adascale_gain`, in plain floats.

    The training loop calls this at every step; numpy's scalar overhead is not worth it there.
    """
    grad = grad or PRIOR
    scale = batch / init_batch
    denominator = grad.var / scale + grad.sqr
    return (grad.var + grad.sqr) / denominator if denominator > 0 else 1.0


def lr_factor(rule: LrScaling, grad: GradParams | None, init_batch: int, batch: int) -> float:
    """The learning-rate multiplier for a step of `batch` samples under `rule` (1 up to M0)."""
    scale = batch / init_batch
    if scale <= 1:
        return 1.0
    if rule == "adascale":
        return gain(grad, init_batch, batch)
    if rule == "sqrt":
        return math.sqrt(scale)
    return scale


def progress_of(grad: GradParams | None, init_batch: int, batch: int) -> float:
    """Scale-invariant progress of one step: its samples times min(1, efficiency)."""
    if batch <= init_batch:
        return float(batch)
    return batch * min(1.0, gain(grad, init_batch, batch) * init_batch / batch)


def rescale_second_moments(
    optimizer: torch.optim.Optimizer,
    grad: GradParams | None,
    init_batch: int,
    old_batch: int,
    new_batch: int,
) -> None:
    """Scale Adam's second moments to the gradients of a new batch size.

    Adam's ``exp_avg_sq`` averages squared gradients over about 1 / (1 -
    beta2) steps (1,000 for 0.999), so after the batch grows it still holds
    the larger noise of the old batch, and the steps it divides come out
    smaller than the learning rate rule intends for as long (a transformer
    switched from 20 to 40 and 78 samples needed 40% more samples than one
    fixed at either). The expected squared gradient of a batch of B samples
    is |G|^2 + tr(Sigma) / B, so the moments are multiplied by
    (|G|^2 + tr(Sigma) / new) / (|G|^2 + tr(Sigma) / old), from the noise
    estimate (kept per M0 samples: tr(Sigma) / B = var * M0 / B). Pollux's
    artifact rescales Adam's state at a batch change too. Other optimizers,
    and a job without an estimate, are left alone.
    """
    if grad is None or old_batch == new_batch:
        return
    before = grad.sqr + grad.var * init_batch / old_batch
    after = grad.sqr + grad.var * init_batch / new_batch
    if before <= 0 or after <= 0:
        return
    factor = after / before
    for group in optimizer.param_groups:
        for param in group["params"]:
            moment = optimizer.state.get(param, {}).get("exp_avg_sq")
            if isinstance(moment, torch.Tensor):
                moment.mul_(factor)
