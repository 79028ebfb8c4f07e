"""The composition root: the one place that turns a TrainConfig into a running job.

`train(cfg)` is what `maskrcnn-dist train` and `eval` run, for every engine:

    set up the process once (threads, denormal flushing)
    pipeline stage worker?  -> serve the master's stages until it is done
    load the data once (the pipeline master before joining RPC: a bad --data-path stops it alone)
    open the engine's session (nothing / the ddp process group / the pipeline master's RPC)
    build the engine and the Trainer with the same iterations per epoch, then fit or evaluate

Engines never import this module; the CLI calls nothing else to train.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from maskrcnn_launcher.contract import PodPlan

from .config import TrainConfig
from .data import CocoInstanceDataset, load_datasets, num_train_batches
from .engines.base import Engine
from .errors import ConfigError, DatasetError
from .loop import Trainer, TrainResult
from .perf import set_flush_denormal

log = logging.getLogger(__name__)

Datasets = tuple[CocoInstanceDataset, CocoInstanceDataset | None]
# (num_classes, iters_per_epoch) -> Engine, once the session is open and the data is known.
EngineFactory = Callable[[int, int], Engine]


def setup_process(cfg: TrainConfig, default_threads: int | None = None) -> None:
    """Per-process numeric settings that must precede any model code. `default_threads` applies when
    --threads is not given (a pipeline stage worker shares its machine: 1)."""
    threads = cfg.threads or default_threads
    if threads:
        torch.set_num_threads(threads)
    # A randomly initialised Mask R-CNN produces denormal floats that make some CPU iterations 3-6x
    # slower; flushing them to zero changes nothing a detector can notice. Before any computation:
    # intra-op threads copy the setting when they start (perf.set_flush_denormal checks they did).
    set_flush_denormal(cfg.flush_denormal)


def train(cfg: TrainConfig, plan: PodPlan | None = None) -> TrainResult | None:
    """Train (or only evaluate, with cfg.test_only) as configured. Returns where training ended, or
    None on a pipeline stage worker. `plan`: the pipeline's pod plan (default: from the launcher's
    MASKRCNN_POD_PLAN)."""
    if cfg.engine == "pipeline":
        plan = plan or PodPlan.from_env()
        if plan.role != "master":
            from .engines.pipeline import serve

            setup_process(cfg, default_threads=1)
            serve(cfg, plan)
            return None
    setup_process(cfg)
    datasets = load_datasets(cfg)
    with _engine_session(cfg, plan) as (make_engine, data_world_size):
        return _run(cfg, datasets, make_engine, data_world_size)


@contextmanager
def _engine_session(cfg: TrainConfig, plan: PodPlan | None) -> Iterator[tuple[EngineFactory, int]]:
    """The engine's process-level session, with its engine factory and how many processes share the data."""
    if cfg.engine == "pipeline":
        from .engines.pipeline import PipelineEngine, master_session

        assert plan is not None
        with master_session(cfg, plan):
            yield (
                lambda num_classes, iters: PipelineEngine(
                    cfg, plan.stages, num_classes, iters, transport=plan.transport
                ),
                1,  # the master reads every batch
            )
        return
    from .engines.torch_engine import TorchEngine, process_group

    distributed = cfg.engine == "ddp"
    with process_group(cfg) if distributed else contextlib.nullcontext(1) as world_size:
        yield (lambda num_classes, iters: TorchEngine(cfg, num_classes, iters, distributed=distributed)), world_size


def _run(cfg: TrainConfig, datasets: Datasets, make_engine: EngineFactory, data_world_size: int) -> TrainResult:
    train_set, val_set = datasets
    # One number for the engine's schedule and the Trainer's epochs.
    iters = num_train_batches(len(train_set), cfg.data.batch_size, world_size=data_world_size)
    engine = make_engine(train_set.num_classes, iters)
    trainer = Trainer(cfg, engine, train_set, val_set, iters)
    try:
        if cfg.test_only:
            if cfg.resume is None and cfg.model.weights is None:
                raise ConfigError("--test-only needs --resume CHECKPOINT or --weights FILE")
            if val_set is None:
                raise DatasetError(f"--test-only: no val split under {cfg.data.data_path}")
            trainer.resume()
            trainer.run_evaluation()
        else:
            trainer.fit()
        return TrainResult(trainer.position, trainer.last_val, trainer.last_eval, cfg.output_dir)
    finally:
        trainer.close()
        engine.close()
