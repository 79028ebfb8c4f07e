"""COCO instance segmentation dataset: a COCO instances JSON + an image folder -> (image, target).

The JSON is read and validated once, up front (data/annotations.py); images are decoded when a sample
is loaded, in the frame (data/orientation.py) the data check decided for them, or, where no check
ran, decided by the same function when the image is first read.
"""

from __future__ import annotations

import contextlib
import hashlib
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

from maskrcnn_dist.data.annotations import (
    clipped_xyxy,
    read_annotation_file,
    validate_annotations,
    validate_categories,
    validate_images,
)
from maskrcnn_dist.data.check import ImageEntry
from maskrcnn_dist.data.file_names import resolve_image
from maskrcnn_dist.data.image_file import read_image
from maskrcnn_dist.data.masks import decode_masks
from maskrcnn_dist.data.orientation import Frame
from maskrcnn_dist.data.sources import SplitSource
from maskrcnn_dist.errors import DatasetError

log = logging.getLogger(__name__)

_MAX_EXAMPLES = 5  # ids quoted in a warning or an error about many items

Target = dict[str, Any]


@dataclass(frozen=True)
class _Sample:
    """One image and the annotations that become its training/evaluation target."""

    image_id: int
    path: Path
    width: int
    height: int
    annotations: tuple[dict[str, Any], ...]  # non-crowd, non-degenerate


class CocoInstanceDataset(torch.utils.data.Dataset):
    """COCO instances dataset returning `(image, target)` per the data contract in docs/architecture.md.

    `train=True` enables a horizontal flip that is a pure function of (flip_seed, epoch, index), so a
    resumed run sees the same flips; call `set_epoch` before each epoch. `flip_seed=None` means 0.
    Category ids are mapped to contiguous labels 1..K sorted by id; label 0 is the background.
    `check_files=False` leaves missing image files to the caller's check (data/check.py), which can
    drop them (--skip-bad-images) rather than stop. `exif_orientation` (--exif-orientation) decides the
    frame of an image the check has not decided (orientation.decide_frame). `image_ids`: keep only
    these images of the file (a split carved from it, --val-fraction). `crowd_as_instances`
    (--crowd-as-instances): crowd annotations are instances, in the targets and in COCOeval's ground
    truth. Images are found by the file_name rule (data/file_names.py).
    """

    def __init__(
        self,
        image_dir: Path,
        annotation_file: Path,
        *,
        train: bool = False,
        flip_seed: int | None = None,
        check_files: bool = True,
        exif_orientation: str = "auto",
        image_ids: Collection[int] | None = None,
        crowd_as_instances: bool = False,
    ) -> None:
        self.image_dir = Path(image_dir)
        self.annotation_file = Path(annotation_file)
        self.train = train
        self.flip_seed = 0 if flip_seed is None else flip_seed
        self.epoch = 0
        self.exif_orientation = exif_orientation
        self._frames: dict[int, Frame] = {}  # image id -> its frame, as decided (by the check, or at first read)

        where = str(self.annotation_file)
        data = read_annotation_file(self.annotation_file)
        images = validate_images(data["images"], where)
        categories = validate_categories(data["categories"], where)
        kept, dropped = validate_annotations(data["annotations"], images, categories, where)
        self.kept_ids = None if image_ids is None else tuple(sorted(image_ids))
        if self.kept_ids is not None:
            if unknown := sorted(set(self.kept_ids) - set(images)):
                raise DatasetError(f"{where}: the split keeps image ids the file does not list, e.g. {unknown[:5]}")
            images = {iid: images[iid] for iid in self.kept_ids}
            data = {**data, "images": list(images.values())}
            kept = [ann for ann in kept if ann["image_id"] in images]
        # Per category: instances and crowd regions (data/classes.py judges placeholders and crowd-only classes).
        self.instance_counts = Counter(a["category_id"] for a in kept if not a["iscrowd"])
        self.crowd_counts = Counter(a["category_id"] for a in kept if a["iscrowd"])
        self.crowd_as_instances = crowd_as_instances
        if crowd_as_instances:
            for ann in kept:
                ann["iscrowd"] = 0
        if dropped:
            log.warning(
                "%s: dropped %d annotation(s) with a degenerate box (zero or negative width or height "
                "after clipping to the image), e.g. annotation ids %s",
                where,
                len(dropped),
                dropped[:_MAX_EXAMPLES],
            )
        self.num_dropped_annotations = len(dropped)

        self.categories = categories  # id -> the file's record, every one (placeholders too)
        self.keep_classes(categories)

        # The COCO object (ground truth for COCOeval) holds the same annotations as the targets'
        # source, crowd regions included, degenerate boxes excluded.
        self.coco = _build_coco({**data, "annotations": kept})
        self.image_ids: list[int] = sorted(images)
        self._samples = self._build_samples(images, kept)
        if not self.image_dir.is_dir():
            raise DatasetError(f"{where}: image folder {self.image_dir} does not exist")
        if check_files:
            _check_files_exist(self._samples, self.image_dir, where)

    def keep_classes(self, category_ids: Iterable[int]) -> None:
        """The model's classes: these categories, labels 1..K by id (data/classes.py leaves out the
        placeholders, which have no annotation)."""
        ids = sorted(category_ids)
        counted = self.instance_counts + self.crowd_counts
        if used := sorted(set(counted) - set(ids)):
            raise DatasetError(f"{self.annotation_file}: category ids {used} have annotations and cannot be left out")
        self._label_of_category = {cid: label for label, cid in enumerate(ids, start=1)}
        # Index = label; label 0 is the background and corresponds to no COCO category (-1).
        self.label_to_category_id: list[int] = [-1, *ids]
        self.category_names: list[str] = ["__background__", *(self.categories[c]["name"] for c in ids)]
        self.num_classes = len(ids) + 1

    def _build_samples(self, images: dict[int, dict], annotations: list[dict]) -> list[_Sample]:
        per_image: dict[int, list[dict]] = {iid: [] for iid in images}
        for ann in annotations:
            # Crowd regions (iscrowd=1) never become targets, as in torchvision's detection reference:
            # in training they are not instances to learn; in evaluation COCOeval reads them from the
            # JSON itself (self.coco) to ignore detections that fall on them. (--crowd-as-instances
            # turned them into instances above.)
            if not ann["iscrowd"]:
                per_image[ann["image_id"]].append(ann)
        return [
            _Sample(
                image_id=iid,
                path=resolve_image(self.image_dir, images[iid]["file_name"])[0],
                width=images[iid]["width"],
                height=images[iid]["height"],
                annotations=tuple(per_image[iid]),
            )
            for iid in self.image_ids
        ]

    def image_entries(self) -> list[ImageEntry]:
        """Every image with the size the annotation file gives it, for data/check.py."""
        return [ImageEntry(s.image_id, s.path, s.width, s.height) for s in self._samples]

    def use_frames(self, frames: Mapping[int, Frame]) -> None:
        """Read these images in the frames the data check decided for them."""
        self._frames.update(frames)

    def frame(self, image_id: int) -> Frame:
        """The frame image `image_id` is read in: the check's decision, else decided now by the loader's
        own read of the file (so the two cannot differ) and remembered."""
        if image_id not in self._frames:
            self._load_image(self._samples[self.image_ids.index(image_id)])
        return self._frames[image_id]

    def drop_images(self, image_ids: set[int]) -> None:
        """Leave these images out of training and evaluation (they failed the data check)."""
        self._samples = [s for s in self._samples if s.image_id not in image_ids]
        self.image_ids = [s.image_id for s in self._samples]

    @property
    def source(self) -> SplitSource:
        """Where this split's data is (what a checkpoint records of it)."""
        return SplitSource(self.annotation_file, self.image_dir, self.kept_ids)

    def __len__(self) -> int:
        return len(self._samples)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose flips `__getitem__` applies (train=True only)."""
        self.epoch = epoch

    def aspect_ratios(self) -> list[float]:
        """Width / height of every sample, from the JSON (no image is loaded)."""
        return [s.width / s.height for s in self._samples]

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, Target]:
        sample = self._samples[idx]
        image = self._load_image(sample)
        target = self._target(sample)
        if self.train and flip_decision(self.flip_seed, self.epoch, idx % len(self)):
            image, target = hflip(image, target)
        return image, target

    def _load_image(self, sample: _Sample) -> torch.Tensor:
        name = f"{sample.path} (image id {sample.image_id})"
        size = (sample.width, sample.height)
        known = self._frames.get(sample.image_id)
        image, frame = read_image(sample.path, known, annotated=size, policy=self.exif_orientation, name=name)
        if known is None:
            self._frames[sample.image_id] = frame  # decided now; the next read and the drawings use it
        h, w = image.shape[-2:]
        if (w, h) != size:  # the file changed since the check decided its frame
            raise DatasetError(f"{name}: image is {w}x{h} but the annotation file says {size[0]}x{size[1]}")
        return image

    def _target(self, sample: _Sample) -> Target:
        anns = sample.annotations
        h, w = sample.height, sample.width
        if anns:
            boxes = torch.tensor([clipped_xyxy(a["bbox"], w, h) for a in anns], dtype=torch.float32)
            rles = [self.coco.annToRLE(a) for a in anns]
            masks = torch.from_numpy(np.ascontiguousarray(decode_masks(rles).transpose(2, 0, 1)))
        else:
            boxes = torch.zeros((0, 4), dtype=torch.float32)
            masks = torch.zeros((0, h, w), dtype=torch.uint8)
        return {
            "boxes": boxes,
            "labels": torch.tensor([self._label_of_category[a["category_id"]] for a in anns], dtype=torch.int64),
            "masks": masks,
            "image_id": sample.image_id,
            "area": torch.tensor([a["area"] for a in anns], dtype=torch.float32),
            "iscrowd": torch.zeros((len(anns),), dtype=torch.int64),
        }


def flip_decision(seed: int, epoch: int, index: int) -> bool:
    """Whether sample `index` is flipped in `epoch`: a hash, so no RNG state to carry or restore."""
    digest = hashlib.sha256(f"{seed}:{epoch}:{index}".encode()).digest()
    return digest[0] < 128


def hflip(image: torch.Tensor, target: Target) -> tuple[torch.Tensor, Target]:
    """Mirror an image and its target left-right (boxes, masks)."""
    width = image.shape[-1]
    boxes = target["boxes"].clone()
    boxes[:, [0, 2]] = width - target["boxes"][:, [2, 0]]
    return image.flip(-1), {**target, "boxes": boxes, "masks": target["masks"].flip(-1)}


def _build_coco(dataset: dict[str, Any]) -> COCO:
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
        coco.createIndex()
    return coco


def _check_files_exist(samples: list[_Sample], image_dir: Path, where: str) -> None:
    missing = [s for s in samples if not s.path.is_file()]
    if missing:
        examples = ", ".join(f"{s.path.name} (image id {s.image_id})" for s in missing[:_MAX_EXAMPLES])
        raise DatasetError(
            f"{where}: {len(missing)} of {len(samples)} image files are missing under {image_dir}: {examples}"
        )
