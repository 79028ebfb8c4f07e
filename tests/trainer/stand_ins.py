"""Stand-ins for the trainer tests that drive the Trainer without a real model."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import torch

from maskrcnn_dist.checkpoint import load_resume
from maskrcnn_dist.config import TrainConfig
from maskrcnn_dist.engines.base import Engine
from maskrcnn_dist.lifetime.stop import StopRequest
from maskrcnn_dist.trainer_parts import build_trainer, run_metrics
from maskrcnn_dist.training.loop import Trainer


class CountingEngine(Engine):
    """The Trainer's engine with a model of one number, the steps it has taken."""

    name = "local"

    def __init__(self, stop: StopRequest | None = None) -> None:
        super().__init__(stop)
        self.steps = torch.zeros(1)

    def train_step(self, step, images, targets):
        self.steps += 1
        return {"loss_classifier": 1.0}

    def predict(self, images):
        raise AssertionError("evaluation is scripted")

    def validation_losses(self, images, targets):
        raise AssertionError("validation is scripted")

    def state_dict(self):
        return {"model": {"steps": self.steps.clone()}}

    def load_state_dict(self, state):
        self.steps = state["model"]["steps"].clone()

    def lr(self):
        return 0.01


class DataParallelRank(CountingEngine):
    """One of two data-parallel ranks, the other simulated: every all-reduce adds the other rank's
    contribution, `others` (rank 0's evaluation, as rank 1 receives it; rank 1's zero, as rank 0 does)."""

    data_world_size = 2

    def __init__(self, rank: int, others: float, stop: StopRequest | None = None) -> None:
        super().__init__(stop)
        self.data_rank, self.others = rank, others
        self.reduced: list[torch.Tensor] = []  # what this rank contributed to each all-reduce

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        self.reduced.append(tensor.clone())
        return tensor + self.others


def fit_counting(
    cfg: TrainConfig,
    train_set,
    val_set,
    iters_per_epoch: int,
    stop: StopRequest | None = None,
    engine: CountingEngine | None = None,
) -> Trainer:
    """Train as train.py would (its hooks, resume first if asked), with the counting engine (or `engine`)."""
    engine = engine if engine is not None else CountingEngine(stop)
    with closing(run_metrics(cfg, engine.is_main, cfg.total_steps(iters_per_epoch))) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, iters_per_epoch, metrics, stop)
        resume(trainer, cfg)
        trainer.fit()
    return trainer


def with_flat_hook_state(checkpoint: Path) -> None:
    """Rewrite `checkpoint` in the layout checkpoints had before hook state was nested under "hooks": each
    hook's state at the top level under its name, the evaluation's as "best" (what ce77e5b wrote)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    for name, hook_state in state.pop("hooks").items():
        state["best" if name == "evaluation" else name] = hook_state
    torch.save(state, checkpoint)


def resume(trainer: Trainer, cfg) -> None:
    """Continue from cfg.resume as train._run does: every hook's state and the pending hooks the checkpoint holds."""
    if (saved := load_resume(cfg.resume, cfg.output_dir)) is not None:
        trainer.restore(*saved)
