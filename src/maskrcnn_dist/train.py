"""The composition root: `train(cfg)` turns a TrainConfig into a running job, asking the engine's entry
(engines/) what its process needs (a worker role, its environment, where the images are checked, its
session) and never its name; trainer_parts.py builds the Trainer and its hooks. Engines never import it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from maskrcnn_launcher.contract import PodPlan

from .checkpoint import load_resume
from .config import TrainConfig
from .data import CocoInstanceDataset, OpenedData, ParseAhead, flagged_sources, open_data
from .engines import EngineEntry, EngineFactory, engine_entry
from .errors import DatasetError
from .lifetime.stop import RunOver, StopRequest
from .modeling.perf import setup_process
from .modeling.trained import check_model_files
from .run_dir import hold_output_dir
from .trainer_parts import build_trainer, evaluate_only, evaluation_of, run_metrics
from .training.best import check_best_metric
from .training.grace import grace_seconds
from .training.hooks import EvaluationHook, ValidationHook
from .training.resume_plan import run_plan
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
    point (cli/run.py, stop.stop_on_signals); by default one that no signal feeds: nothing asks a library
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
    entry = engine_entry(cfg)
    if (serve := entry.server(cfg, plan)) is not None:  # a worker role: it serves, and never trains
        setup_process(cfg, default_threads=1)
        serve(stop)
        return None
    entry.check_environment()
    setup_process(cfg)
    grace_s = grace_seconds()
    entry.check_device(cfg)
    check_model_files(cfg)
    # Where the data is, before anything is written: a wrong data flag leaves the output dir untouched.
    sources = flagged_sources(cfg, parsing)
    main = entry.is_main_process()
    # Held by the writing process from before anything is written there until the run ends (run_dir.py).
    folder = cfg.output_dir, cfg.resume, cfg.test_only, cfg.overwrite
    with hold_output_dir(*folder) if record and main else contextlib.nullcontext():
        # The process that checks the images reads them while the annotations are parsed (data/check_ahead.py).
        with open_data(cfg, sources, parsing, checks=main) as opened:
            datasets = _build_alone(entry, opened, stop) if entry.checks_data_first else None
            with contextlib.suppress(RunOver), entry.session(cfg, plan, stop) as (make_engine, data_world_size):
                if datasets is None:  # checked on rank 0, its verdicts given to every rank
                    datasets = opened.build(make_engine.on_rank0)  # type: ignore[attr-defined]
                return _run(cfg, datasets, make_engine, data_world_size, main, stop, grace_s, record)


def _build_alone(entry: EngineEntry, opened: OpenedData, stop: StopRequest) -> Datasets:
    """The datasets, checked by this process before any session: no peer is asked to hold a GPU for a
    dataset that cannot be read."""
    entry.stop_before_start(stop, "data loading")
    datasets = opened.build()
    entry.stop_before_start(stop, "the data check")
    return datasets


def _run(
    cfg: TrainConfig,
    datasets: Datasets,
    make_engine: EngineFactory,
    data_world_size: int,
    main: bool,
    stop: StopRequest,
    grace_s: float | None,
    record: bool = True,
) -> TrainResult:
    train_set, val_set = datasets
    # The checkpoint's global batch at any world size (data/plan.py): its steps per epoch set the schedule.
    saved = load_resume(cfg.resume, cfg.output_dir)  # (one written before the plan: training/resume_plan.py)
    plan = run_plan(saved, len(train_set), cfg.data.batch_size, data_world_size, main)
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
