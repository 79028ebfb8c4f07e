"""Where a dataset's files are: the split layouts under --data-path, and the generated synthetic set."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path

from ..config import TrainConfig
from ..errors import ConfigError, DatasetError
from ..run_dir import output_folder_problem
from .check import CheckReport, CheckRules, check_datasets
from .coco import CocoInstanceDataset
from .sources import SplitSource
from .synthetic import write_train_val

log = logging.getLogger(__name__)

# Dataset layouts under --data-path, tried in order: ours (what synth-data writes), then COCO 2017's.
LAYOUTS = (
    ("{split}/annotations.json", "{split}/images"),
    ("annotations/instances_{split}2017.json", "{split}2017"),
    ("annotations/instances_{split}.json", "{split}"),
)


def find_split(data_path: Path, split: str) -> SplitSource:
    """Where `split` is under `data_path`, or an error listing what was tried."""
    tried = []
    for ann_pattern, img_pattern in LAYOUTS:
        ann, images = data_path / ann_pattern.format(split=split), data_path / img_pattern.format(split=split)
        if ann.is_file() and images.is_dir():
            return SplitSource(ann, images)
        tried.append(f"{ann} + {images}/")
    raise DatasetError(f"--data-path {data_path}: no {split} split found; looked for " + "; ".join(tried))


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


def load_datasets(cfg: TrainConfig) -> tuple[CocoInstanceDataset, CocoInstanceDataset | None]:
    """The train split and, when there is one, the val split. With --synthetic-images the set is
    generated first and `cfg.data.data_path` is set to it (the checkpoint's config records where).
    The image files are not opened here: train.py has them checked once (data/check.py)."""
    if cfg.data.synthetic_images:
        cfg.data.data_path = ensure_synthetic(cfg)
    if cfg.data.data_path is None:
        raise ConfigError("--data-path is required (or --synthetic-images N to generate a synthetic set)")
    train = find_split(cfg.data.data_path, "train")
    train_ann = train.annotations
    orientation = cfg.data.exif_orientation
    train_set = CocoInstanceDataset(
        train.images, train_ann, train=True, flip_seed=cfg.seed, check_files=False, exif_orientation=orientation
    )
    if not len(train_set) and not cfg.test_only:  # no steps: the run would "finish" having trained nothing
        raise empty_train_split(train_ann)
    try:
        val = find_split(cfg.data.data_path, "val")
    except DatasetError:
        log.warning("no val split under %s: no validation loss or COCO AP", cfg.data.data_path)
        return train_set, None
    val_ann = val.annotations
    val_set = CocoInstanceDataset(val.images, val_ann, train=False, check_files=False, exif_orientation=orientation)
    if not len(val_set):
        log.warning("%s lists no images: no validation loss or COCO AP", val_ann)
        return train_set, None
    if val_set.label_to_category_id != train_set.label_to_category_id:
        raise DatasetError(f"{val_ann}: categories differ from {train_ann}; both splits need the same categories")
    return train_set, val_set


def empty_train_split(annotation_file: Path) -> DatasetError:
    return DatasetError(f"{annotation_file}: the train split lists no images")


def check_split(data_path: Path, splits: Sequence[str], rules: CheckRules) -> list[CheckReport]:
    """`maskrcnn-dist check-data`: check every image of the named splits under a --data-path, judged as
    training judges them: a train split listing no images is refused; with both splits asked for, a
    missing val split is skipped with a warning (training runs without AP then), not an error."""
    located = {}
    for split in splits:
        try:
            located[split] = find_split(data_path, split)
        except DatasetError:
            if split != "val" or len(splits) == 1:
                raise
            log.warning("no val split under %s: training would run without validation loss or COCO AP", data_path)
    datasets = {
        split: CocoInstanceDataset(
            where.images, where.annotations, check_files=False, exif_orientation=rules.exif_orientation
        )
        for split, where in located.items()
    }
    if "train" in datasets and not len(datasets["train"]):
        raise empty_train_split(located["train"].annotations)
    return check_datasets(list(datasets.values()), rules)
