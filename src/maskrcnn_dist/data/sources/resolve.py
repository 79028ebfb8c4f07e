"""Where a run's data is, from its flags: the split flags (--train-annotations, --train-images, ...),
the layout found under --data-path (data/sources/detect.py), and a val split carved by --val-fraction. Every way
in resolves to one DataSources; a wrong combination is one ConfigError naming the flags, raised before
anything is read or written."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...config import DataConfig, TrainConfig
from ...errors import ConfigError, DatasetError
from ...seeds import draw_order
from ..annotations.json_read import image_ids
from ..annotations.read import cached_store
from . import DataSources, SplitSource, input_folder_problem
from .detect import detect

SPLITS = ("train", "val")


def split_flags(data: DataConfig) -> dict[str, SplitSource]:
    """The splits the split flags name, each file and folder checked to exist."""
    splits = {}
    for split in SPLITS:
        annotations, images = getattr(data, f"{split}_annotations"), getattr(data, f"{split}_images")
        if annotations is None and images is None:
            continue
        if annotations is None or images is None:
            given, missing = ("annotations", "images") if images is None else ("images", "annotations")
            raise ConfigError(
                f"--{split}-{given} needs --{split}-{missing} too: a split is an annotation file and the "
                "folder its file_names are relative to"
            )
        if annotations.is_dir():
            raise ConfigError(
                f"--{split}-annotations {annotations} is a folder; it takes the COCO JSON file "
                "(a whole exported folder goes to --data-path)"
            )
        if not annotations.is_file():
            raise ConfigError(f"--{split}-annotations {annotations}: no such file")
        takes = "the folder the annotation file's file_names are relative to"
        if problem := input_folder_problem(images, f"--{split}-images", takes):
            raise ConfigError(problem)
        splits[split] = SplitSource(annotations, images)
    if "val" in splits and "train" not in splits and data.data_path is None:
        raise ConfigError(
            "--val-annotations and --val-images need the train split too: --train-annotations, --train-images"
        )
    return splits


def names_data(data: DataConfig) -> bool:
    """Whether the flags name a dataset (--data-path or a split flag)."""
    return data.data_path is not None or any(
        getattr(data, f"{s}_{k}") for s in SPLITS for k in ("annotations", "images")
    )


def found_sources(data: DataConfig, announce: bool = True) -> DataSources:
    """The splits the split flags name, else (or for the splits they leave out) --data-path's layout
    (`announce`: log what it finds), before any val split is carved: what the command line finds once,
    before torch loads, to parse those files ahead (data/parse_ahead.py), and hands the trainer.
    ConfigError/DatasetError naming the flag otherwise."""
    given = split_flags(data)
    if data.data_path is None and not given:
        raise ConfigError(
            "--data-path DIR or --train-annotations FILE --train-images DIR is required "
            "(or --synthetic-images N to generate a synthetic set)"
        )
    if data.data_path is None:
        return DataSources("flags", given)
    return _with_data_path(data.data_path, given, announce)


def data_flags(data: DataConfig) -> tuple[Path | None, ...]:
    """The flags found_sources reads: splits found for the same flags are the same splits."""
    return (data.data_path, *(getattr(data, f"{s}_{k}") for s in SPLITS for k in ("annotations", "images")))


def resolve_sources(
    data: DataConfig, seed: int, *, cache: Path | None = None, found: DataSources | None = None
) -> DataSources:
    """The run's splits: `found` (found_sources' for these flags, when the caller found them already),
    then the val split --val-fraction carves (from the train file's store cached in `cache` when there
    is one). ConfigError/DatasetError naming the flag otherwise."""
    sources = found if found is not None else found_sources(data)
    if data.val_fraction is None:
        return sources
    return carve_val(sources, data.val_fraction, seed, cache)


def cache_dir(cfg: TrainConfig, *, training: bool) -> Path | None:
    """Where --data-cache puts the caches of a run: `auto` is OUTPUT_DIR/cache for train and eval (the
    output dir outlives a restart, and is shared by the ranks that write it), nowhere for the other
    commands (whose --output-dir is not a run's)."""
    choice = cfg.data.data_cache
    if choice == "off" or (choice == "auto" and not training):
        return None
    return cfg.output_dir / "cache" if choice == "auto" else Path(choice)


def listed_ids(annotations: Path, cache: Path | None) -> list[int]:
    """The ids of the images `annotations` lists, in id order: its cached store's, else the file's."""
    store = cached_store(annotations, cache)
    if store is None:
        return image_ids(annotations)
    return store.image_ids(np.arange(len(store)))


def _with_data_path(root: Path, given: dict[str, SplitSource], announce: bool = True) -> DataSources:
    try:
        found = detect(root, announce)
    except DatasetError as exc:
        if not given:
            raise
        flags = ", ".join(f"--{split}-annotations" for split in given)
        raise ConfigError(f"--data-path {root} and {flags}: give one of them (--data-path: {exc})") from exc
    for split, source in given.items():
        there = found.get(split)
        if there is not None and _same(there, source):
            continue
        says = there.describe() if there is not None else f"no {split} split"
        raise ConfigError(
            f"--data-path and --{split}-annotations say otherwise: give one of them (--data-path {root} "
            f"finds {says}; the flags name {source.describe()})"
        )
    return found


def _same(a: SplitSource, b: SplitSource) -> bool:
    return a.annotations.resolve() == b.annotations.resolve() and a.images.resolve() == b.images.resolve()


def carve_val(sources: DataSources, fraction: float, seed: int, cache: Path | None = None) -> DataSources:
    """A val split of `fraction` of the train images, the same for a seed wherever and whenever it is
    carved (a hash of seed and image id orders them: no RNG state, every rank and a resume agree). The
    ids come from the train file's store cached in `cache` when it is valid (a restart parses nothing),
    else from the file's images."""
    train = sources.get("train")
    if train is None:
        raise ConfigError("--val-fraction carves the train split, and there is none")
    if (val := sources.get("val")) is not None:
        raise ConfigError(
            f"--val-fraction {fraction:g}: the dataset has a val split ({val.describe()}); leave --val-fraction out"
        )
    ids = listed_ids(train.annotations, cache)
    order = draw_order(seed, ids)
    count = round(fraction * len(ids))
    if not 0 < count < len(ids):
        raise ConfigError(
            f"--val-fraction {fraction:g} of the {len(ids)} images of {train.annotations} leaves an empty split "
            f"({count} for val, {len(ids) - count} for train)"
        )
    chosen = set(order[:count])
    splits = {
        "train": SplitSource(train.annotations, train.images, tuple(i for i in ids if i not in chosen), "train"),
        "val": SplitSource(train.annotations, train.images, tuple(sorted(chosen)), "val"),
    }
    return DataSources(f"{sources.layout}, val carved by --val-fraction {fraction:g}", splits)
