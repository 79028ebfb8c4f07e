"""Optimizer and learning-rate schedule as in torchvision's detection references.

SGD with momentum and weight decay (with --norm-weight-decay, a second decay for the normalization
layers' parameters, as the references' `split_normalization_params` groups them); a linear warm-up over
the first iterations; then the rate is multiplied by `lr_gamma` at each epoch in `lr_steps`
(multisteplr), or follows a cosine over the run's epochs (cosineannealinglr). Both move once per epoch,
as the references' schedulers stepped at epoch ends do. One LambdaLR stepped per iteration does it all,
so the schedule's whole state is one counter (simple to checkpoint, identical in every engine).

Its rate function is `lr_factor`, a module-level function bound to the run's figures with
functools.partial, not a closure: a scheduler pickles (what a pipeline stage holds must survive
TensorPipe's pickle walk, engines/pipeline/guard.py), and its state dict keeps nothing of the
function (`lr_lambdas` is `[{}]`: a partial's empty `__dict__`), so a checkpoint never fixes the schedule's
settings: a resumed run follows its own flags.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn
from torchvision.ops._utils import split_normalization_params

from ..config import OptimConfig

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "param_groups"]


def param_groups(module: nn.Module, cfg: OptimConfig) -> list[dict]:
    """The trainable parameters as SGD param groups: one, in module order, without --norm-weight-decay
    (the layout the pipeline's stage optimizers merge); else the references' two: normalization layers'
    parameters at --norm-weight-decay, then the rest at --weight-decay (an empty group left out)."""
    if cfg.norm_weight_decay is None:
        return [{"params": [p for p in module.parameters() if p.requires_grad]}]
    norm, other = split_normalization_params(module)
    decays = (cfg.norm_weight_decay, cfg.weight_decay)
    return [{"params": params, "weight_decay": decay} for params, decay in zip((norm, other), decays) if params]


def build_optimizer(module: nn.Module, cfg: OptimConfig) -> torch.optim.SGD:
    return torch.optim.SGD(param_groups(module, cfg), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def lr_factor(iteration: int, cfg: OptimConfig, iters_per_epoch: int, total_steps: int) -> float:
    """The multiplier of the base rate after `iteration` optimizer steps of a run of `total_steps`."""
    factor = 1.0
    if iteration < cfg.warmup_iters:
        alpha = iteration / cfg.warmup_iters
        factor = cfg.warmup_factor * (1 - alpha) + alpha
    if cfg.lr_scheduler == "cosineannealinglr":
        # torchvision's CosineAnnealingLR(T_max=epochs), stepped at epoch ends; a --max-steps run
        # anneals over the epochs it reaches into, so that it ends near 0 as a whole run would.
        epochs = max(1, math.ceil(total_steps / iters_per_epoch))
        return factor * 0.5 * (1 + math.cos(math.pi * (iteration // iters_per_epoch) / epochs))
    passed = sum(1 for epoch in cfg.lr_steps if iteration >= epoch * iters_per_epoch)
    return factor * cfg.lr_gamma**passed


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, iters_per_epoch: int, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedule of a run of `total_steps` optimizer steps (TrainConfig.total_steps)."""
    schedule = functools.partial(lr_factor, cfg=cfg, iters_per_epoch=max(1, iters_per_epoch), total_steps=total_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
