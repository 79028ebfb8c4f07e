"""COCO instance segmentation dataset: a COCO instances JSON + an image folder -> (image, target).

The JSON is validated once, up front, so that a bad file fails at start-up with a message that names
the file and the offending image or annotation id, instead of deep inside a data-loader worker.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from maskrcnn_dist.data.check import ImageEntry
from maskrcnn_dist.data.masks import decode_masks
from maskrcnn_dist.errors import DatasetError

log = logging.getLogger(__name__)

_REQUIRED_KEYS = ("images", "annotations", "categories")
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
    drop them (--skip-bad-images) rather than stop.
    """

    def __init__(
        self,
        image_dir: Path,
        annotation_file: Path,
        *,
        train: bool = False,
        flip_seed: int | None = None,
        check_files: bool = True,
    ) -> None:
        self.image_dir = Path(image_dir)
        self.annotation_file = Path(annotation_file)
        self.train = train
        self.flip_seed = 0 if flip_seed is None else flip_seed
        self.epoch = 0

        where = str(self.annotation_file)
        data = _load_json(self.annotation_file)
        images = _validate_images(data["images"], where)
        categories = _validate_categories(data["categories"], where)
        kept, dropped = _validate_annotations(data["annotations"], images, categories, where)
        if dropped:
            log.warning(
                "%s: dropped %d annotation(s) with a degenerate box (zero or negative width or height "
                "after clipping to the image), e.g. annotation ids %s",
                where,
                len(dropped),
                dropped[:_MAX_EXAMPLES],
            )
        self.num_dropped_annotations = len(dropped)

        category_ids = sorted(categories)
        self._label_of_category = {cid: label for label, cid in enumerate(category_ids, start=1)}
        # Index = label; label 0 is the background and corresponds to no COCO category (-1).
        self.label_to_category_id: list[int] = [-1, *category_ids]
        self.category_names: list[str] = ["__background__", *(categories[c]["name"] for c in category_ids)]
        self.num_classes = len(category_ids) + 1

        # The COCO object (ground truth for COCOeval) holds the same annotations as the targets'
        # source, crowd regions included, degenerate boxes excluded.
        self.coco = _build_coco({**data, "annotations": kept})
        self.image_ids: list[int] = sorted(images)
        self._samples = self._build_samples(images, kept)
        if not self.image_dir.is_dir():
            raise DatasetError(f"{where}: image folder {self.image_dir} does not exist")
        if check_files:
            _check_files_exist(self._samples, self.image_dir, where)

    def _build_samples(self, images: dict[int, dict], annotations: list[dict]) -> list[_Sample]:
        per_image: dict[int, list[dict]] = {iid: [] for iid in images}
        for ann in annotations:
            # Crowd regions (iscrowd=1) never become targets, as in torchvision's detection reference:
            # in training they are not instances to learn; in evaluation COCOeval reads them from the
            # JSON itself (self.coco) to ignore detections that fall on them.
            if not ann["iscrowd"]:
                per_image[ann["image_id"]].append(ann)
        return [
            _Sample(
                image_id=iid,
                path=self.image_dir / images[iid]["file_name"],
                width=images[iid]["width"],
                height=images[iid]["height"],
                annotations=tuple(per_image[iid]),
            )
            for iid in self.image_ids
        ]

    def image_entries(self) -> list[ImageEntry]:
        """Every image with the size the annotation file gives it, for data/check.py."""
        return [ImageEntry(s.image_id, s.path, s.width, s.height) for s in self._samples]

    def drop_images(self, image_ids: set[int]) -> None:
        """Leave these images out of training and evaluation (they failed the data check)."""
        self._samples = [s for s in self._samples if s.image_id not in image_ids]
        self.image_ids = [s.image_id for s in self._samples]

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
        image = _load_image(sample)
        target = self._target(sample)
        if self.train and flip_decision(self.flip_seed, self.epoch, idx % len(self)):
            image, target = hflip(image, target)
        return image, target

    def _target(self, sample: _Sample) -> Target:
        anns = sample.annotations
        h, w = sample.height, sample.width
        if anns:
            boxes = torch.tensor([_clipped_xyxy(a["bbox"], w, h) for a in anns], dtype=torch.float32)
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


# ---------------------------------------------------------------------------------------------------
# loading


def read_image(path: Path, name: str | None = None) -> torch.Tensor:
    """An image file as float32 [3, H, W] in [0, 1]; a DatasetError naming the file (`name`) if it cannot be decoded."""
    try:
        with Image.open(path) as im:
            im.load()  # decode now, so a truncated file fails here with its name
            array = _to_rgb_float(im)
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise DatasetError(f"{name or path}: cannot read image: {e}") from e
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def _load_image(sample: _Sample) -> torch.Tensor:
    image = read_image(sample.path, f"{sample.path} (image id {sample.image_id})")
    h, w = image.shape[-2:]
    if (w, h) != (sample.width, sample.height):
        raise DatasetError(
            f"{sample.path} (image id {sample.image_id}): image is {w}x{h} but the annotation file "
            f"says {sample.width}x{sample.height}"
        )
    return image


def _to_rgb_float(im: Image.Image) -> np.ndarray:
    """Any PIL mode -> float32 HxWx3 in [0, 1]."""
    if im.mode.startswith("I"):  # 16/32-bit grayscale: PIL's convert("RGB") would clip it to 255
        gray = np.clip(np.asarray(im, dtype=np.float32) / 65535.0, 0.0, 1.0)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")  # PIL asks for this route for palettes with transparency
    return np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0


def _load_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError as e:
        raise DatasetError(f"{path}: annotation file not found") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: not valid JSON: {e}") from e
    except OSError as e:
        raise DatasetError(f"{path}: cannot read annotation file: {e}") from e
    if not isinstance(data, dict):
        raise DatasetError(f"{path}: expected a JSON object with keys {list(_REQUIRED_KEYS)}")
    for key in _REQUIRED_KEYS:
        if not isinstance(data.get(key), list):
            raise DatasetError(f"{path}: missing key {key!r} (a list) in the COCO instances JSON")
    return data


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


# ---------------------------------------------------------------------------------------------------
# validation


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _finite_numbers(values: list[Any]) -> bool:
    """A flat list of finite numbers; numpy, because COCO has tens of millions of coordinates."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return False
    return array.ndim == 1 and bool(np.isfinite(array).all())


def _validate_images(images: list[Any], where: str) -> dict[int, dict]:
    by_id: dict[int, dict] = {}
    for i, img in enumerate(images):
        if not isinstance(img, dict) or not _is_int(img.get("id")):
            raise DatasetError(f"{where}: images[{i}] has no integer 'id'")
        ctx = f"{where}: image id {img['id']}"
        if img["id"] in by_id:
            raise DatasetError(f"{ctx}: duplicate image id")
        if not isinstance(img.get("file_name"), str) or not img["file_name"]:
            raise DatasetError(f"{ctx}: missing or empty 'file_name'")
        for key in ("width", "height"):
            if not _is_int(img.get(key)) or img[key] <= 0:
                raise DatasetError(f"{ctx}: {key!r} must be a positive integer, got {img.get(key)!r}")
        by_id[img["id"]] = img
    return by_id


def _validate_categories(categories: list[Any], where: str) -> dict[int, dict]:
    by_id: dict[int, dict] = {}
    for i, cat in enumerate(categories):
        if not isinstance(cat, dict) or not _is_int(cat.get("id")):
            raise DatasetError(f"{where}: categories[{i}] has no integer 'id'")
        if cat["id"] in by_id:
            raise DatasetError(f"{where}: category id {cat['id']}: duplicate category id")
        if not isinstance(cat.get("name"), str):
            raise DatasetError(f"{where}: category id {cat['id']}: missing 'name'")
        by_id[cat["id"]] = cat
    if not by_id:
        raise DatasetError(f"{where}: 'categories' is empty; at least one category is needed")
    return by_id


def _validate_annotations(
    annotations: list[Any], images: dict[int, dict], categories: dict[int, dict], where: str
) -> tuple[list[dict], list[int]]:
    """Check every annotation; return (kept annotations, ids dropped for a degenerate box).

    Kept annotations get defaults filled in (`iscrowd` 0, `area` from the mask) so that the targets
    and COCOeval read the same values.
    """
    kept: list[dict] = []
    dropped: list[int] = []
    seen: set[int] = set()
    for i, ann in enumerate(annotations):
        if not isinstance(ann, dict) or not _is_int(ann.get("id")):
            raise DatasetError(f"{where}: annotations[{i}] has no integer 'id'")
        ctx = f"{where}: annotation id {ann['id']} (image id {ann.get('image_id')})"
        if ann["id"] in seen:
            raise DatasetError(f"{ctx}: duplicate annotation id")
        seen.add(ann["id"])
        img = _check_references(ann, images, categories, ctx)
        _check_segmentation(ann["segmentation"], img["height"], img["width"], ctx)
        x1, y1, x2, y2 = _clipped_xyxy(_check_bbox(ann.get("bbox"), ctx), img["width"], img["height"])
        if x2 <= x1 or y2 <= y1:
            dropped.append(ann["id"])
            continue
        ann["iscrowd"] = _check_iscrowd(ann.get("iscrowd", 0), ctx)
        ann["area"] = _check_area(ann, img, ctx)
        kept.append(ann)
    return kept, dropped


def _check_references(ann: dict, images: dict[int, dict], categories: dict[int, dict], ctx: str) -> dict:
    for key in ("image_id", "category_id", "bbox", "segmentation"):
        if key not in ann:
            raise DatasetError(f"{ctx}: missing key {key!r}")
    if not _is_int(ann["image_id"]) or ann["image_id"] not in images:
        raise DatasetError(f"{ctx}: unknown image id {ann['image_id']!r}")
    if not _is_int(ann["category_id"]) or ann["category_id"] not in categories:
        raise DatasetError(f"{ctx}: unknown category id {ann['category_id']!r}")
    return images[ann["image_id"]]


def _check_bbox(bbox: Any, ctx: str) -> list[float]:
    if not isinstance(bbox, list) or len(bbox) != 4 or not all(_is_number(v) for v in bbox):
        raise DatasetError(f"{ctx}: 'bbox' must be 4 finite numbers [x, y, width, height], got {bbox!r}")
    return bbox


def _check_iscrowd(value: Any, ctx: str) -> int:
    if value not in (0, 1):
        raise DatasetError(f"{ctx}: 'iscrowd' must be 0 or 1, got {value!r}")
    return int(value)


def _check_area(ann: dict, img: dict, ctx: str) -> float:
    if "area" not in ann:
        return float(mask_utils.area(_to_rle(ann["segmentation"], img["height"], img["width"])))
    if not _is_number(ann["area"]) or ann["area"] < 0:
        raise DatasetError(f"{ctx}: 'area' must be a non-negative number, got {ann['area']!r}")
    return float(ann["area"])


def _check_segmentation(segm: Any, height: int, width: int, ctx: str) -> None:
    if isinstance(segm, list):
        _check_polygons(segm, height, width, ctx)
    elif isinstance(segm, dict):
        _check_rle(segm, height, width, ctx)
    else:
        raise DatasetError(f"{ctx}: 'segmentation' must be a list of polygons or an RLE object")


def _check_polygons(polygons: list[Any], height: int, width: int, ctx: str) -> None:
    if not polygons:
        raise DatasetError(f"{ctx}: 'segmentation' has no polygon")
    for k, poly in enumerate(polygons):
        if not isinstance(poly, list) or not _finite_numbers(poly):
            raise DatasetError(f"{ctx}: polygon {k} must be a flat list of numbers [x1, y1, x2, y2, ...]")
        # Fewer than 3 points is no area; pycocotools would also read 4 numbers as a box.
        if len(poly) < 6 or len(poly) % 2:
            raise DatasetError(
                f"{ctx}: polygon {k} has {len(poly)} coordinates; it needs at least 3 points "
                "(6 numbers) and an even count"
            )
        # pycocotools rasterises a polygon edge by edge in C, sized by the coordinates: points far
        # outside the image make it allocate without bound or crash the process (SIGSEGV at 1e12).
        # Real annotations stray from the image by rounding only; one image size either side is lenient.
        points = np.asarray(poly, dtype=np.float64).reshape(-1, 2)
        outside = (np.abs(points - [width / 2, height / 2]) > [1.5 * width, 1.5 * height]).any(axis=1)
        if outside.any():
            x, y = points[int(np.argmax(outside))]
            raise DatasetError(
                f"{ctx}: polygon {k} has the point ({x:g}, {y:g}), far outside the {width}x{height} image"
            )


def _check_rle(rle: dict, height: int, width: int, ctx: str) -> None:
    size, counts = rle.get("size"), rle.get("counts")
    if size != [height, width]:
        raise DatasetError(f"{ctx}: RLE 'size' is {size!r}, the image is [height, width] = {[height, width]}")
    if isinstance(counts, list):  # uncompressed: runs must be non-negative and cover the image exactly
        if not all(_is_int(c) and c >= 0 for c in counts) or sum(counts) != height * width:
            raise DatasetError(
                f"{ctx}: uncompressed RLE 'counts' must be non-negative integers summing to "
                f"height*width = {height * width}"
            )
    elif not isinstance(counts, str) or not counts:
        raise DatasetError(f"{ctx}: RLE 'counts' must be a list of integers or a compressed string")
    elif (runs := compressed_rle_runs(counts)) is None or min(runs) < 0 or sum(runs) != height * width:
        # pycocotools decodes whatever it is given: garbage raises a bare ValueError, a short string
        # silently gives a mask of the wrong size.
        raise DatasetError(
            f"{ctx}: compressed RLE 'counts' is not a valid run-length string covering "
            f"height*width = {height * width} pixels"
        )


def compressed_rle_runs(text: str) -> list[int] | None:
    """The runs of a compressed COCO RLE string (pycocotools' rleFrString, in Python), or None when the
    text is not one: 6 bits per character from '0', 5 of value, the sixth "more follows"; from the
    third run on, each value is a difference to the run two before."""
    runs: list[int] = []
    pos = 0
    while pos < len(text):
        value, shift, more = 0, 0, True
        while more:
            if pos >= len(text):
                return None  # the last run was cut off
            code = ord(text[pos]) - 48
            if not 0 <= code < 64:
                return None
            value |= (code & 0x1F) << shift
            more = bool(code & 0x20)
            pos, shift = pos + 1, shift + 5
            if not more and code & 0x10:
                value |= -1 << shift  # sign extension of the last group
        runs.append(value + runs[-2] if len(runs) > 2 else value)
    return runs or None


def _to_rle(segm: list | dict, height: int, width: int) -> dict:
    if isinstance(segm, list):
        return mask_utils.merge(mask_utils.frPyObjects(segm, height, width))
    if isinstance(segm["counts"], list):
        return mask_utils.frPyObjects(segm, height, width)
    return segm


def _clipped_xyxy(bbox: list[float], width: int, height: int) -> tuple[float, float, float, float]:
    """COCO [x, y, w, h] -> [x1, y1, x2, y2] clipped to the image."""
    x, y, w, h = bbox
    return (
        min(max(x, 0.0), width),
        min(max(y, 0.0), height),
        min(max(x + w, 0.0), width),
        min(max(y + h, 0.0), height),
    )
