"""The library behind `maskrcnn-dist train` and `eval`: data, engine and Trainer put together."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from .config import TrainConfig
from .data import CocoInstanceDataset, num_train_batches, write_train_val
from .engines.base import Engine, Position, Trainer
from .errors import ConfigError, DatasetError
from .perf import set_flush_denormal

log = logging.getLogger(__name__)

# Dataset layouts under --data-path, tried in order: ours (what synth-data writes), then COCO 2017's.
LAYOUTS = (
    ("{split}/annotations.json", "{split}/images"),
    ("annotations/instances_{split}2017.json", "{split}2017"),
    ("annotations/instances_{split}.json", "{split}"),
)


@dataclass
class TrainResult:
    position: Position
    val: dict[str, float] | None
    eval: dict[str, float] | None
    output_dir: Path


def setup_process(cfg: TrainConfig) -> None:
    """Per-process numeric settings that must precede any model code."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # A randomly initialised Mask R-CNN produces denormal floats that make some CPU iterations 3-6x
    # slower; flushing them to zero changes nothing a detector can notice. Before any computation:
    # intra-op threads copy the setting when they start (perf.set_flush_denormal checks they did).
    set_flush_denormal(cfg.flush_denormal)


def find_split(data_path: Path, split: str) -> tuple[Path, Path]:
    """(image_dir, annotation_file) of `split` under `data_path`, or an error listing what was tried."""
    tried = []
    for ann_pattern, img_pattern in LAYOUTS:
        ann, images = data_path / ann_pattern.format(split=split), data_path / img_pattern.format(split=split)
        if ann.is_file() and images.is_dir():
            return images, ann
        tried.append(f"{ann} + {images}/")
    raise DatasetError(f"--data-path {data_path}: no {split} split found; looked for " + "; ".join(tried))


def ensure_synthetic(cfg: TrainConfig) -> Path:
    """Generate the synthetic set once. Every rank may call this: the set is written to a private
    temporary folder and renamed into place, so concurrent ranks never see half a dataset."""
    root = cfg.data.data_path or (cfg.output_dir / "data")
    if (root / "train" / "annotations.json").is_file():
        return root
    tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    n = cfg.data.synthetic_images
    write_train_val(
        tmp,
        num_train=n,
        num_val=max(4, n // 4),
        seed=cfg.seed,
        image_size=(int(cfg.data.synthetic_image_size * 0.75), cfg.data.synthetic_image_size),
    )
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, root)
    except OSError:  # another rank won the race; its copy is byte-identical
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / "train" / "annotations.json").is_file():
            raise
    log.info("synthetic COCO set with %d training images at %s", n, root)
    return root


def load_datasets(cfg: TrainConfig) -> tuple[CocoInstanceDataset, CocoInstanceDataset | None]:
    if cfg.data.synthetic_images:
        cfg.data.data_path = ensure_synthetic(cfg)
    if cfg.data.data_path is None:
        raise ConfigError("--data-path is required (or --synthetic-images N to generate a synthetic set)")
    train_images, train_ann = find_split(cfg.data.data_path, "train")
    train_set = CocoInstanceDataset(train_images, train_ann, train=True, flip_seed=cfg.seed)
    try:
        val_images, val_ann = find_split(cfg.data.data_path, "val")
    except DatasetError:
        log.warning("no val split under %s: no validation loss or COCO AP", cfg.data.data_path)
        return train_set, None
    val_set = CocoInstanceDataset(val_images, val_ann, train=False)
    if val_set.label_to_category_id != train_set.label_to_category_id:
        raise DatasetError(f"{val_ann}: categories differ from {train_ann}; both splits need the same categories")
    return train_set, val_set


def build_engine(cfg: TrainConfig, num_classes: int, iters_per_epoch: int) -> Engine:
    if cfg.engine == "pipeline":
        raise ConfigError("--engine pipeline runs under the launcher (maskrcnn-launch) or run_pipeline()")
    from .engines.torch_engine import TorchEngine

    return TorchEngine(cfg, num_classes, iters_per_epoch, distributed=cfg.engine == "ddp")


# (num_classes, iters_per_epoch) -> Engine: engines need the dataset's class count and schedule length.
EngineFactory = Callable[[int, int], Engine]


def train(
    cfg: TrainConfig,
    make_engine: EngineFactory | None = None,
    datasets: tuple[CocoInstanceDataset, CocoInstanceDataset | None] | None = None,
) -> TrainResult:
    """Train (or only evaluate, with cfg.test_only) as configured. Returns where training ended.

    `make_engine` builds the engine once the data is known (default: local or ddp from cfg).
    `datasets` are `load_datasets(cfg)`'s result when the caller loaded them already."""
    setup_process(cfg)
    train_set, val_set = datasets or load_datasets(cfg)
    world = int(os.environ.get("WORLD_SIZE", "1")) if cfg.engine == "ddp" else 1
    iters = num_train_batches(len(train_set), cfg.data.batch_size, world_size=world)
    engine = (make_engine or partial(build_engine, cfg))(train_set.num_classes, iters)
    trainer = Trainer(cfg, engine, train_set, val_set)
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
