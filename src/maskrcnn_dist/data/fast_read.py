"""A plain COCO instances file decoded straight into a store's columns, in a third of json.load's time.

At COCO's size (477 MiB) `json.load` takes 15-25 s and the per-annotation validation another 5 s of the
first start. Here msgspec decodes the file into typed records (its C decoder checks the types as it
goes), and the rules of data/annotations.py are applied to whole columns at once. This path only ever
accepts: anything it does not take as plain (a missing area to compute, a float where an id belongs,
NaN, a duplicate id, ...) makes it give up, and the stdlib path (store.read_store) reads the file again
and decides, with its messages. So what is accepted gives the same store either way, and what is refused
is refused in the stdlib path's words.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .annotations import check_rle, validate_categories
from .columns import Columns

_EXACT = float(2**53)  # below this, integer boxes add up in float64 exactly as Python's ints do


class NotPlain(Exception):
    """The file is not one this path takes; the stdlib path decides."""


class _Image(msgspec.Struct):
    id: int
    file_name: str
    width: int
    height: int


class _Rle(msgspec.Struct):
    size: tuple[int, int]
    counts: str | list[int]


class _Annotation(msgspec.Struct):
    id: int
    image_id: int
    category_id: int
    bbox: tuple[float, float, float, float]
    segmentation: list[list[float]] | _Rle
    area: float = float("nan")  # JSON has no NaN (msgspec refuses it): NaN means "no area given"
    iscrowd: int = 0


class _File(msgspec.Struct):
    images: list[_Image]
    annotations: list[_Annotation]
    categories: msgspec.Raw  # a handful of records kept whole: json.loads gives them exactly


def read_columns(path: Path, where: str) -> tuple[Columns, list[dict[str, Any]]]:
    """The columns and categories of `path`, as the stdlib path would accept them; NotPlain (or the
    decoder's own error) when the file is anything else."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise NotPlain(str(e)) from e
    # json.load reads text: bad UTF-8 is an error there, even in a field this decoder skips (a byte
    # order mark too: msgspec refuses it itself). ASCII, the usual case, is told in a fraction of a second.
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise NotPlain(str(e)) from e
    try:
        data = msgspec.json.decode(raw, type=_File)
    except msgspec.DecodeError as e:  # malformed, or a type this path does not take
        raise NotPlain(str(e)) from e
    del raw
    categories = validate_categories(json.loads(bytes(data.categories)), where)
    images = data.images
    image_id = np.array([i.id for i in images], dtype=np.int64)
    width = np.array([i.width for i in images], dtype=np.int64)
    height = np.array([i.height for i in images], dtype=np.int64)
    _require(_unique(image_id), "duplicate image id")
    _require(all(i.file_name for i in images), "empty file_name")
    _require(bool(((width > 0) & (height > 0) & (width < 2**31) & (height < 2**31)).all()), "image size")
    by_id = np.argsort(image_id, kind="stable")
    image_id, width, height = image_id[by_id], width[by_id], height[by_id]

    anns = data.annotations
    ann_id = np.array([a.id for a in anns], dtype=np.int64)
    ann_image_id = np.array([a.image_id for a in anns], dtype=np.int64)
    category_id = np.array([a.category_id for a in anns], dtype=np.int64)
    iscrowd = np.array([a.iscrowd for a in anns], dtype=np.int64)
    area = np.array([a.area for a in anns], dtype=np.float64)
    bbox = np.fromiter(itertools.chain.from_iterable(a.bbox for a in anns), np.float64, 4 * len(anns)).reshape(-1, 4)
    _require(_unique(ann_id), "duplicate annotation id")
    rows = np.minimum(np.searchsorted(image_id, ann_image_id), max(len(image_id) - 1, 0))
    _require(len(image_id) > 0 or not len(anns), "annotations without images")
    _require(bool((image_id[rows] == ann_image_id).all()) if len(anns) else True, "unknown image id")
    _require(bool(np.isin(category_id, list(categories)).all()), "unknown category id")
    _require(bool(np.isin(iscrowd, (0, 1)).all()), "iscrowd not 0 or 1")
    _require(bool((area >= 0).all()), "area missing (computed from the mask) or negative")
    _require(bool((np.abs(bbox) < _EXACT).all()), "a box too large to add up exactly")
    _check_segmentations(anns, height[rows], width[rows], where)

    # annotations.clipped_xyxy, over all boxes: an empty box after clipping is dropped.
    w, h = width[rows].astype(np.float64), height[rows].astype(np.float64)
    x1, y1 = np.clip(bbox[:, 0], 0.0, w), np.clip(bbox[:, 1], 0.0, h)
    x2, y2 = np.clip(bbox[:, 0] + bbox[:, 2], 0.0, w), np.clip(bbox[:, 1] + bbox[:, 3], 0.0, h)
    keep = (x2 > x1) & (y2 > y1)
    kept = np.flatnonzero(keep)
    columns = Columns(
        image_id=image_id,
        width=width,
        height=height,
        file_names=[images[k].file_name for k in by_id.tolist()],
        ann_id=ann_id[kept],
        ann_image_id=ann_image_id[kept],
        category_id=category_id[kept],
        iscrowd=iscrowd[kept],
        area=area[kept],
        bbox=bbox[kept],
        segmentations=[_as_json(anns[k].segmentation) for k in kept.tolist()],
        dropped=ann_id[~keep].tolist(),
    )
    return columns, list(categories.values())


def _check_segmentations(anns: list[_Annotation], heights: np.ndarray, widths: np.ndarray, where: str) -> None:
    """annotations.check_polygons' shape rule (points are checked on the store) and check_rle (its rule
    for uncompressed runs in numpy: a crowd region has thousands)."""
    for k, ann in enumerate(anns):
        segm = ann.segmentation
        if isinstance(segm, list):
            _require(bool(segm), "no polygon")
            for polygon in segm:
                if len(polygon) < 6 or len(polygon) % 2:
                    raise NotPlain("polygon shape")
        elif isinstance(segm.counts, list):
            pixels = int(heights[k]) * int(widths[k])
            runs = np.array(segm.counts, dtype=np.int64)
            # (no run above the pixel count: the int64 sum cannot wrap around to it)
            ok = runs.min(initial=0) >= 0 and runs.max(initial=0) <= pixels and runs.sum() == pixels
            _require(segm.size == (heights[k], widths[k]) and bool(ok), "uncompressed RLE")
        else:  # raises the DatasetError the stdlib path would: this path gives up on it
            check_rle(_as_json(segm), int(heights[k]), int(widths[k]), where)


def _as_json(segm: list[list[float]] | _Rle) -> list[list[float]] | dict[str, Any]:
    if isinstance(segm, list):
        return segm
    return {"size": list(segm.size), "counts": segm.counts}


def _unique(values: np.ndarray) -> bool:
    ordered = np.sort(values)
    return bool((ordered[1:] != ordered[:-1]).all())


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise NotPlain(what)
