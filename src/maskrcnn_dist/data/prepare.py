"""The data front door: from a run's flags to its datasets, checked and built whole, and their loaders.

    flagged_sources   the splits the flags name (sources/; found once: those the command line found
                      to parse ahead are taken) and the cache folder, before anything is written
    open_data         read-ahead of the image files (check_ahead.py) and the annotations parsed ahead
                      (parse_ahead.py) released; every split opened (annotations/: its store; classes
                      judged over all the splits at once: classes.py)
    OpenedData.build  every image checked once (images/check.py; ddp: on rank 0, its verdicts given to
                      every rank), then each dataset built whole (dataset.py): its frames decided, its
                      bad images left out or the run stopped with one line naming them
    train_loaders     the epoch's loader: the flip or the augmentation, copy-paste, collate
                      (transforms/training.py)

`check-data` (check_split), `eval` (a run with --test-only), predict, the report's gallery and profile
(open_split) come in here too. Invariant: no dataset changes once built; what the check decides is
decided before.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

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
from .parse_ahead import ParseAhead, released
from .sources import DataSources
from .sources.resolve import cache_dir, carve_val, names_data, resolve_sources
from .synthetic import ensure_synthetic, synthetic_sources

log = logging.getLogger(__name__)

Datasets = tuple[CocoInstanceDataset, CocoInstanceDataset | None]
# Runs the data check where it must run once and hands every process its reports (ddp: on rank 0).
CheckRunner = Callable[[Callable[[], list[CheckReport]]], list[CheckReport]]


@dataclass(frozen=True)
class RunData:
    """A training run's data as its flags say, before anything is read or written: its splits (None: a
    synthetic set, generated when the data is opened, or no data flag, which open_data refuses) and the
    folder its caches go to (--data-cache; None: none). Found once, carried to open_data."""

    sources: DataSources | None
    cache: Path | None


def flagged_sources(cfg: TrainConfig, parsing: ParseAhead | None = None) -> RunData:
    """The splits the data flags name, resolved before anything is written (a wrong flag leaves the
    output folder untouched), and the run's cache folder. `parsing`: what the command line started
    (parse_ahead.py); the splits it found for these flags are taken, not found again."""
    cache = cache_dir(cfg, training=True)
    if not names_data(cfg.data) or cfg.data.synthetic_images:
        return RunData(None, cache)
    found = parsing.found_for(cfg.data) if parsing is not None else None
    return RunData(resolve_sources(cfg.data, cfg.seed, cache=cache, found=found), cache)


def run_sources(cfg: TrainConfig, cache: Path | None) -> DataSources:
    """The splits the run's flags name; with --synthetic-images the set is generated first and
    `cfg.data.data_path` set to it (the checkpoint's config records where). `cache`: the run's cache
    folder (a carve reads the cached train store)."""
    if cfg.data.synthetic_images:
        cfg.data.data_path = ensure_synthetic(cfg)
        sources = synthetic_sources(cfg.data.data_path)
        # The set has a val split: carve_val refuses --val-fraction with it, as for any dataset.
        return carve_val(sources, cfg.data.val_fraction, cfg.seed) if cfg.data.val_fraction is not None else sources
    return resolve_sources(cfg.data, cfg.seed, cache=cache)


@dataclass(frozen=True)
class OpenSplits:
    """The splits of a dataset, opened, each with the classes planned over all of them."""

    sources: DataSources
    splits: dict[str, Split]
    classes: ClassPlan


def open_splits(sources: DataSources, cfg: TrainConfig, cache: Path | None) -> OpenSplits:
    """Open every split of `sources` (their stores cached in `cache`), give them the same classes
    (classes.py), and refuse splits whose categories differ. A val split listing no images is left out
    with a warning (no validation loss or AP)."""
    splits: dict[str, Split] = {}
    for name, source in sources.splits.items():
        split = Split.open(
            source,
            cache_dir=cache,
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
    cache = cache_dir(cfg, training=False)
    opened = open_splits(resolve_sources(cfg.data, cfg.seed, cache=cache), cfg, cache)
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
    """A run's train split and its val split (None: none), opened; `build` checks and builds them
    (their verdicts cached in `cache`)."""

    def __init__(
        self, cfg: TrainConfig, train: Split, val: Split | None, ahead: CheckAhead | None, cache: Path | None
    ) -> None:
        self.cfg, self.train, self.val, self.ahead, self.cache = cfg, train, val, ahead, cache

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
            rules, where = CheckRules.of(cfg), self.cache
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
    cfg: TrainConfig, flagged: RunData | None = None, parsing: ParseAhead | None = None, *, checks: bool = True
) -> Iterator[OpenedData]:
    """The run's splits opened (`flagged`: flagged_sources', else from the flags: a synthetic set is
    generated here), once the output folder is guarded. `parsing`: the annotation files its entry point
    started parsing (parse_ahead.py), released to write their caches now and done once the splits are
    open. `checks`: this process runs the data check (ddp's rank 0), so its workers read the image files
    while the annotations are parsed, until the check starts (or the run ends)."""
    run = flagged if flagged is not None else RunData(None, cache_dir(cfg, training=True))
    ahead = read_ahead_of(cfg, run) if checks else None
    with ahead or contextlib.nullcontext():
        with released(parsing):
            train, val = open_run_splits(cfg, run.sources, run.cache)
        if cfg.patience is not None and val is None and not cfg.test_only:
            raise ConfigError(
                f"--patience counts evaluations, and {cfg.data.data_path or 'the dataset'} has no val split "
                "(--val-fraction carves one)"
            )
        yield OpenedData(cfg, train, val, ahead, run.cache)


def read_ahead_of(cfg: TrainConfig, run: RunData) -> CheckAhead | None:
    """Workers reading the image files of the splits the check will check while the annotations are
    parsed (check_ahead.py); None where they would gain nothing."""
    if run.sources is None or cfg.data.synthetic_images:
        return None
    splits = ["val"] if cfg.test_only else ["train", "val"]
    return read_ahead(run.sources, splits, CheckRules.of(cfg), run.cache)


def open_run_splits(cfg: TrainConfig, sources: DataSources | None, cache: Path | None) -> tuple[Split, Split | None]:
    """The train split and, when there is one, the val split (`sources`: as resolved already, else from
    the flags; their stores cached in `cache`). No image file is read here."""
    sources = sources or run_sources(cfg, cache)
    if sources.get("train") is None:
        raise DatasetError(f"{sources.layout}: no train split")
    opened = open_splits(sources, cfg, cache)
    train, val = opened.splits["train"], opened.splits.get("val")
    if not len(train) and not cfg.test_only:  # no steps: the run would "finish" having trained nothing
        raise empty_train_split(train)
    if val is None and "val" not in sources.splits:
        log.warning("no val split (%s): no validation loss or COCO AP; --val-fraction F carves one", sources.layout)
    return train, val


def load_datasets(cfg: TrainConfig, sources: DataSources | None = None) -> Datasets:
    """The train and val datasets of `cfg` opened and built in this process, no image checked (each
    image's frame decided as it is read): for library callers and tests that check nothing."""
    train, val = open_run_splits(cfg, sources, cache_dir(cfg, training=True))
    return CocoInstanceDataset.of(train), None if val is None else CocoInstanceDataset.of(val)


def empty_train_split(split: Split) -> DatasetError:
    return DatasetError(f"{split.name}: the train split lists no images")


def check_split(cfg: TrainConfig, splits: Sequence[str]) -> tuple[OpenSplits, list[CheckReport]]:
    """`maskrcnn-dist check-data`: check every image of the named splits, judged as training judges
    them: a train split listing no images is refused; with both splits asked for, a missing val split
    is skipped with a warning (training runs without AP then), not an error."""
    cache = cache_dir(cfg, training=False)
    sources = run_sources(cfg, cache)
    if len(splits) == 1 and sources.get(splits[0]) is None:
        raise DatasetError(f"{sources.layout}: no {splits[0]} split found")
    if "val" in splits and sources.get("val") is None:
        log.warning(
            "no val split (%s): training would run without validation loss or COCO AP; --val-fraction F carves one",
            sources.layout,
        )
    rules = CheckRules.of(cfg)
    with read_ahead(sources, splits, rules, cache) or contextlib.nullcontext() as ahead:
        opened = open_splits(sources, cfg, cache)
        if "train" in splits and "train" in opened.splits and not len(opened.splits["train"]):
            raise empty_train_split(opened.splits["train"])
        chosen = [opened.splits[s] for s in splits if s in opened.splits]
        return opened, check_datasets(chosen, rules, announce=False, cache_dir=cache, ahead=ahead)


def sources_of(cfg: TrainConfig, train_set: CocoInstanceDataset, val_set: CocoInstanceDataset | None) -> DataSources:
    """The splits a run trains and validates on, as its checkpoints record them."""
    splits = {"train": train_set.source, **({"val": val_set.source} if val_set is not None else {})}
    return DataSources("synthetic" if cfg.data.synthetic_images else "data-path", splits)
