"""COCO instance segmentation dataset: a COCO instances JSON + an image folder -> (image, target).

The JSON is read and validated once, up front (data/annotations/json_read.py); images are decoded when a sample
is loaded, in the frame (data/images/orientation.py) the data check decided for them, or, where no check
ran, decided by the same function when the image is first read.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pycocotools.coco import COCO

from maskrcnn_dist.data.annotations.json_read import to_rle
from maskrcnn_dist.data.annotations.masks import decode_masks
from maskrcnn_dist.data.annotations.store import open_store
from maskrcnn_dist.data.images.check import ImageEntry
from maskrcnn_dist.data.images.image_file import read_image
from maskrcnn_dist.data.images.orientation import Frame
from maskrcnn_dist.data.sources import SplitSource
from maskrcnn_dist.data.sources.file_names import image_path
from maskrcnn_dist.errors import DatasetError

log = logging.getLogger(__name__)

_MAX_EXAMPLES = 5  # ids quoted in a warning or an error about many items

Target = dict[str, Any]


class CocoInstanceDataset(torch.utils.data.Dataset):
    """COCO instances dataset returning `(image, target)` per the data contract in docs/architecture.md.

    `train=True` enables a horizontal flip that is a pure function of (flip_seed, epoch, index), so a
    resumed run sees the same flips; call `set_epoch` before each epoch. `flip_seed=None` means 0.
    Category ids are mapped to contiguous labels 1..K sorted by id; label 0 is the background.
    `check_files=False` leaves missing image files to the caller's check (data/images/check.py), which can
    drop them (--skip-bad-images) rather than stop. `exif_orientation` (--exif-orientation) decides the
    frame of an image the check has not decided (orientation.decide_frame). `image_ids`: keep only
    these images of the file (a split carved from it, --val-fraction). `crowd_as_instances`
    (--crowd-as-instances): crowd annotations are instances, in the targets and in COCOeval's ground
    truth. Images are found by the file_name rule (data/sources/file_names.py).

    The samples are held in a SampleStore (data/annotations/store.py: flat arrays, mapped from `cache_dir` when
    given, so the processes of a node share one copy); each target is built when its sample is loaded,
    and pycocotools' ground truth (`coco`) when evaluation first asks for it. `cache_wait_s`: how long
    to wait for another process writing the cache.
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
        cache_dir: Path | None = None,
        cache_wait_s: float = 1800.0,
    ) -> None:
        self.image_dir = Path(image_dir)
        self.annotation_file = Path(annotation_file)
        self.train = train
        self.flip_seed = 0 if flip_seed is None else flip_seed
        self.epoch = 0
        self.exif_orientation = exif_orientation
        self._frames: dict[int, Frame] = {}  # image id -> its frame, as decided (by the check, or at first read)
        self._coco: COCO | None = None

        where = str(self.annotation_file)
        self.store = open_store(self.annotation_file, cache_dir, cache_wait_s)
        a = self.store.arrays
        self.kept_ids = None if image_ids is None else tuple(sorted(image_ids))
        if self.kept_ids is None:
            rows = np.arange(len(self.store), dtype=np.int64)
        else:
            wanted = np.array(self.kept_ids, dtype=np.int64)
            rows = np.searchsorted(a["image_id"], wanted)
            known = (rows < len(self.store)) & (a["image_id"][np.minimum(rows, len(self.store) - 1)] == wanted)
            if unknown := wanted[~known].tolist():
                raise DatasetError(f"{where}: the split keeps image ids the file does not list, e.g. {unknown[:5]}")
        self._split_rows = rows  # the split's images (what COCOeval's ground truth holds)
        self._rows = rows  # the images used: the split's, less any the data check dropped
        # Per category: instances and crowd regions (data/classes.py judges placeholders and crowd-only classes).
        anns = _annotation_rows(a["ann_start"], rows)
        crowd = a["iscrowd"][anns].astype(bool)
        self.instance_counts = _count(a["category_id"][anns][~crowd])
        self.crowd_counts = _count(a["category_id"][anns][crowd])
        self.crowd_as_instances = crowd_as_instances
        if len(a["dropped"]):
            log.warning(
                "%s: dropped %d annotation(s) with a degenerate box (zero or negative width or height "
                "after clipping to the image), e.g. annotation ids %s",
                where,
                len(a["dropped"]),
                a["dropped"][:_MAX_EXAMPLES].tolist(),
            )
        self.num_dropped_annotations = len(a["dropped"])

        self.categories = {c["id"]: c for c in self.store.categories}  # every record (placeholders too)
        self.keep_classes(self.categories)
        if not self.image_dir.is_dir():
            raise DatasetError(f"{where}: image folder {self.image_dir} does not exist")
        if check_files:
            _check_files_exist(self.image_entries(), self.image_dir, where)

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

    @property
    def image_ids(self) -> list[int]:
        """The ids of the images used, in id order (index i of the dataset is image_ids[i])."""
        return self.store.arrays["image_id"][self._rows].tolist()

    @property
    def coco(self) -> COCO:
        """pycocotools' ground truth for COCOeval, built on first use (training alone never needs it): the
        split's images and their annotations, crowd regions included, degenerate boxes excluded."""
        if self._coco is None:
            self._coco = _build_coco(self._coco_dataset())
        return self._coco

    def _coco_dataset(self) -> dict[str, Any]:
        a = self.store.arrays
        iscrowd = 0 if self.crowd_as_instances else None
        images, annotations = [], []
        for row in self._split_rows.tolist():
            images.append(
                {
                    "id": int(a["image_id"][row]),
                    "file_name": self.store.file_name(row),
                    "width": int(a["width"][row]),
                    "height": int(a["height"][row]),
                }
            )
            annotations += [self.store.coco_annotation(i, row, iscrowd) for i in self.store.annotation_rows(row)]
        return {"images": images, "annotations": annotations, "categories": list(self.store.categories)}

    def file_names(self) -> list[Path]:
        """IMAGE_DIR/file_name of every image used, in dataset order, as the file gives it (no ground
        truth built, no file looked for)."""
        return [self.image_dir / name for name in self.store.file_names(self._rows.tolist())]

    def _path(self, row: int) -> Path:
        return image_path(self.image_dir, self.store.file_name(row))

    def image_entries(self) -> list[ImageEntry]:
        """Every image with the size the annotation file gives it, for data/images/check.py."""
        a, rows = self.store.arrays, self._rows
        names = self.store.file_names(rows.tolist())
        columns = (a["image_id"][rows].tolist(), a["width"][rows].tolist(), a["height"][rows].tolist())
        return [
            ImageEntry(iid, image_path(self.image_dir, name), width, height)
            for name, iid, width, height in zip(names, *columns, strict=True)
        ]

    def use_frames(self, frames: Mapping[int, Frame]) -> None:
        """Read these images in the frames the data check decided for them."""
        self._frames.update(frames)

    def frame(self, image_id: int) -> Frame:
        """The frame image `image_id` is read in: the check's decision, else decided now by the loader's
        own read of the file (so the two cannot differ) and remembered."""
        if image_id not in self._frames:
            self._load_image(int(self._rows[self.image_ids.index(image_id)]))
        return self._frames[image_id]

    def drop_images(self, image_ids: set[int]) -> None:
        """Leave these images out of training and evaluation (they failed the data check)."""
        dropped = np.isin(self.store.arrays["image_id"][self._rows], np.array(sorted(image_ids), dtype=np.int64))
        self._rows = self._rows[~dropped]

    @property
    def source(self) -> SplitSource:
        """Where this split's data is (what a checkpoint records of it)."""
        return SplitSource(self.annotation_file, self.image_dir, self.kept_ids)

    def __len__(self) -> int:
        return len(self._rows)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose flips `__getitem__` applies (train=True only)."""
        self.epoch = epoch

    def aspect_ratios(self) -> list[float]:
        """Width / height of every sample, from the JSON (no image is loaded)."""
        a = self.store.arrays
        return (a["width"][self._rows].astype(np.float64) / a["height"][self._rows]).tolist()

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, Target]:
        row = int(self._rows[idx])
        image = self._load_image(row)
        target = self._target(row)
        if self.train and flip_decision(self.flip_seed, self.epoch, idx % len(self)):
            image, target = hflip(image, target)
        return image, target

    def _load_image(self, row: int) -> torch.Tensor:
        a = self.store.arrays
        image_id, path = int(a["image_id"][row]), self._path(row)
        name = f"{path} (image id {image_id})"
        size = (int(a["width"][row]), int(a["height"][row]))
        known = self._frames.get(image_id)
        image, frame = read_image(path, known, annotated=size, policy=self.exif_orientation, name=name)
        if known is None:
            self._frames[image_id] = frame  # decided now; the next read and the drawings use it
        h, w = image.shape[-2:]
        if (w, h) != size:  # the file changed since the check decided its frame
            raise DatasetError(f"{name}: image is {w}x{h} but the annotation file says {size[0]}x{size[1]}")
        return image

    def _target(self, row: int) -> Target:
        a = self.store.arrays
        anns = np.arange(a["ann_start"][row], a["ann_start"][row + 1])
        # Crowd regions (iscrowd=1) never become targets, as in torchvision's detection reference: in
        # training they are not instances to learn; in evaluation COCOeval reads them from the ground
        # truth (self.coco) to ignore detections that fall on them. (--crowd-as-instances: they are.)
        if not self.crowd_as_instances:
            anns = anns[a["iscrowd"][anns] == 0]
        h, w = int(a["height"][row]), int(a["width"][row])
        if len(anns):
            x, y, bw, bh = a["bbox"][anns].T
            # annotations.clipped_xyxy, for every box at once (the same float64 arithmetic)
            xyxy = np.stack([x, y, x + bw, y + bh], axis=1)
            xyxy = np.minimum(np.maximum(xyxy, 0.0), np.array([w, h, w, h], dtype=np.float64))
            boxes = torch.from_numpy(xyxy).to(torch.float32)
            rles = [to_rle(self.store.segmentation(int(i), h, w), h, w) for i in anns]
            masks = torch.from_numpy(np.ascontiguousarray(decode_masks(rles).transpose(2, 0, 1)))
        else:
            boxes = torch.zeros((0, 4), dtype=torch.float32)
            masks = torch.zeros((0, h, w), dtype=torch.uint8)
        labels = [self._label_of_category[c] for c in a["category_id"][anns].tolist()]
        return {
            "boxes": boxes,
            "labels": torch.tensor(labels, dtype=torch.int64),
            "masks": masks,
            "image_id": int(a["image_id"][row]),
            "area": torch.from_numpy(a["area"][anns]).to(torch.float32),
            "iscrowd": torch.zeros((len(anns),), dtype=torch.int64),
        }


def _annotation_rows(ann_start: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The annotation rows of these image rows."""
    starts, ends = ann_start[rows], ann_start[rows + 1]
    lengths = ends - starts
    if not lengths.sum():
        return np.zeros(0, dtype=np.int64)
    # each image's range start..end, concatenated, without a Python loop
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(int(lengths.sum()), dtype=np.int64) + offsets


def _count(category_ids: np.ndarray) -> Counter:
    ids, counts = np.unique(category_ids, return_counts=True)
    return Counter(dict(zip(ids.tolist(), counts.tolist(), strict=True)))


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


def _check_files_exist(entries: list[ImageEntry], image_dir: Path, where: str) -> None:
    missing = [e for e in entries if not e.path.is_file()]
    if missing:
        examples = ", ".join(f"{e.path.name} (image id {e.image_id})" for e in missing[:_MAX_EXAMPLES])
        raise DatasetError(
            f"{where}: {len(missing)} of {len(entries)} image files are missing under {image_dir}: {examples}"
        )
