"""The engines, and the one place that picks one for `--engine`: the composition root (train.py) asks
here for the engine's session and factory, and for what an engine needs of its process before any work.

base.py          the Engine interface and what every engine shares
torch_engine.py  `local` and `ddp`: the whole model in this process
pipeline/        `pipeline`: the model in stages on RPC workers

No engine module imports another; only this package's face knows them all, and it imports each one
when it is picked (the pipeline's RPC stays unloaded for the others).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from maskrcnn_launcher.contract import MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, PodPlan

from ..config import TrainConfig
from ..errors import ConfigError
from ..lifetime.stop import Stopped, StopRequest
from .base import Engine, resolve_device

T = TypeVar("T")
#: (num_classes, iters_per_epoch) -> Engine, once the session is open and the data is known.
EngineFactory = Callable[[int, int], Engine]


def require_torchrun_environment() -> None:
    """--engine ddp needs the variables torchrun (or the launcher) sets; say so before any work."""
    missing = [name for name in (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"--engine ddp runs under torchrun or the launcher, but {', '.join(missing)} not set: "
            "`torchrun --nproc-per-node N -m maskrcnn_dist.cli train --engine ddp ...`, or `maskrcnn-launch`"
        )


def check_device(cfg: TrainConfig) -> None:
    """--device cuda on a machine without one is refused before any data is made, for the engines that
    use --device (local, ddp): the pipeline places its stages by the topology and never reads it."""
    if cfg.engine != "pipeline":
        resolve_device(cfg.device)


def is_main_process(cfg: TrainConfig) -> bool:
    """The process that writes the run's metrics and checkpoints: ddp's rank 0, the pipeline's master
    (its stage workers never train), the local engine's only process."""
    return cfg.engine != "ddp" or os.environ.get(RANK, "0") == "0"


def stop_before_start(cfg: TrainConfig, stop: StopRequest, phase: str) -> None:
    """A stop asked before training starts: the local engine stops after the phase it came in (no step
    yet: nothing to save). Engines with peers first form their group, so that they all leave it
    together: the Trainer stops them."""
    if cfg.engine == "local" and stop.requested:
        raise Stopped.before_any_step(stop, phase)


@contextmanager
def engine_session(cfg: TrainConfig, plan: PodPlan | None, stop: StopRequest) -> Iterator[tuple[EngineFactory, int]]:
    """The engine's process-level session (nothing, the ddp process group, the pipeline master's RPC),
    with its engine factory and how many processes share the data; the engines it makes, and the
    pipeline master's session (for its workers' RPC calls), get `stop`."""
    if cfg.engine == "pipeline":
        from .pipeline import PipelineEngine, master_session

        assert plan is not None
        with master_session(cfg, plan, stop):
            yield (
                lambda num_classes, iters: PipelineEngine(
                    cfg, plan.stages, num_classes, iters, transport=plan.transport, stop=stop
                ),
                1,  # the master reads every batch
            )
        return
    if cfg.engine == "ddp" and cfg.peers.elastic:
        from .elastic_ddp import ElasticEngines, elastic_session

        with elastic_session(cfg) as group:
            yield ElasticEngines(cfg, group, stop), group.launch_world  # the data is planned for the launch's world
        return
    from .torch_engine import process_group

    distributed = cfg.engine == "ddp"
    with process_group(cfg) if distributed else contextlib.nullcontext(1) as world_size:
        yield TorchEngines(cfg, distributed, stop), world_size


class TorchEngines:
    """The local and ddp engines' factory (EngineFactory); `on_rank0` runs the data check once, on rank 0,
    its result broadcast to every rank (an elastic group's factory keeps it in the job's store instead)."""

    def __init__(self, cfg: TrainConfig, distributed: bool, stop: StopRequest) -> None:
        self.cfg, self.distributed, self.stop = cfg, distributed, stop

    def __call__(self, num_classes: int, iters_per_epoch: int) -> Engine:
        from .torch_engine import TorchEngine

        return TorchEngine(self.cfg, num_classes, iters_per_epoch, distributed=self.distributed, stop=self.stop)

    def on_rank0(self, compute: Callable[[], T]) -> T:
        from .torch_engine import on_rank0

        return on_rank0(compute)
