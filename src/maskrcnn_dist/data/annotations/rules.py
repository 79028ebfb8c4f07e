"""The rules of a COCO instances file, each stated once, over whole columns (columns.py).

Both reads decode and then run these: json_read.py for any file, fast_read.py for a plain one. A rule is
a mask of the records that break it, in file order; a file is refused at the first record any rule
refuses, for the first rule that record breaks, in the order a record is read (its id, its references,
its segmentation, its box, then, for a box left after clipping, its crowd flag and area). Each refusal
names the file and the image or annotation id. Its words quote the values as the file wrote them, so only
json's read says them: the msgspec read gives up at any refusal and json reads the file again.

The rules of a segmentation (polygons, run-length encodings) are mask_rules.py's. Invariant: a box empty
after clipping (clip_boxes, the targets' clipping too) is dropped, never trained on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import DatasetError
from . import columns
from .columns import POLYGONS, REQUIRED, int_column, is_int
from .image_names import URL_FIELDS
from .mask_rules import SegmentationFaults, segmentation_faults

NO_FILE_NAME = f"missing or empty 'file_name' (and no {' or '.join(map(repr, URL_FIELDS))} to take it from)"


@dataclass(frozen=True)
class Fault:
    """The first record a file is refused at (its row in file order) and the rule it breaks."""

    row: int
    rule: str
    _words: Callable[[], str]

    def message(self) -> str:
        """The refusal, as a DatasetError's message: it quotes the record as the file wrote it."""
        return self._words()


Check = tuple[str, np.ndarray, Callable[[int], str]]


def first_fault(checks: Sequence[Check]) -> Fault | None:
    """The first row any check refuses, with the first check (in their order) that refuses it."""
    firsts = [int(np.argmax(mask)) for _, mask, _ in checks if mask.any()]
    if not firsts:
        return None
    row = min(firsts)
    rule, _, words = next(check for check in checks if check[1][row])
    return Fault(row, rule, functools.partial(words, row))


def repeated(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Where a valid row's value is a valid earlier row's."""
    rows = np.flatnonzero(valid)
    order = np.argsort(values[rows], kind="stable")
    ordered = values[rows][order]
    again = np.zeros(len(values), dtype=bool)
    if len(ordered) > 1:
        again[rows[order[1:][ordered[1:] == ordered[:-1]]]] = True
    return again


def image_fault(images: columns.ImageRecords, where: str) -> Fault | None:
    """Unique integer ids, a file name, positive integer sizes."""
    raw = images.raw

    def ctx(i: int) -> str:
        return f"{where}: image id {raw[i]['id']}"

    def size(key: str) -> Callable[[int], str]:
        return lambda i: f"{ctx(i)}: {key!r} must be a positive integer, got {raw[i].get(key)!r}"

    return first_fault(
        [
            ("no integer id", ~images.ok, lambda i: f"{where}: images[{i}] has no integer 'id'"),
            ("duplicate image id", repeated(images.ids, images.ok), lambda i: f"{ctx(i)}: duplicate image id"),
            ("empty file_name", ~images.named, lambda i: f"{ctx(i)}: {NO_FILE_NAME}"),
            ("width", ~(images.width_ok & (images.width > 0)), size("width")),
            ("height", ~(images.height_ok & (images.height > 0)), size("height")),
        ]
    )


def validate_categories(categories: list[Any], where: str) -> dict[int, dict]:
    """The `categories` list by id: unique integer ids with names, at least one (a handful of records:
    both reads judge them as json decodes them)."""
    by_id: dict[int, dict] = {}
    for i, cat in enumerate(categories):
        if not isinstance(cat, dict) or not is_int(cat.get("id")):
            raise DatasetError(f"{where}: categories[{i}] has no integer 'id'")
        if cat["id"] in by_id:
            raise DatasetError(f"{where}: category id {cat['id']}: duplicate category id")
        if not isinstance(cat.get("name"), str):
            raise DatasetError(f"{where}: category id {cat['id']}: missing 'name'")
        by_id[cat["id"]] = cat
    if not by_id:
        raise DatasetError(f"{where}: 'categories' is empty; at least one category is needed")
    return by_id


@dataclass(frozen=True)
class ImageSizes:
    """The images in id order, for the annotations' references: ids, widths, heights."""

    ids: np.ndarray
    width: np.ndarray
    height: np.ndarray

    def rows(self, image_ids: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each valid image id's row here (0 where none) and whether there is one."""
        rows = np.minimum(np.searchsorted(self.ids, image_ids), max(len(self.ids) - 1, 0))
        known = valid & (len(self.ids) > 0)
        if len(self.ids):
            known &= self.ids[rows] == image_ids
        return np.where(known, rows, 0), known


def annotation_fault(
    anns: columns.AnnotationRecords, images: ImageSizes, category_ids: Sequence[int], where: str
) -> tuple[Fault | None, np.ndarray]:
    """The first refused annotation (None: none), and which annotations are kept: those whose box is
    not empty after clipping to its image (clip_boxes)."""
    raw = anns.raw
    rows, image_known = images.rows(anns.image_id, anns.image_id_ok)
    width = np.where(image_known, images.width[rows] if len(images.ids) else 0, 0).astype(np.int64)
    height = np.where(image_known, images.height[rows] if len(images.ids) else 0, 0).astype(np.int64)
    category_known = anns.category_id_ok & np.isin(anns.category_id, int_column(list(category_ids)))
    x1, y1, x2, y2 = clip_boxes(anns.bbox, width, height).T  # (a box that is no box is 0s: refused first)
    kept = (x2 > x1) & (y2 > y1)
    segmentation = segmentation_faults(anns, width, height)

    def ctx(i: int) -> str:
        return f"{where}: annotation id {raw[i]['id']} (image id {raw[i].get('image_id')})"

    missing_words, segmentation_words = _mask_words(anns, ctx, segmentation)

    checks: list[Check] = [
        ("no integer id", ~anns.ok, lambda i: f"{where}: annotations[{i}] has no integer 'id'"),
        ("duplicate annotation id", repeated(anns.ids, anns.ok), lambda i: f"{ctx(i)}: duplicate annotation id"),
        ("missing key", anns.missing >= 0, missing_words),
        ("unknown image id", ~image_known, lambda i: f"{ctx(i)}: unknown image id {raw[i]['image_id']!r}"),
        (
            "unknown category id",
            ~category_known,
            lambda i: f"{ctx(i)}: unknown category id {raw[i]['category_id']!r}",
        ),
        ("segmentation", segmentation.bad, segmentation_words),
        (
            "bbox",
            ~anns.bbox_ok,
            lambda i: f"{ctx(i)}: 'bbox' must be 4 finite numbers [x, y, width, height], got {raw[i].get('bbox')!r}",
        ),
        (
            "iscrowd",
            kept & ~anns.iscrowd_ok,
            lambda i: f"{ctx(i)}: 'iscrowd' must be 0 or 1, got {raw[i].get('iscrowd', 0)!r}",
        ),
        (
            "area",
            kept & anns.area_given & ~anns.area_ok,
            lambda i: f"{ctx(i)}: 'area' must be a non-negative number, got {raw[i]['area']!r}",
        ),
    ]
    return first_fault(checks), kept


def _mask_words(anns: columns.AnnotationRecords, ctx: Callable[[int], str], segmentation: SegmentationFaults) -> Any:
    """The words of a missing key and of a bad segmentation; where no annotation of the file has a mask
    (no 'segmentation', or no polygon), they say so: a boxes-only export, and what to do."""
    empty = (anns.kind == POLYGONS) & (anns.polygon_count == 0)
    boxes_only = len(anns.ids) > 0 and bool((empty | (anns.missing == REQUIRED.index("segmentation"))).all())
    hint = (
        f"; none of the file's {len(anns.ids)} annotations has a mask (a boxes-only export): Mask R-CNN learns "
        'masks: export polygons or masks (Roboflow\'s "COCO Segmentation") or make masks from the boxes (e.g. SAM)'
    )
    end = hint if boxes_only else ""
    return (
        lambda i: f"{ctx(i)}: missing key {REQUIRED[anns.missing[i]]!r}{end}",
        lambda i: f"{ctx(i)}: {segmentation.words(i)}{end}",
    )


def clip_boxes(xywh: np.ndarray, width: np.ndarray | int, height: np.ndarray | int) -> np.ndarray:
    """COCO boxes [x, y, w, h] ([n, 4]) as [x1, y1, x2, y2] clipped to their images (`width`, `height`:
    one image's, or one per box), in float64: the targets' boxes, and the rule that drops a box empty
    after clipping."""
    x, y, w, h = np.asarray(xywh, dtype=np.float64).reshape(-1, 4).T
    right, bottom = np.asarray(width, dtype=np.float64), np.asarray(height, dtype=np.float64)
    return np.stack(
        [
            np.minimum(np.maximum(x, 0.0), right),
            np.minimum(np.maximum(y, 0.0), bottom),
            np.minimum(np.maximum(x + w, 0.0), right),
            np.minimum(np.maximum(y + h, 0.0), bottom),
        ],
        axis=1,
    )
