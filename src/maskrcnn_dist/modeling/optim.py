"""Optimizer and learning-rate schedule as in torchvision's detection references.

SGD with momentum and weight decay; a linear warm-up over the first iterations; then the rate is
multiplied by `lr_gamma` at each epoch in `lr_steps`. One LambdaLR stepped per iteration does both,
so the schedule's whole state is one counter (simple to checkpoint, identical in every engine).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..config import OptimConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.SGD:
    trainable = [p for p in params if p.requires_grad]
    return torch.optim.SGD(trainable, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def lr_factor(iteration: int, cfg: OptimConfig, iters_per_epoch: int) -> float:
    """The multiplier of the base rate after `iteration` optimizer steps."""
    factor = 1.0
    if iteration < cfg.warmup_iters:
        alpha = iteration / cfg.warmup_iters
        factor = cfg.warmup_factor * (1 - alpha) + alpha
    passed = sum(1 for epoch in cfg.lr_steps if iteration >= epoch * iters_per_epoch)
    return factor * cfg.lr_gamma**passed


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, iters_per_epoch: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda it: lr_factor(it, cfg, max(1, iters_per_epoch)))
