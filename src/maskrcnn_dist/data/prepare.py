"""The data front door: from a run's flags to its datasets, checked and built whole, and their loaders.

    flagged_sources   the splits the flags name (sources/), before anything is written
    open_data         read-ahead of the image files (check_ahead.py) and the annotations parsed ahead
                      (parse_ahead.py) released; every split opened (annotations/: its store; classes
                      judged over all the splits at once: classes.py)
    OpenedData.build  every image checked once (images/check.py; ddp: on rank 0, its verdicts given to
                      every rank), then each dataset built whole (dataset.py): its frames decided, its
                      bad images left out or the run stopped with one line naming them
    train_loaders     the epoch's loader: the flip or the augmentation, copy-paste, collate (transforms/)

`check-data` (check_split), `eval` (a run with --test-only), predict, the report's gallery and profile
(open_split) come in here too. Invariant: no dataset changes once built; what the check decides is
decided before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..config import TrainConfig
from ..errors import ConfigError, DatasetError
from .check_ahead import CheckAhead, read_ahead
from .classes import ClassPlan, judge_classes
from .dataset import CocoInstanceDataset, Split
from .images.check import (
    MAX_LISTED,
    SKIP_HINT,
    CheckReport,
    CheckRules,
    bad_images_error,
    check_datasets,
    check_images,
    raise_if_bad,
)
from .loader import StepLoader, aspect_ratio_groups, build_step_loader, collate
from .old_order import OldOrder, old_epoch_plan
from .parse_ahead import ParseAhead, released
from .plan import BatchLayout
from .sources import DataSources
from .sources.resolve import cache_dir, carve_val, names_data, resolve_sources
from .synthetic import ensure_synthetic, synthetic_sources
from .transforms.flip import Flipped

log = logging.getLogger(__name__)

Datasets = tuple[CocoInstanceDataset, CocoInstanceDataset | None]
# Runs the data check where it must run once and hands every process its reports (ddp: on rank 0).
CheckRunner = Callable[[Callable[[], list[CheckReport]]], list[CheckReport]]


def flagged_sources(cfg: TrainConfig) -> DataSources | None:
    """The splits the data flags name, resolved before anything is written (a wrong flag leaves the
    output folder untouched); None for a generated synthetic set, or no data flag (open_data says so,
    after the output folder's own problems)."""
    if not names_data(cfg.data) or cfg.data.synthetic_images:
        return None
    return resolve_sources(cfg.data, cfg.seed, cache=cache_dir(cfg, training=True))


def run_sources(cfg: TrainConfig, *, training: bool = True) -> DataSources:
    """The splits the run's flags name; with --synthetic-images the set is generated first and
    `cfg.data.data_path` set to it (the checkpoint's config records where). `training`: for train or
    eval (where --data-cache auto caches: a carve reads the cached train store)."""
    if cfg.data.synthetic_images:
        cfg.data.data_path = ensure_synthetic(cfg)
        sources = synthetic_sources(cfg.data.data_path)
        # The set has a val split: carve_val refuses --val-fraction with it, as for any dataset.
        return carve_val(sources, cfg.data.val_fraction, cfg.seed) if cfg.data.val_fraction is not None else sources
    return resolve_sources(cfg.data, cfg.seed, cache=cache_dir(cfg, training=training))


@dataclass(frozen=True)
class OpenSplits:
    """The splits of a dataset, opened, each with the classes planned over all of them."""

    sources: DataSources
    splits: dict[str, Split]
    classes: ClassPlan


def open_splits(sources: DataSources, cfg: TrainConfig, *, training: bool = False) -> OpenSplits:
    """Open every split of `sources`, give them the same classes (classes.py), and refuse splits whose
    categories differ. A val split listing no images is left out with a warning (no validation loss or
    AP). `training`: for train or eval (where --data-cache auto caches)."""
    splits: dict[str, Split] = {}
    where = cache_dir(cfg, training=training)
    for name, source in sources.splits.items():
        split = Split.open(
            source,
            cache_dir=where,
            cache_wait_s=cfg.peers.timeout,
            crowd_as_instances=cfg.data.crowd_as_instances,
            exif_orientation=cfg.data.exif_orientation,
        )
        if name == "val" and not len(split):
            log.warning("%s lists no images: no validation loss or COCO AP", source.name)
            continue
        splits[name] = split
    first, *others = splits.values()
    for other in others:
        if _category_names(other) != _category_names(first):
            raise DatasetError(
                f"{other.annotation_file}: categories differ from {first.annotation_file}; "
                "both splits need the same categories"
            )
    plan = judge_classes(list(splits.values()), cfg.data.crowd_as_instances)
    return OpenSplits(sources, {name: split.with_classes(plan.kept) for name, split in splits.items()}, plan)


def _category_names(split: Split) -> dict[int, str]:
    return {cid: c["name"] for cid, c in split.categories.items()}


def open_split(
    cfg: TrainConfig, split: str, rules: CheckRules | None = None, first: int | None = None, hint: str = SKIP_HINT
) -> CocoInstanceDataset:
    """One split of the dataset cfg's data flags name, its classes judged over every split: what predict,
    report --gallery, export's parity images and profile read. With `rules`, its first `first` images
    (all: None) are checked first and read in the frames decided; a bad one stops it (one line, `hint`)."""
    opened = open_splits(resolve_sources(cfg.data, cfg.seed, cache=cache_dir(cfg, training=False)), cfg)
    if split not in opened.splits:
        raise DatasetError(f"{opened.sources.layout}: no {split} split")
    chosen = opened.splits[split]
    if rules is None:
        return CocoInstanceDataset.of(chosen)
    report = check_images(chosen.image_entries()[:first], rules, source=chosen.name)
    if report.bad:
        raise bad_images_error([report], hint)
    return CocoInstanceDataset.of(chosen, report.frames)


class OpenedData:
    """A run's train split and its val split (None: none), opened; `build` checks and builds them."""

    def __init__(self, cfg: TrainConfig, train: Split, val: Split | None, ahead: CheckAhead | None) -> None:
        self.cfg, self.train, self.val, self.ahead = cfg, train, val, ahead

    def build(self, run_once: CheckRunner = lambda check: check()) -> Datasets:
        """Check every image of the splits (--check-data; --test-only: val alone; a generated synthetic
        set is written by this program and not checked) and build each whole (built). `run_once` runs
        the check in one process and gives every process its reports."""
        cfg = self.cfg
        splits = {"train": self.train, **({"val": self.val} if self.val is not None else {})}
        datasets = {name: CocoInstanceDataset.of(split) for name, split in splits.items()}
        if not cfg.data.synthetic_images:
            checked = [name for name in splits if name == "val" or not cfg.test_only]  # evaluation reads val
            chosen = [splits[name] for name in checked]
            where, rules = cache_dir(cfg, training=True), CheckRules.of(cfg)
            reports = run_once(
                lambda: check_datasets(chosen, rules, cache_dir=where, cache_wait_s=cfg.peers.timeout, ahead=self.ahead)
            )
            datasets.update(zip(checked, built(chosen, reports, cfg.data.skip_bad_images), strict=True))
        return datasets["train"], datasets.get("val")


def built(splits: Sequence[Split], reports: Sequence[CheckReport], skip_bad: bool) -> list[CocoInstanceDataset]:
    """Each split whole, by its report (computed here or received from the rank that checked): its
    images in the frames decided; with bad images, stop with one line listing them, or, with
    `skip_bad`, leave them out with one warning per split."""
    if any(report.bad for report in reports) and not skip_bad:
        raise_if_bad(reports)
    datasets = []
    for split, report in zip(splits, reports, strict=True):
        dataset = CocoInstanceDataset.of(split, report.frames, {b.image_id for b in report.bad})
        if report.bad:
            log.warning(
                "--skip-bad-images: training without %d of %d images of %s: %s%s",
                len(report.bad),
                report.checked,
                report.source,
                "; ".join(str(b) for b in report.bad[:MAX_LISTED]),
                "; ..." if len(report.bad) > MAX_LISTED else "",
            )
            if len(dataset) == 0:
                raise DatasetError(f"{report.source}: every image failed the data check; nothing left to use")
        datasets.append(dataset)
    return datasets


@contextlib.contextmanager
def open_data(
    cfg: TrainConfig, sources: DataSources | None, parsing: ParseAhead | None = None, *, checks: bool = True
) -> Iterator[OpenedData]:
    """The run's splits opened (`sources`: flagged_sources', else from the flags: a synthetic set is
    generated here), once the output folder is guarded. `parsing`: the annotation files its entry point
    started parsing (parse_ahead.py), released to write their caches now and done once the splits are
    open. `checks`: this process runs the data check (ddp's rank 0), so its workers read the image files
    while the annotations are parsed, until the check starts (or the run ends)."""
    ahead = read_ahead_of(cfg, sources) if checks else None
    with ahead or contextlib.nullcontext():
        with released(parsing):
            train, val = open_run_splits(cfg, sources)
        if cfg.patience is not None and val is None and not cfg.test_only:
            raise ConfigError(
                f"--patience counts evaluations, and {cfg.data.data_path or 'the dataset'} has no val split "
                "(--val-fraction carves one)"
            )
        yield OpenedData(cfg, train, val, ahead)


def read_ahead_of(cfg: TrainConfig, sources: DataSources | None) -> CheckAhead | None:
    """Workers reading the image files of the splits the check will check while the annotations are
    parsed (check_ahead.py); None where they would gain nothing."""
    if sources is None or cfg.data.synthetic_images:
        return None
    splits = ["val"] if cfg.test_only else ["train", "val"]
    return read_ahead(sources, splits, CheckRules.of(cfg), cache_dir(cfg, training=True))


def open_run_splits(cfg: TrainConfig, sources: DataSources | None = None) -> tuple[Split, Split | None]:
    """The train split and, when there is one, the val split (`sources`: as resolved already, else from
    the flags). No image file is read here."""
    sources = sources or run_sources(cfg)
    if sources.get("train") is None:
        raise DatasetError(f"{sources.layout}: no train split")
    opened = open_splits(sources, cfg, training=True)
    train, val = opened.splits["train"], opened.splits.get("val")
    if not len(train) and not cfg.test_only:  # no steps: the run would "finish" having trained nothing
        raise empty_train_split(train)
    if val is None and "val" not in sources.splits:
        log.warning("no val split (%s): no validation loss or COCO AP; --val-fraction F carves one", sources.layout)
    return train, val


def load_datasets(cfg: TrainConfig, sources: DataSources | None = None) -> Datasets:
    """The train and val datasets of `cfg` opened and built in this process, no image checked (each
    image's frame decided as it is read): for library callers and tests that check nothing."""
    train, val = open_run_splits(cfg, sources)
    return CocoInstanceDataset.of(train), None if val is None else CocoInstanceDataset.of(val)


def empty_train_split(split: Split) -> DatasetError:
    return DatasetError(f"{split.name}: the train split lists no images")


def check_split(cfg: TrainConfig, splits: Sequence[str]) -> tuple[OpenSplits, list[CheckReport]]:
    """`maskrcnn-dist check-data`: check every image of the named splits, judged as training judges
    them: a train split listing no images is refused; with both splits asked for, a missing val split
    is skipped with a warning (training runs without AP then), not an error."""
    sources = run_sources(cfg, training=False)
    if len(splits) == 1 and sources.get(splits[0]) is None:
        raise DatasetError(f"{sources.layout}: no {splits[0]} split found")
    if "val" in splits and sources.get("val") is None:
        log.warning(
            "no val split (%s): training would run without validation loss or COCO AP; --val-fraction F carves one",
            sources.layout,
        )
    rules, where = CheckRules.of(cfg), cache_dir(cfg, training=False)
    with read_ahead(sources, splits, rules, where) or contextlib.nullcontext() as ahead:
        opened = open_splits(sources, cfg)
        if "train" in splits and "train" in opened.splits and not len(opened.splits["train"]):
            raise empty_train_split(opened.splits["train"])
        chosen = [opened.splits[s] for s in splits if s in opened.splits]
        return opened, check_datasets(chosen, rules, announce=False, cache_dir=where, ahead=ahead)


class Feeder(Protocol):
    """What the loaders need of the engine that consumes them."""

    data_rank: int
    data_world_size: int
    pin_memory: bool


def train_loaders(
    cfg: TrainConfig,
    train_set: CocoInstanceDataset,
    feeder: Feeder,
    layout: BatchLayout | None = None,
    old_order: OldOrder | None = None,
) -> Callable[[int, int], StepLoader]:
    """(epoch, first global batch) -> the loader of `feeder`'s share of that epoch's global batches of
    `layout` (plan.py; default: this launch's, world size x --batch-size; `old_order`'s epoch: the order it
    began in before the plan, old_order.py), one StepBatch per step: the dataset
    through --data-augmentation (hflip: transforms/flip.py; multiscale, lsj: transforms/augment.py),
    batched by collate or, with --use-copypaste, by copy-paste's (transforms/copy_paste.py)."""
    # Imported here: torchvision's v2 transforms cost every process that opens data without training
    # (check-data, predict, profile, a loader benchmark) a third of a second and ~160 MiB.
    from .transforms.augment import AugmentedDataset, build_augmentation
    from .transforms.copy_paste import CopyPaste

    data = cfg.data
    augmentation = build_augmentation(data.data_augmentation, cfg.model.min_size, cfg.model.max_size)
    if augmentation is None:  # 8-bit images cross as bytes unless copy-paste blends them on the host
        samples = Flipped(train_set, cfg.seed, uint8=not data.use_copypaste)
    else:
        samples = AugmentedDataset(train_set, augmentation, cfg.seed)

    layout = layout or BatchLayout(feeder.data_world_size, data.batch_size)
    factor = data.aspect_ratio_group_factor
    groups = aspect_ratio_groups(train_set.aspect_ratios(), factor) if factor >= 0 else None

    def loader(epoch: int, start_batch: int) -> StepLoader:
        plan = None
        if old_order is not None and epoch == old_order.epoch:
            plan = old_epoch_plan(
                len(train_set), layout.batch_size, old_order.world_size, epoch=epoch, seed=cfg.seed, groups=groups
            )
        return build_step_loader(
            samples,
            layout,
            epoch=epoch,
            seed=cfg.seed,
            groups=groups,
            share=(feeder.data_rank, feeder.data_world_size),
            num_workers=data.workers,
            start_batch=start_batch,
            plan=plan,
            pin_memory=feeder.pin_memory,
            collate_fn=CopyPaste(cfg.seed, epoch) if data.use_copypaste else collate,
        )

    return loader


def sources_of(cfg: TrainConfig, train_set: CocoInstanceDataset, val_set: CocoInstanceDataset | None) -> DataSources:
    """The splits a run trains and validates on, as its checkpoints record them."""
    splits = {"train": train_set.source, **({"val": val_set.source} if val_set is not None else {})}
    return DataSources("synthetic" if cfg.data.synthetic_images else "data-path", splits)
