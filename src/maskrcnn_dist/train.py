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
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from maskrcnn_launcher.contract import MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, PodPlan

from .categories import Categories
from .checkpoint import Checkpointer, checkpoint_file, load_checkpoint, resolve_resume
from .config import TrainConfig, config_to_dict
from .data import (
    CocoInstanceDataset,
    ParseAhead,
    flagged_sources,
    num_train_batches,
    open_data,
    sources_of,
    train_loaders,
)
from .engines.base import Engine, resolve_device
from .errors import ConfigError, DatasetError
from .lifetime.process import setup_process
from .lifetime.stop import Interrupted, Stopped, StopRequest
from .modeling.model import torchvision_weights_hint
from .modeling.trained import TRAINED_MODEL_KEY, TrainedModel
from .run_dir import (
    checkpoint_dir,
    layout_problem,
    move_aside,
    output_folder_problem,
    previous_run,
    replaced_stamp,
    resume_problem,
)
from .training.best import BestTracker, check_best_metric
from .training.grace import grace_seconds
from .training.hooks import EvaluationHook, GraceHook, MetricsHook, PeriodicCheckpointer, ValidationHook
from .training.loop import HookBase, Trainer
from .training.metrics import MetricsWriter
from .training.progress_post import poster_from_env
from .training.state import Position

log = logging.getLogger(__name__)

Datasets = tuple[CocoInstanceDataset, CocoInstanceDataset | None]
# One of the hooks build_hooks registers.
H = TypeVar("H", bound=HookBase)
# (num_classes, iters_per_epoch) -> Engine, once the session is open and the data is known.
EngineFactory = Callable[[int, int], Engine]


def train(
    cfg: TrainConfig,
    plan: PodPlan | None = None,
    stop: StopRequest | None = None,
    parsing: ParseAhead | None = None,
) -> TrainResult | None:
    """Train (or only evaluate, with cfg.test_only) as configured. Returns where training ended, or
    None on a pipeline stage worker; raises Stopped when a stop request ended it (its checkpoint written).
    `plan`: the pipeline's pod plan (default: from the launcher's MASKRCNN_POD_PLAN). `stop`: the process's
    stop request, made and installed by its entry point (cli.py, stop.stop_on_signals); by default a plain
    one that no signal feeds: nothing asks a library caller's run to stop. `parsing`: the annotation files
    its entry point started parsing (data/parse_ahead.py): released to write their caches once the flags
    and the output folder are accepted, and done once the data is loaded."""
    return _train(cfg, plan, stop if stop is not None else StopRequest(), parsing)


def _train(cfg: TrainConfig, plan: PodPlan | None, stop: StopRequest, parsing: ParseAhead | None) -> TrainResult | None:
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
    if cfg.engine != "pipeline":  # the pipeline places its stages by the topology, not by --device
        resolve_device(cfg.device)  # --device cuda on a machine without one: refused before any data is made
    check_input_files(cfg)
    # Where the data is, before anything is written: a wrong data flag leaves the output dir untouched.
    sources = flagged_sources(cfg)
    if is_main_process(cfg):
        guard_output_dir(cfg)  # before anything is written there (a synthetic set goes to OUTPUT_DIR/data)
    # The process that checks the images reads them while the annotations are parsed (data/check_ahead.py).
    with open_data(cfg, sources, parsing, checks=is_main_process(cfg)) as opened:
        if cfg.engine != "ddp":
            stop_alone(cfg, stop, "data loading")
            datasets = opened.build()
            stop_alone(cfg, stop, "the data check")
        with _engine_session(cfg, plan, stop) as (make_engine, data_world_size):
            if cfg.engine == "ddp":
                from .engines.torch_engine import on_rank0

                datasets = opened.build(on_rank0)  # checked on rank 0, its verdicts given to every rank
            return _run(cfg, datasets, make_engine, data_world_size, stop, grace_s)


def stop_alone(cfg: TrainConfig, stop: StopRequest, phase: str) -> None:
    """The local engine stops after the phase a request came in (no step yet: nothing to save). Processes
    with peers first form their group, so that they all leave it together: the Trainer stops them."""
    if cfg.engine == "local" and stop.requested:
        raise Stopped.before_any_step(stop, phase)


def is_main_process(cfg: TrainConfig) -> bool:
    """The process that writes the run's metrics and checkpoints: ddp's rank 0, the pipeline's master
    (its stage workers never get this far), the local engine's only process."""
    return cfg.engine != "ddp" or os.environ.get(RANK, "0") == "0"


def require_torchrun_environment() -> None:
    """--engine ddp needs the variables torchrun (or the launcher) sets; say so before any work."""
    missing = [name for name in (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) if not os.environ.get(name)]
    if missing:
        raise ConfigError(
            f"--engine ddp runs under torchrun or the launcher, but {', '.join(missing)} not set: "
            "`torchrun --nproc-per-node N -m maskrcnn_dist.cli train --engine ddp ...`, or `maskrcnn-launch`"
        )


def check_input_files(cfg: TrainConfig) -> None:
    """The files the flags name exist, before any data is loaded or generated (their contents are read,
    and checked, where they are used)."""
    named = [
        ("--resume", cfg.resume),
        ("--weights", cfg.model.weights),
        ("--weights-backbone", cfg.model.weights_backbone),
    ]
    for flag, path in named:
        if path is not None and str(path) not in ("auto", "best") and not Path(path).exists():
            backbone = flag == "--weights-backbone"
            hint = None if flag == "--resume" else torchvision_weights_hint(str(path), cfg.model, backbone)
            raise ConfigError(f"{flag} {path}: no such file" + (f"; {hint}" if hint else ""))
    if str(cfg.resume) == "best":
        resolve_resume(cfg.resume, cfg.output_dir)  # OUTPUT_DIR/checkpoints/best.pt must exist


def guard_output_dir(cfg: TrainConfig) -> None:
    """Never write over another run: a fresh run into an --output-dir with metrics or checkpoints is
    refused unless --resume continues it (from its own newest checkpoint) or --overwrite moves its files
    aside first. An evaluation (--test-only) there must evaluate one of that run's own checkpoints."""
    if problem := output_folder_problem(cfg.output_dir, "--output-dir") or layout_problem(cfg.output_dir):
        raise ConfigError(problem)
    found = previous_run(cfg.output_dir)
    if not found:
        return
    if cfg.resume is not None or cfg.test_only:
        if problem := resume_problem(cfg.output_dir, cfg.resume, found, trains=not cfg.test_only):
            raise ConfigError(problem)
        return
    if not cfg.overwrite:
        raise ConfigError(
            f"--output-dir {cfg.output_dir} already holds a run ({', '.join(found)}): add --resume auto to "
            "continue it, --overwrite to move its files into a replaced-<time>/ folder there, or choose another "
            "--output-dir"
        )
    moved = move_aside(cfg.output_dir, replaced_stamp())
    log.warning("--overwrite: the previous run's files in %s were moved to %s", cfg.output_dir, moved)


@contextmanager
def _engine_session(cfg: TrainConfig, plan: PodPlan | None, stop: StopRequest) -> Iterator[tuple[EngineFactory, int]]:
    """The engine's process-level session, with its engine factory and how many processes share the data;
    the engines it makes, and the pipeline master's session (for its workers' RPC calls), get `stop`."""
    if cfg.engine == "pipeline":
        from .engines.pipeline import PipelineEngine, master_session

        assert plan is not None
        with master_session(cfg, plan, stop):
            yield (
                lambda num_classes, iters: PipelineEngine(
                    cfg, plan.stages, num_classes, iters, transport=plan.transport, stop=stop
                ),
                1,  # the master reads every batch
            )
        return
    from .engines.torch_engine import TorchEngine, process_group

    distributed = cfg.engine == "ddp"
    with process_group(cfg) if distributed else contextlib.nullcontext(1) as world_size:
        yield (
            (lambda num_classes, iters: TorchEngine(cfg, num_classes, iters, distributed=distributed, stop=stop)),
            world_size,
        )


def _run(
    cfg: TrainConfig,
    datasets: Datasets,
    make_engine: EngineFactory,
    data_world_size: int,
    stop: StopRequest,
    grace_s: float | None,
) -> TrainResult:
    train_set, val_set = datasets
    # One number for the engine's schedule and the Trainer's epochs.
    iters = num_train_batches(len(train_set), cfg.data.batch_size, world_size=data_world_size)
    engine = make_engine(train_set.num_classes, iters)
    if cfg.test_only and val_set is None:
        raise DatasetError(
            "--test-only: the dataset has no val split (--val-annotations, or --val-fraction as trained)"
        )
    total = total_steps(cfg, iters)
    with contextlib.closing(engine), contextlib.closing(run_metrics(cfg, engine.is_main, total)) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, iters, metrics, stop, grace_s)
        if cfg.test_only:
            evaluate_only(trainer, cfg, stop)
        else:
            resume(trainer, cfg)
            trainer.fit()
        validation, evaluation = hook_of(trainer, ValidationHook), hook_of(trainer, EvaluationHook)
        return TrainResult(trainer.position, validation.last, evaluation.last, cfg.output_dir, trainer.stopped_early)


@dataclass
class TrainResult:
    position: Position
    val: dict[str, float] | None
    eval: dict[str, float] | None
    output_dir: Path
    stopped_early: str | None = None  # the closing line of a --patience stop


def total_steps(cfg: TrainConfig, iters_per_epoch: int) -> int:
    return cfg.total_steps(iters_per_epoch)


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
) -> Trainer:
    """The Trainer for `cfg`, with the hooks of a run (build_hooks) writing to `metrics`."""
    loader = train_loaders(cfg, train_set, engine)  # the epoch's loader: augmented, batched
    categories = Categories.of_dataset(train_set)
    run_facts = {
        "config": config_to_dict(cfg),
        # label -> (category id, name): predict labels its drawings without the dataset.
        "categories": categories.to_state(),
        # What rebuilds this model exactly, for every tool that reads the checkpoint.
        TRAINED_MODEL_KEY: TrainedModel.of_run(cfg, categories, sources_of(cfg, train_set, val_set)).to_record(),
    }
    checkpointer = Checkpointer(checkpoint_dir(cfg.output_dir), cfg.keep_checkpoints, engine.is_main)
    hooks = build_hooks(cfg, engine, val_set, metrics, grace_s)
    total = total_steps(cfg, iters_per_epoch)
    return Trainer(engine, loader, iters_per_epoch, total, checkpointer, stop or StopRequest(), run_facts, hooks)


def build_hooks(
    cfg: TrainConfig, engine: Engine, val_set: CocoInstanceDataset | None, metrics: MetricsWriter, grace_s: float | None
) -> list[HookBase]:
    """What runs around the steps, in order (hooks.py says why this order)."""
    data = cfg.data
    hooks: list[HookBase] = [MetricsHook(metrics)]
    if engine.is_main:
        hooks.append(GraceHook(grace_s))
    hooks += [
        ValidationHook(val_set, cfg.val_period, data.val_batch_size, data.workers, metrics),
        EvaluationHook(
            val_set,
            cfg.eval_every_epoch,
            data.val_batch_size,
            data.workers,
            metrics,
            BestTracker(cfg.best_metric, cfg.patience),
        ),
        PeriodicCheckpointer(cfg.checkpoint_period),
    ]
    return hooks


def hook_of(trainer: Trainer, kind: type[H]) -> H:
    """The one hook of `kind` that build_hooks registered."""
    (hook,) = [hook for hook in trainer.hooks if isinstance(hook, kind)]
    return hook


def resume(trainer: Trainer, cfg: TrainConfig) -> None:
    """Continue from --resume (a file, a directory, "auto": the newest in this run's output, or, for
    --test-only, "best"), with every hook's state and the pending hooks the checkpoint holds."""
    source = resolve_resume(cfg.resume, cfg.output_dir)
    if source is None:
        if cfg.resume is not None:
            log.info("resume auto: no checkpoint in %s yet, starting fresh", checkpoint_dir(cfg.output_dir))
        return
    source = checkpoint_file(source)
    trainer.restore(load_checkpoint(source), source)


def evaluate_only(trainer: Trainer, cfg: TrainConfig, stop: StopRequest) -> None:
    """--test-only: COCO AP of the --resume checkpoint (or of the --weights model), recorded at its step."""
    resume(trainer, cfg)
    try:
        hook_of(trainer, EvaluationHook).evaluate(trainer.position.step)
    except Interrupted:
        stop.finish("evaluation only, nothing to save")
        raise Stopped(stop, "evaluation") from None
