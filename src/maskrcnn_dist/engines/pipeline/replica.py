"""A stage replica: one copy of a stage's modules on one device, with its optimizer, schedule, stream and
turnstile. Every replica of a stage starts from the same weights and stays bitwise equal to the others
(update.py averages their gradients and buffers)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from maskrcnn_launcher.contract import StagePlacement
from torch import nn

from ...config import TrainConfig
from ...modeling.model import build_model
from ...modeling.optim import build_optimizer, build_scheduler
from ...modeling.perf import amp_dtype
from ...modeling.rng import StepSeeder
from .rounds import Turnstile
from .stages import StageModule, build_stages
from .streams import Lane, StreamOps


@dataclass
class Replica:
    stage: StageModule
    lane: Lane  # its stream: all of its GPU work runs there
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    seeder: StepSeeder
    turnstile: Turnstile = field(default_factory=Turnstile)

    @property
    def device(self) -> torch.device:
        return self.lane.device

    @property
    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.stage.parameters() if p.requires_grad]

    def state_tensors(self) -> list[torch.Tensor]:
        optimizer_state = self.optimizer.state_dict()["state"]
        momenta = [v for i in sorted(optimizer_state) for v in optimizer_state[i].values() if torch.is_tensor(v)]
        return list(self.stage.state_dict().values()) + momenta


def autocast_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The dtype this device's stage computes in under --amp (perf.amp_dtype), None without --amp."""
    return amp_dtype(device, cfg.amp_dtype) if cfg.amp else None


def build_replicas(
    cfg: TrainConfig,
    placements: Sequence[StagePlacement],
    index: int,
    num_classes: int,
    iters_per_epoch: int,
    streams: StreamOps | None = None,
) -> list[Replica]:
    """Stage `index` of `placements`: one replica per device of its placement."""
    # Every process builds the whole model from the same seed, so stages start from exactly the weights
    # the local engine starts from (TorchEngine seeds the same way), then keeps its part.
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, num_classes, keep_data_sizes=cfg.data.sized_by_data())
    stage = build_stages(model, [p.modules for p in placements])[index]
    replicas = []
    for r, device in enumerate(placements[index].devices):
        lane = Lane(torch.device(device), streams)
        with lane.entered():  # the copy to the device is the replica's first work on its stream
            module = (stage if r == 0 else copy.deepcopy(stage)).to(lane.device)
            optimizer = build_optimizer(module, cfg.optim)
        seeder = StepSeeder(cfg.seed)
        seeder.attach(module.parts())
        total_steps = cfg.total_steps(iters_per_epoch)
        scheduler = build_scheduler(optimizer, cfg.optim, iters_per_epoch, total_steps)
        replicas.append(Replica(module, lane, optimizer, scheduler, seeder))
    return replicas
