"""A COCO instances split as a dataset: an annotation file and an image folder -> (image, target).

Two steps, so that nothing is decided about a dataset after it is built:
- `Split.open`: the annotation file's store (annotations/), the rows of the split's images and how they
  are read (the model's classes, crowd regions, the EXIF rule). Its `image_entries` are what the data
  check (images/check.py) judges; no image file is read here.
- `CocoInstanceDataset`: a split with the check's verdicts, built whole: each image read in the frame
  decided for it, the bad ones left out. Where no check decided a frame (--check-data off), the loader's
  read decides it by the check's own function (images/orientation.py), each time alike.
Invariant: a dataset never changes once built; the store builds every target (store.instances) and the
ground truth (store.ground_truth), so no array of the store is indexed here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pycocotools.coco import COCO

from ..errors import DatasetError
from .annotations.read import open_store
from .annotations.store import SampleStore
from .images.check import ImageEntry
from .images.image_file import read_image
from .images.orientation import Frame
from .sources import SplitSource
from .sources.file_names import image_path

log = logging.getLogger(__name__)

_MAX_EXAMPLES = 5  # ids quoted in a warning or an error about many items

Target = dict[str, Any]


@dataclass(frozen=True, eq=False)
class Split:
    """A split opened: where it is (`source`), its file's store, the store rows of its images (in id
    order), and how its samples are read: the model's classes (category ids, labels 1..K by id; label 0
    is the background), crowd regions as instances (--crowd-as-instances) or not, the EXIF rule
    (--exif-orientation) for an image no check decided a frame for."""

    source: SplitSource
    store: SampleStore
    rows: np.ndarray
    classes: tuple[int, ...]
    instance_counts: Counter  # per category id, of the split's images (data/classes.py judges them)
    crowd_counts: Counter
    crowd_as_instances: bool = False
    exif_orientation: str = "auto"

    @classmethod
    def open(
        cls,
        source: SplitSource,
        *,
        cache_dir: Path | None = None,
        cache_wait_s: float = 1800.0,
        crowd_as_instances: bool = False,
        exif_orientation: str = "auto",
        check_files: bool = False,
    ) -> Split:
        """The split of `source`, its store mapped from `cache_dir` (annotations/read.py), every category
        a class. `check_files`: refuse missing image files here (else the data check's to find and drop)."""
        where = str(source.annotations)
        store = open_store(source.annotations, cache_dir, cache_wait_s)
        rows = store.rows_of(source.image_ids, where)
        instances, crowd = store.category_counts(rows)
        if dropped := store.dropped:
            log.warning(
                "%s: dropped %d annotation(s) with a degenerate box (zero or negative width or height "
                "after clipping to the image), e.g. annotation ids %s",
                where,
                len(dropped),
                dropped[:_MAX_EXAMPLES],
            )
        categories = sorted(c["id"] for c in store.categories)
        split = cls(source, store, rows, tuple(categories), instances, crowd, crowd_as_instances, exif_orientation)
        if not source.images.is_dir():
            raise DatasetError(f"{where}: image folder {source.images} does not exist")
        if check_files:
            _check_files_exist(split.image_entries(), source.images, where)
        return split

    def with_classes(self, category_ids: Iterable[int]) -> Split:
        """This split with these categories as the model's classes (data/classes.py leaves out the
        placeholders, which have no annotation)."""
        ids = tuple(sorted(category_ids))
        if used := sorted(set(self.instance_counts + self.crowd_counts) - set(ids)):
            raise DatasetError(f"{self.annotation_file}: category ids {used} have annotations and cannot be left out")
        return dataclasses.replace(self, classes=ids)

    @property
    def annotation_file(self) -> Path:
        return self.source.annotations

    @property
    def image_dir(self) -> Path:
        return self.source.images

    @property
    def categories(self) -> dict[int, dict[str, Any]]:
        """Every category record of the file, placeholders too, by id."""
        return {c["id"]: c for c in self.store.categories}

    @property
    def label_to_category_id(self) -> list[int]:
        """Index = label; label 0 is the background and corresponds to no COCO category (-1)."""
        return [-1, *self.classes]

    @property
    def category_names(self) -> list[str]:
        categories = self.categories
        return ["__background__", *(categories[c]["name"] for c in self.classes)]

    @property
    def num_classes(self) -> int:
        return len(self.classes) + 1

    @property
    def image_ids(self) -> list[int]:
        return self.store.image_ids(self.rows)

    def image_entries(self) -> list[ImageEntry]:
        """Every image with the size the annotation file gives it: what the data check judges."""
        return _entries(self.store, self.rows, self.image_dir)

    def __len__(self) -> int:
        return len(self.rows)


def _of_split(name: str, doc: str | None = None) -> Any:
    """A dataset's attribute that is its split's."""
    return property(lambda self: getattr(self.split, name), doc=doc or f"Split.{name}")


class CocoInstanceDataset(torch.utils.data.Dataset):
    """COCO instances dataset returning `(image, target)` per the data contract in docs/architecture.md.

    Built from the annotation file and the image folder (every image, every category a class, no check
    run: `check_files` refuses missing files here), or whole from a Split and the data check's verdicts
    (`of`). `image_ids`: keep only these images of the file (a split carved from it, --val-fraction).
    The samples stay in the store (mapped from `cache_dir` when given, so the processes of a node share
    one copy; `cache_wait_s`: how long to wait for another process writing it); pycocotools' ground truth
    (`coco`) is built when evaluation first asks for it. Flips and augmentations are transforms/'.
    """

    def __init__(
        self,
        image_dir: Path,
        annotation_file: Path,
        *,
        check_files: bool = True,
        exif_orientation: str = "auto",
        image_ids: Collection[int] | None = None,
        crowd_as_instances: bool = False,
        cache_dir: Path | None = None,
        cache_wait_s: float = 1800.0,
    ) -> None:
        kept = None if image_ids is None else tuple(sorted(image_ids))
        source = SplitSource(Path(annotation_file), Path(image_dir), kept)
        split = Split.open(
            source,
            cache_dir=cache_dir,
            cache_wait_s=cache_wait_s,
            crowd_as_instances=crowd_as_instances,
            exif_orientation=exif_orientation,
            check_files=check_files,
        )
        self._hold(split, {}, ())

    @classmethod
    def of(
        cls, split: Split, frames: Mapping[int, Frame] | None = None, dropped: Collection[int] = ()
    ) -> CocoInstanceDataset:
        """`split` whole: its images read in `frames` (the data check's, by image id), those `dropped`
        (bad ones) left out of training and evaluation."""
        dataset = cls.__new__(cls)
        dataset._hold(split, dict(frames or {}), dropped)
        return dataset

    def _hold(self, split: Split, frames: dict[int, Frame], dropped: Collection[int]) -> None:
        self.split = split
        self._frames = frames
        # the images used: the split's, less any the data check left out
        self._rows = split.store.rows_without(split.rows, dropped) if dropped else split.rows
        self._label_of = {cid: label for label, cid in enumerate(split.classes, start=1)}

    # --- what the split says (dataset.Split) ---------------------------------------------------

    store = _of_split("store")
    image_dir = _of_split("image_dir")
    annotation_file = _of_split("annotation_file")
    source = _of_split("source", "Where this split's data is (what a checkpoint records of it).")
    categories = _of_split("categories")
    instance_counts = _of_split("instance_counts")
    crowd_counts = _of_split("crowd_counts")
    crowd_as_instances = _of_split("crowd_as_instances")
    label_to_category_id = _of_split("label_to_category_id")
    category_names = _of_split("category_names")
    num_classes = _of_split("num_classes")

    @property
    def num_dropped_annotations(self) -> int:
        return len(self.store.dropped)

    # --- the images used ---------------------------------------------------------------------

    @property
    def image_ids(self) -> list[int]:
        """The ids of the images used, in id order (index i of the dataset is image_ids[i])."""
        return self.store.image_ids(self._rows)

    def file_names(self) -> list[Path]:
        """IMAGE_DIR/file_name of every image used, in dataset order, as the file gives it (no ground
        truth built, no file looked for)."""
        return [self.image_dir / name for name in self.store.file_names(self._rows.tolist())]

    def image_entries(self) -> list[ImageEntry]:
        """Every image used with the size the annotation file gives it."""
        return _entries(self.store, self._rows, self.image_dir)

    def frame(self, image_id: int) -> Frame:
        """The frame image `image_id` is read in: the check's decision, else decided by reading it now."""
        if (frame := self._frames.get(image_id)) is not None:
            return frame
        return self._read(int(self._rows[self.image_ids.index(image_id)]))[1]

    @functools.cached_property
    def coco(self) -> COCO:
        """pycocotools' ground truth for COCOeval, built on first use (training alone never needs it): the
        split's images and their annotations, crowd regions included, degenerate boxes excluded."""
        coco = COCO()
        coco.dataset = self.store.ground_truth(self.split.rows, self.crowd_as_instances)
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
            coco.createIndex()
        return coco

    def __len__(self) -> int:
        return len(self._rows)

    def aspect_ratios(self) -> list[float]:
        """Width / height of every sample, from the annotation file (no image is loaded)."""
        return self.store.aspect_ratios(self._rows)

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, Target]:
        row = int(self._rows[idx])
        return self._read(row)[0], self._target(row)

    def _read(self, row: int) -> tuple[torch.Tensor, Frame]:
        image_id, path = self.store.image_id(row), image_path(self.image_dir, self.store.file_name(row))
        name = f"{path} (image id {image_id})"
        size = self.store.size(row)
        policy = self.split.exif_orientation
        image, frame = read_image(path, self._frames.get(image_id), annotated=size, policy=policy, name=name)
        h, w = image.shape[-2:]
        if (w, h) != size:  # the file changed since the check decided its frame
            raise DatasetError(f"{name}: image is {w}x{h} but the annotation file says {size[0]}x{size[1]}")
        return image, frame

    def _target(self, row: int) -> Target:
        found = self.store.instances(row, self.crowd_as_instances)
        return {
            "boxes": torch.from_numpy(found.boxes).to(torch.float32),
            "labels": torch.tensor([self._label_of[c] for c in found.category_ids.tolist()], dtype=torch.int64),
            "masks": torch.from_numpy(found.masks),
            "image_id": self.store.image_id(row),
            "area": torch.from_numpy(found.area).to(torch.float32),
            "iscrowd": torch.zeros((len(found.area),), dtype=torch.int64),
        }


def _entries(store: SampleStore, rows: np.ndarray, image_dir: Path) -> list[ImageEntry]:
    names = store.file_names(rows.tolist())
    widths, heights = store.sizes(rows)
    return [
        ImageEntry(iid, image_path(image_dir, name), width, height)
        for name, iid, width, height in zip(names, store.image_ids(rows), widths, heights, strict=True)
    ]


def _check_files_exist(entries: list[ImageEntry], image_dir: Path, where: str) -> None:
    missing = [e for e in entries if not e.path.is_file()]
    if missing:
        examples = ", ".join(f"{e.path.name} (image id {e.image_id})" for e in missing[:_MAX_EXAMPLES])
        raise DatasetError(
            f"{where}: {len(missing)} of {len(entries)} image files are missing under {image_dir}: {examples}"
        )
