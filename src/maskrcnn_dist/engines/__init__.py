"""The engines (base.py: their interface; torch_engine.py: local and ddp, elastic_ddp.py; pipeline/), one
entry each in ENGINES: what it needs of its process, which train.py asks instead of naming it. A new engine
is its module and one entry; only this face knows them all, and imports each one when it is picked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass

from maskrcnn_launcher.contract import MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, PodPlan

from ..config import TrainConfig
from ..errors import ConfigError
from ..lifetime.stop import Stopped, StopRequest
from .base import Engine, resolve_device

#: (num_classes, iters_per_epoch) -> Engine, once the session is open and the data is known.
EngineFactory = Callable[[int, int], Engine]
#: An engine's process-level session: its factory, and how many processes share the data.
Session = AbstractContextManager[tuple[EngineFactory, int]]
#: What a process that serves instead of training runs until its job is done (it gets the stop request).
Server = Callable[[StopRequest], None]


def _every_process_trains(cfg: TrainConfig, plan: PodPlan | None) -> Server | None:
    return None


@dataclass(frozen=True)
class EngineEntry:
    """What one engine needs of its process; the defaults are those of an engine alone in its process."""

    name: str
    #: Opens its process group (nothing, ddp's, the pipeline master's RPC) for the body: (cfg, plan, stop).
    session: Callable[[TrainConfig, PodPlan | None, StopRequest], Session]
    #: Its worker role: (cfg, plan) -> what this process serves instead of training, None where it trains.
    server: Callable[[TrainConfig, PodPlan | None], Server | None] = _every_process_trains
    #: Runs under torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); its rank 0 writes.
    torchrun: bool = False
    #: --device places its model (the pipeline's topology places the stages instead, and never reads it).
    reads_device: bool = True
    #: Where the images are checked: before any session, by this process alone, so that no peer holds a
    #: GPU for a dataset that cannot be read; or (False) in the group, on rank 0, its verdicts for all.
    checks_data_first: bool = True
    #: No peers: a stop asked before the first step ends the process after its phase. Engines with peers
    #: first form their group so that they leave it together (the Trainer stops them).
    alone: bool = False

    def check_environment(self, env: Mapping[str, str] = os.environ) -> None:
        """What the engine needs of its environment, said before any work."""
        missing = [name for name in (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) if not env.get(name)]
        if self.torchrun and missing:
            raise ConfigError(
                f"--engine {self.name} runs under torchrun or the launcher, but {', '.join(missing)} not set: "
                f"`torchrun --nproc-per-node N -m maskrcnn_dist.cli train --engine {self.name} ...`, "
                "or `maskrcnn-launch`"
            )

    def check_device(self, cfg: TrainConfig) -> None:
        """--device cuda on a machine without one is refused before any data is made."""
        if self.reads_device:
            resolve_device(cfg.device)

    def is_main_process(self, env: Mapping[str, str] = os.environ) -> bool:
        """The process that writes the run's metrics and checkpoints: torchrun's rank 0, or the only
        process that trains (the pipeline's master: its stage workers never train)."""
        return not self.torchrun or env.get(RANK, "0") == "0"

    def stop_before_start(self, stop: StopRequest, phase: str) -> None:
        """A stop asked before training starts: an engine alone stops after the `phase` it came in (no
        step yet: nothing to save)."""
        if self.alone and stop.requested:
            raise Stopped.before_any_step(stop, phase)


@contextmanager
def _local_session(cfg: TrainConfig, plan: PodPlan | None, stop: StopRequest) -> Iterator[tuple[EngineFactory, int]]:
    from .torch_engine import TorchEngines

    yield TorchEngines(cfg, False, stop), 1


@contextmanager
def _ddp_session(cfg: TrainConfig, plan: PodPlan | None, stop: StopRequest) -> Iterator[tuple[EngineFactory, int]]:
    """The process group (or, with --elastic, the job's elastic group: the data is planned for the launch's
    world)."""
    if cfg.peers.elastic:
        from .elastic_ddp import ElasticEngines, elastic_session

        with elastic_session(cfg) as group:
            yield ElasticEngines(cfg, group, stop), group.launch_world
        return
    from .torch_engine import TorchEngines, process_group

    with process_group(cfg) as world_size:
        yield TorchEngines(cfg, True, stop), world_size


@contextmanager
def _pipeline_session(cfg: TrainConfig, plan: PodPlan | None, stop: StopRequest) -> Iterator[tuple[EngineFactory, int]]:
    """The master's RPC (it gets `stop`, for its workers' calls); the master reads every batch."""
    from .pipeline import PipelineEngine, master_session

    plan = plan or PodPlan.from_env()
    with master_session(cfg, plan, stop):
        yield (
            lambda num_classes, iters: PipelineEngine(
                cfg, plan.stages, num_classes, iters, transport=plan.transport, stop=stop
            ),
            1,
        )


def _pipeline_stage_worker(cfg: TrainConfig, plan: PodPlan | None) -> Server | None:
    """A stage worker (the launcher's pod plan, by default) serves the master's stages until it is done."""
    plan = plan or PodPlan.from_env()
    if plan.role == "master":
        return None
    from .pipeline import serve

    return lambda stop: serve(cfg, plan, stop)


ENGINES: dict[str, EngineEntry] = {
    entry.name: entry
    for entry in (
        EngineEntry("local", _local_session, alone=True),
        EngineEntry("ddp", _ddp_session, torchrun=True, checks_data_first=False),
        EngineEntry("pipeline", _pipeline_session, server=_pipeline_stage_worker, reads_device=False),
    )
}


def engine_entry(cfg: TrainConfig) -> EngineEntry:
    """The entry of `cfg.engine` (config.ENGINES names the same engines: tests/trainer/engines/test_entries.py)."""
    return ENGINES[cfg.engine]
