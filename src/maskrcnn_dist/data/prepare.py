"""Opening a run's splits: the sources its flags resolve to (data/sources/resolve.py), the generated synthetic
set, and the classes judged over all the splits at once (data/classes.py)."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import TrainConfig
from ..errors import ConfigError, DatasetError
from ..run_dir import output_folder_problem
from .check_ahead import read_ahead
from .classes import ClassPlan, settle_classes
from .dataset import CocoInstanceDataset
from .images.check import CheckReport, CheckRules, check_datasets
from .sources import DataSources, SplitSource
from .sources.detect import detect
from .sources.resolve import cache_dir, carve_val, resolve_sources
from .synthetic import write_train_val

log = logging.getLogger(__name__)


def find_split(data_path: Path, split: str) -> SplitSource:
    """Where `split` is under `data_path` (data/sources/detect.py), or an error saying what is there."""
    if (found := detect(data_path).get(split)) is None:
        raise DatasetError(f"--data-path {data_path}: no {split} split found")
    return found


def synthetic_sources(root: Path) -> DataSources:
    """The splits of a set synth-data (or --synthetic-images) wrote."""
    return DataSources(
        "synthetic", {s: SplitSource(root / s / "annotations.json", root / s / "images") for s in ("train", "val")}
    )


def run_sources(cfg: TrainConfig) -> DataSources:
    """The splits the run's flags name; with --synthetic-images the set is generated first and
    `cfg.data.data_path` set to it (the checkpoint's config records where)."""
    if cfg.data.synthetic_images:
        cfg.data.data_path = ensure_synthetic(cfg)
        sources = synthetic_sources(cfg.data.data_path)
        # The set has a val split: carve_val refuses --val-fraction with it, as for any dataset.
        return carve_val(sources, cfg.data.val_fraction, cfg.seed) if cfg.data.val_fraction is not None else sources
    return resolve_sources(cfg.data, cfg.seed)


@dataclass
class OpenSplits:
    """The splits of a dataset, opened, and the classes planned over them."""

    sources: DataSources
    datasets: dict[str, CocoInstanceDataset]
    classes: ClassPlan


def open_splits(
    sources: DataSources, cfg: TrainConfig, *, train_split: str | None = "train", training: bool = False
) -> OpenSplits:
    """Open every split of `sources` (the one named `train_split` with the training flips), give them the
    same classes (data/classes.py), and refuse splits whose categories differ. A val split listing no
    images is left out with a warning (no validation loss or AP). `training`: for train or eval (where
    --data-cache auto caches)."""
    datasets: dict[str, CocoInstanceDataset] = {}
    where = cache_dir(cfg, training=training)
    for name, source in sources.splits.items():
        dataset = CocoInstanceDataset(
            source.images,
            source.annotations,
            train=name == train_split,
            flip_seed=cfg.seed,
            check_files=False,
            exif_orientation=cfg.data.exif_orientation,
            image_ids=source.image_ids,
            crowd_as_instances=cfg.data.crowd_as_instances,
            cache_dir=where,
            cache_wait_s=cfg.peers.timeout,
        )
        if name == "val" and not len(dataset):
            log.warning("%s lists no images: no validation loss or COCO AP", source.annotations)
            continue
        datasets[name] = dataset
    first, *others = datasets.values()
    for other in others:
        if _category_names(other) != _category_names(first):
            raise DatasetError(
                f"{other.annotation_file}: categories differ from {first.annotation_file}; "
                "both splits need the same categories"
            )
    plan = settle_classes(list(datasets.values()), cfg.data.crowd_as_instances)
    return OpenSplits(sources, datasets, plan)


def open_split(cfg: TrainConfig, split: str) -> CocoInstanceDataset:
    """One split (no flips) of the dataset cfg's data flags name, its classes judged over every split:
    what predict, report --gallery, export's parity images and profile read."""
    opened = open_splits(resolve_sources(cfg.data, cfg.seed), cfg, train_split=None)
    if split not in opened.datasets:
        raise DatasetError(f"{opened.sources.layout}: no {split} split")
    return opened.datasets[split]


def _category_names(dataset: CocoInstanceDataset) -> dict[int, str]:
    return {cid: c["name"] for cid, c in dataset.categories.items()}


def ensure_synthetic(cfg: TrainConfig) -> Path:
    """Generate the synthetic set once. Every rank may call this: the set is written to a private
    temporary folder and renamed into place, so concurrent ranks never see half a dataset."""
    root = cfg.data.data_path or (cfg.output_dir / "data")
    if (root / "train" / "annotations.json").is_file():
        return root
    flag = "--data-path" if cfg.data.data_path else "--output-dir"
    if problem := output_folder_problem(root, flag):
        raise ConfigError(problem)
    # The set is renamed into place whole: a folder with other files cannot take it (and must not be
    # mixed with it). The second look is for a rank that renamed its copy in between.
    if root.is_dir() and any(root.iterdir()) and not (root / "train" / "annotations.json").is_file():
        raise ConfigError(
            f"--synthetic-images: {root} holds other files but no synthetic set (train/annotations.json); "
            f"the set is written into a new or empty folder: give another {flag}"
        )
    # A name no other writer has: ranks on different hosts share the volume and can have the same PID
    # (each pod's first process), so a PID is not a private name there. (Not mkdtemp: its mode 0700
    # would reach the renamed set, which other users of the volume read.)
    tmp = root.with_name(f".{root.name}.tmp-{uuid.uuid4().hex}")
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


def load_datasets(
    cfg: TrainConfig, sources: DataSources | None = None
) -> tuple[CocoInstanceDataset, CocoInstanceDataset | None]:
    """The train split and, when there is one, the val split (`sources`: as resolved already, else from
    the flags). The image files are not opened here: train.py has them checked once (data/images/check.py)."""
    sources = sources or run_sources(cfg)
    if sources.get("train") is None:
        raise DatasetError(f"{sources.layout}: no train split")
    opened = open_splits(sources, cfg, training=True)
    train_set, val_set = opened.datasets["train"], opened.datasets.get("val")
    if not len(train_set) and not cfg.test_only:  # no steps: the run would "finish" having trained nothing
        raise empty_train_split(train_set.annotation_file)
    if val_set is None and "val" not in sources.splits:
        log.warning("no val split (%s): no validation loss or COCO AP; --val-fraction F carves one", sources.layout)
    return train_set, val_set


def empty_train_split(annotation_file: Path) -> DatasetError:
    return DatasetError(f"{annotation_file}: the train split lists no images")


def check_split(cfg: TrainConfig, splits: Sequence[str]) -> tuple[OpenSplits, list[CheckReport]]:
    """`maskrcnn-dist check-data`: check every image of the named splits, judged as training judges
    them: a train split listing no images is refused; with both splits asked for, a missing val split
    is skipped with a warning (training runs without AP then), not an error."""
    sources = run_sources(cfg)
    if len(splits) == 1 and sources.get(splits[0]) is None:
        raise DatasetError(f"{sources.layout}: no {splits[0]} split found")
    if "val" in splits and sources.get("val") is None:
        log.warning(
            "no val split (%s): training would run without validation loss or COCO AP; --val-fraction F carves one",
            sources.layout,
        )
    rules, where = CheckRules.of(cfg), cache_dir(cfg, training=False)
    with read_ahead(sources, splits, rules, where) or contextlib.nullcontext() as ahead:
        opened = open_splits(sources, cfg, train_split=None)
        if "train" in splits and "train" in opened.datasets and not len(opened.datasets["train"]):
            raise empty_train_split(opened.datasets["train"].annotation_file)
        chosen = [opened.datasets[s] for s in splits if s in opened.datasets]
        return opened, check_datasets(chosen, rules, announce=False, cache_dir=where, ahead=ahead)
