"""The run's parts, built from a TrainConfig by the composition root (train.py): the Trainer with the
hooks of a run, in the order they run at a boundary, its metrics writer, and the evaluation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .categories import Categories
from .checkpoint import Checkpointer
from .config import TrainConfig, config_to_dict
from .data import LAYOUT_KEY, WORLD_SIZE_KEY, BatchLayout, CocoInstanceDataset, sources_of, train_loaders
from .engines.base import Engine
from .lifetime.stop import Interrupted, Stopped, StopRequest
from .modeling.trained import TRAINED_MODEL_KEY, TrainedModel
from .run_dir import checkpoint_dir, samples_path
from .training.best import BestTracker
from .training.elastic_loop import ElasticTrainer
from .training.hooks import Evaluation, EvaluationHook, GraceHook, MetricsHook, PeriodicCheckpointer, ValidationHook
from .training.loop import HookBase, RunCheckpointer, Trainer
from .training.metrics import MetricsWriter
from .training.progress_post import poster_from_env
from .training.resume_plan import RunPlan
from .training.samples import SampleRecordHook


def run_metrics(cfg: TrainConfig, is_main: bool, total: int, env: Mapping[str, str] = os.environ) -> MetricsWriter:
    """The run's metrics writer (it writes on the main process only), with its sinks: under Kubeflow
    Trainer with its status endpoint configured, the TrainJob's progress poster."""
    poster = poster_from_env(env, total) if is_main else None
    return MetricsWriter(cfg.output_dir, is_main, total, cfg.print_freq, sinks=[poster] if poster else [])


def build_trainer(
    cfg: TrainConfig,
    engine: Engine,
    train_set: CocoInstanceDataset,
    val_set: CocoInstanceDataset | None,
    iters_per_epoch: int,
    metrics: MetricsWriter,
    stop: StopRequest | None = None,
    grace_s: float | None = None,
    plan: RunPlan | None = None,
) -> Trainer:
    """The Trainer for `cfg`, with the hooks of a run (build_hooks) writing to `metrics`; `plan` (default:
    this launch's) the run's global batch, kept with the world size in its checkpoints, and the epoch a
    checkpoint from before the plan finishes in its old order (training/resume_plan.py)."""
    plan = plan or RunPlan(BatchLayout(engine.data_world_size, cfg.data.batch_size))
    loader = train_loaders(cfg, train_set, engine, plan.layout, plan.old_order)  # the epoch's steps, batched
    categories = Categories.of_dataset(train_set)
    run_facts = {
        **{LAYOUT_KEY: plan.layout.to_state(), WORLD_SIZE_KEY: engine.data_world_size, **plan.facts()},
        "config": config_to_dict(cfg),
        # label -> (category id, name): predict labels its drawings without the dataset.
        "categories": categories.to_state(),
        # What rebuilds this model exactly, for every tool that reads the checkpoint.
        TRAINED_MODEL_KEY: TrainedModel.of_run(cfg, categories, sources_of(cfg, train_set, val_set)).to_record(),
    }
    files = Checkpointer(checkpoint_dir(cfg.output_dir), cfg.keep_checkpoints, engine.is_main)
    total = cfg.total_steps(iters_per_epoch)
    trainer_type = ElasticTrainer if cfg.peers.elastic else Trainer  # config: --elastic is ddp's alone
    args = (engine, loader, iters_per_epoch, total, files, stop or StopRequest(), run_facts, cfg.print_freq)
    trainer = trainer_type(*args)
    samples = SampleRecordHook(samples_path(cfg.output_dir, trainer.record_rank), train_set, engine.is_main)
    trainer.register_hooks([*build_hooks(cfg, engine, val_set, metrics, trainer.checkpointer, grace_s), samples])
    return trainer


def build_hooks(
    cfg: TrainConfig,
    engine: Engine,
    val_set: CocoInstanceDataset | None,
    metrics: MetricsWriter,
    checkpointer: RunCheckpointer,
    grace_s: float | None,
) -> list[HookBase]:
    """What runs around the steps, in the order they run at a boundary where several are due."""
    data = cfg.data
    hooks: list[HookBase] = [MetricsHook(metrics, engine)]
    if engine.is_main:
        hooks.append(GraceHook(grace_s, checkpointer))
    best = BestTracker(cfg.best_metric, cfg.patience)
    hooks += [
        ValidationHook(engine, val_set, cfg.val_period, data.val_batch_size, data.workers, metrics),
        EvaluationHook(
            evaluation_of(cfg, engine, val_set, metrics), cfg.eval_every_epoch, best, checkpointer, engine, metrics
        ),
        PeriodicCheckpointer(cfg.checkpoint_period, checkpointer),
    ]
    return hooks


def evaluation_of(
    cfg: TrainConfig, engine: Engine, val_set: CocoInstanceDataset | None, metrics: MetricsWriter
) -> Evaluation | None:
    """COCO AP of the engine's model on `val_set` (None: there is no val split), recorded in `metrics`."""
    return None if val_set is None else Evaluation(engine, val_set, cfg.data.val_batch_size, cfg.data.workers, metrics)


def evaluate_only(step: int, evaluation: Evaluation | None, stop: StopRequest) -> dict[str, float] | None:
    """--test-only: COCO AP of the --resume checkpoint (or of the --weights model), recorded at its `step`."""
    assert evaluation is not None  # _run refuses --test-only without a val split
    try:
        return evaluation(step)
    except Interrupted:
        stop.finish("evaluation only, nothing to save")
        raise Stopped(stop, "evaluation") from None
