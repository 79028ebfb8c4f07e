"""The exact single-process reference that pipeline micro-batches and ddp ranks must reproduce."""

from __future__ import annotations

import copy
from dataclasses import replace

import torch

from maskrcnn_dist.config import TrainConfig
from maskrcnn_dist.engines.torch_engine import TorchEngine


def local_accumulating(
    cfg: TrainConfig,
    steps: int,
    batch: tuple[list, list],
    micro_batches: int,
    num_classes: int,
    state_after: int | None = None,
) -> tuple[list[dict[str, float]], dict]:
    """The reference for pipeline M>1 and for ddp, written out here rather than taken from an engine: one
    process runs the whole model on each contiguous micro-batch (seeded at (step, k) as the stages
    are; a ddp rank seeds at (step, rank)), weighs micro-batch k's loss terms by its share of the
    images (the terms are means within a micro-batch), backpropagates their sum into accumulated
    gradients, clips globally, steps. Returns every step's loss terms and the state after the last step,
    or after step `state_after` (1-based) when given."""
    engine = TorchEngine(replace(cfg, engine="local"), num_classes, iters_per_epoch=10)
    images, targets = batch
    bounds = [round(i * len(images) / micro_batches) for i in range(micro_batches + 1)]
    losses, kept = [], None
    for step in range(steps):
        engine.model.train()
        engine.optimizer.zero_grad(set_to_none=True)
        total: dict[str, torch.Tensor] = {}
        for k, (a, b) in enumerate(zip(bounds, bounds[1:])):
            engine.seeder.at(step, micro=k)
            terms = engine.model(images[a:b], targets[a:b])
            for name, value in terms.items():
                total[name] = total.get(name, 0) + value * ((b - a) / len(images))
        sum(total.values()).backward()
        if cfg.optim.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(engine.model.parameters(), cfg.optim.clip_grad_norm)
        engine.optimizer.step()
        engine.scheduler.step()
        losses.append({name: float(value.detach()) for name, value in total.items()})
        if step + 1 == state_after:
            kept = copy.deepcopy(engine.state_dict())
    return losses, engine.state_dict() if kept is None else kept
