"""The composition root: the one place that turns a TrainConfig into a running job.

`train(cfg)` is what `maskrcnn-dist train` and `eval` run, for every engine:

    set up the process once (threads, denormal flushing)
    pipeline stage worker?  -> serve the master's stages until it is done
    open the data once, through its front door (data/prepare.py; the pipeline master before joining RPC:
        a bad --data-path stops it alone), and check every image once: local and the pipeline master
        before any session, so no worker is asked to hold a GPU for a dataset that cannot be read; ddp
        on rank 0 as soon as the group is open, the verdicts broadcast so every rank drops the same images
    open the engine's session (nothing / the ddp process group / the pipeline master's RPC)
    build the engine and the Trainer with the same iterations per epoch, then fit or evaluate

SIGTERM and SIGINT ask for a stop from the start (stop.py: the entry point, cli.py, installs the request and
this hands it down): the local engine stops after the phase it is in; ddp and pipeline processes first
form their group, so that they leave it together, and stop before the first step. Engines never import
this module; the CLI calls nothing else to train.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from maskrcnn_launcher.contract import PodPlan

from .categories import Categories
from .checkpoint import Checkpointer, load_resume
from .config import TrainConfig, config_to_dict
from .data import (
    LAYOUT_KEY,
    WORLD_SIZE_KEY,
    BatchLayout,
    CocoInstanceDataset,
    ParseAhead,
    flagged_sources,
    open_data,
    sources_of,
    train_loaders,
)
from .engines import (
    EngineFactory,
    check_device,
    engine_session,
    is_main_process,
    require_torchrun_environment,
    stop_before_start,
)
from .engines.base import Engine
from .errors import DatasetError
from .lifetime.process import setup_process
from .lifetime.stop import Interrupted, RunOver, Stopped, StopRequest
from .modeling.trained import TRAINED_MODEL_KEY, TrainedModel, check_model_files
from .run_dir import checkpoint_dir, hold_output_dir, samples_path
from .training.best import BestTracker, check_best_metric
from .training.elastic_loop import ElasticTrainer
from .training.grace import grace_seconds
from .training.hooks import Evaluation, EvaluationHook, GraceHook, MetricsHook, PeriodicCheckpointer, ValidationHook
from .training.loop import HookBase, RunCheckpointer, Trainer
from .training.metrics import MetricsWriter
from .training.progress_post import poster_from_env
from .training.resume_plan import RunPlan, run_plan
from .training.samples import SampleRecordHook
from .training.state import Position

Datasets = tuple[CocoInstanceDataset, CocoInstanceDataset | None]


def train(
    cfg: TrainConfig,
    plan: PodPlan | None = None,
    stop: StopRequest | None = None,
    parsing: ParseAhead | None = None,
    record: bool = True,
) -> TrainResult | None:
    """Train (or only evaluate, with cfg.test_only) as configured. Returns where training ended, or None on
    a pipeline stage worker or an elastic replacement with nothing left to join (RunOver); raises Stopped
    when a stop request ended it (its checkpoint written). `plan`: the pipeline's pod plan (default: the
    launcher's MASKRCNN_POD_PLAN). `stop`: the process's stop request, made and installed by its entry
    point (cli.py, stop.stop_on_signals); by default one that no signal feeds: nothing asks a library
    caller's run to stop. `parsing`: the annotation files its entry point started parsing (parse_ahead.py):
    released to write their caches once the flags and the output folder are accepted, done once loaded.
    `record` False: an eval that writes nothing."""
    if not record:
        cfg = cfg.unrecorded()
    return _train(cfg, plan, stop if stop is not None else StopRequest(), parsing, record)


def _train(
    cfg: TrainConfig, plan: PodPlan | None, stop: StopRequest, parsing: ParseAhead | None, record: bool
) -> TrainResult | None:
    check_best_metric(cfg.best_metric)  # on every process, stage workers too: they all refuse it alike
    if cfg.engine == "pipeline":
        plan = plan or PodPlan.from_env()
        if plan.role != "master":
            from .engines.pipeline import serve

            setup_process(cfg, default_threads=1)
            serve(cfg, plan, stop)
            return None
    if cfg.engine == "ddp":
        require_torchrun_environment()
    setup_process(cfg)
    grace_s = grace_seconds()
    check_device(cfg)
    check_model_files(cfg)
    # Where the data is, before anything is written: a wrong data flag leaves the output dir untouched.
    sources = flagged_sources(cfg)
    # Held by the writing process from before anything is written there until the run ends (run_dir.py).
    folder = cfg.output_dir, cfg.resume, cfg.test_only, cfg.overwrite
    with hold_output_dir(*folder) if record and is_main_process(cfg) else contextlib.nullcontext():
        # The process that checks the images reads them while the annotations are parsed (data/check_ahead.py).
        with open_data(cfg, sources, parsing, checks=is_main_process(cfg)) as opened:
            if cfg.engine != "ddp":
                stop_before_start(cfg, stop, "data loading")
                datasets = opened.build()
                stop_before_start(cfg, stop, "the data check")
            with contextlib.suppress(RunOver), engine_session(cfg, plan, stop) as (make_engine, data_world_size):
                if cfg.engine == "ddp":  # checked on rank 0, its verdicts given to every rank
                    datasets = opened.build(make_engine.on_rank0)  # type: ignore[attr-defined]
                return _run(cfg, datasets, make_engine, data_world_size, stop, grace_s, record)


def _run(
    cfg: TrainConfig,
    datasets: Datasets,
    make_engine: EngineFactory,
    data_world_size: int,
    stop: StopRequest,
    grace_s: float | None,
    record: bool = True,
) -> TrainResult:
    train_set, val_set = datasets
    # The checkpoint's global batch at any world size (data/plan.py): its steps per epoch set the schedule.
    saved = load_resume(cfg.resume, cfg.output_dir)  # (one written before the plan: training/resume_plan.py)
    plan = run_plan(saved, len(train_set), cfg.data.batch_size, data_world_size, is_main_process(cfg))
    iters = plan.layout.steps_per_epoch(len(train_set))
    engine = make_engine(train_set.num_classes, iters)
    if cfg.test_only and val_set is None:
        raise DatasetError(
            "--test-only: the dataset has no val split (--val-annotations, or --val-fraction as trained)"
        )
    total = cfg.total_steps(iters)
    with contextlib.closing(engine), contextlib.closing(run_metrics(cfg, engine.is_main and record, total)) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, iters, metrics, stop, grace_s, plan)
        if saved is not None:  # --resume: every hook's state and the pending hooks the checkpoint holds
            trainer.restore(*saved)
        if cfg.test_only:
            metrics.total_steps = trainer.position.step  # "step 8/8", not a total of eval's default --epochs
            evaluation = evaluate_only(trainer.position.step, evaluation_of(cfg, engine, val_set, metrics), stop)
            return TrainResult(trainer.position, None, evaluation, cfg.output_dir)
        trainer.fit()
        results = trainer.results
        val, evaluation = results.get(ValidationHook.name), results.get(EvaluationHook.name)
        return TrainResult(trainer.position, val, evaluation, cfg.output_dir, trainer.stopped_early)


@dataclass
class TrainResult:
    position: Position
    val: dict[str, float] | None
    eval: dict[str, float] | None
    output_dir: Path
    stopped_early: str | None = None  # the closing line of a --patience stop


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
    this launch's) the run's global batch, kept with the world size in its checkpoints."""
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
    trainer_type = ElasticTrainer if cfg.engine == "ddp" and cfg.peers.elastic else Trainer
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
