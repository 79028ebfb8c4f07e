"""A plain COCO instances file decoded straight into a store's columns, in a third of json.load's time.

At COCO's size (477 MiB) `json.load` takes 15-25 s and the per-annotation validation another 5 s of the
first start. Here msgspec decodes the file into typed records (its C decoder checks the types as it
goes), and the rules of data/annotations/json_read.py are applied to whole columns at once. This path only ever
accepts: anything it does not take as plain (a missing area to compute, a float where an id belongs,
NaN, a duplicate id, ...) makes it give up, and the stdlib path (store.read_store) reads the file again
and decides, with its messages. So what is accepted gives the same store either way, and what is refused
is refused in the stdlib path's words.
"""

from __future__ import annotations

import itertools
import json
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from .columns import COUNTS, POLYGONS, RLE, Columns, offsets
from .json_read import check_rle, validate_categories

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


def read_columns(path: Path, where: str, kept: list[object] | None = None) -> tuple[Columns, list[dict[str, Any]]]:
    """The columns and categories of `path`, as the stdlib path would accept them; NotPlain (or the
    decoder's own error) when the file is anything else. `kept`: takes the decoded records instead of
    freeing them (cache.Build)."""
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
    if kept is not None:
        kept.append(data)
    categories = validate_categories(json.loads(bytes(data.categories)), where)
    images = data.images
    image_id, width, height = (_column(images, name, np.int64) for name in ("id", "width", "height"))
    _require(_unique(image_id), "duplicate image id")
    _require(all(i.file_name for i in images), "empty file_name")
    _require(bool(((width > 0) & (height > 0) & (width < 2**31) & (height < 2**31)).all()), "image size")
    by_id = np.argsort(image_id, kind="stable")
    image_id, width, height = image_id[by_id], width[by_id], height[by_id]

    anns = data.annotations
    ann_id, ann_image_id, category_id, iscrowd = (
        _column(anns, name, np.int64) for name in ("id", "image_id", "category_id", "iscrowd")
    )
    area = _column(anns, "area", np.float64)
    bbox = np.fromiter(itertools.chain.from_iterable(a.bbox for a in anns), np.float64, 4 * len(anns)).reshape(-1, 4)
    _require(_unique(ann_id), "duplicate annotation id")
    rows = np.minimum(np.searchsorted(image_id, ann_image_id), max(len(image_id) - 1, 0))
    _require(len(image_id) > 0 or not len(anns), "annotations without images")
    _require(bool((image_id[rows] == ann_image_id).all()) if len(anns) else True, "unknown image id")
    _require(bool(np.isin(category_id, list(categories)).all()), "unknown category id")
    _require(bool(np.isin(iscrowd, (0, 1)).all()), "iscrowd not 0 or 1")
    _require(bool((area >= 0).all()), "area missing (computed from the mask) or negative")
    _require(bool((np.abs(bbox) < _EXACT).all()), "a box too large to add up exactly")
    segmentations = [a.segmentation for a in anns]
    _check_segmentations(segmentations, height[rows], width[rows], where)

    # annotations.clipped_xyxy, over all boxes: an empty box after clipping is dropped.
    w, h = width[rows].astype(np.float64), height[rows].astype(np.float64)
    x1, y1 = np.clip(bbox[:, 0], 0.0, w), np.clip(bbox[:, 1], 0.0, h)
    x2, y2 = np.clip(bbox[:, 0] + bbox[:, 2], 0.0, w), np.clip(bbox[:, 1] + bbox[:, 3], 0.0, h)
    keep = (x2 > x1) & (y2 > y1)
    kept = np.flatnonzero(keep)
    in_store_order = kept[np.argsort(rows[kept], kind="stable")]  # store_from_columns' order
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
        segmentations=[],
        dropped=ann_id[~keep].tolist(),
        segments=_segment_arrays([segmentations[k] for k in in_store_order.tolist()]),
    )
    return columns, list(categories.values())


def _check_segmentations(
    segmentations: list[list[list[float]] | _Rle], heights: np.ndarray, widths: np.ndarray, where: str
) -> None:
    """annotations.check_polygons' shape rule (points are checked on the store) and check_rle, over every
    annotation: the shapes and uncompressed runs by whole columns (NotPlain for any offender: the stdlib
    path names it), then each compressed RLE in file order (check_rle's own DatasetError)."""
    polygons = [segm for segm in segmentations if type(segm) is list]
    _require(min(map(len, polygons), default=1) > 0, "no polygon")
    lengths = np.fromiter(map(len, itertools.chain.from_iterable(polygons)), np.int64)
    _require(not ((lengths < 6) | (lengths % 2 == 1)).any(), "polygon shape")
    rles = [k for k, segm in enumerate(segmentations) if type(segm) is not list]
    runs = [k for k in rles if isinstance(segmentations[k].counts, list)]  # type: ignore[union-attr]
    if runs:
        counts = [segmentations[k].counts for k in runs]  # type: ignore[union-attr]
        sizes = np.array([segmentations[k].size for k in runs], dtype=np.int64).reshape(-1, 2)  # type: ignore[union-attr]
        rows = np.array(runs)
        _require(bool((sizes == np.stack([heights[rows], widths[rows]], axis=1)).all()), "uncompressed RLE")
        run_lengths = np.fromiter(map(len, counts), np.int64, len(counts))
        _require(bool((run_lengths > 0).all()), "uncompressed RLE")  # no runs: cannot sum to a pixel count
        flat = np.fromiter(itertools.chain.from_iterable(counts), np.int64, int(run_lengths.sum()))
        starts = offsets(run_lengths)[:-1]
        pixels = heights[rows].astype(np.int64) * widths[rows].astype(np.int64)
        # (no run above the pixel count: the int64 sums cannot wrap around to it)
        ok = (np.minimum.reduceat(flat, starts) >= 0) & (np.maximum.reduceat(flat, starts) <= pixels)
        _require(bool(ok.all()) and bool((np.add.reduceat(flat, starts) == pixels).all()), "uncompressed RLE")
    for k in rles:
        if isinstance(segmentations[k].counts, str):  # type: ignore[union-attr]
            # raises the DatasetError the stdlib path would: this path gives up on it
            check_rle(_as_json(segmentations[k]), int(heights[k]), int(widths[k]), where)


def _segment_arrays(segmentations: list[list[list[float]] | _Rle]) -> dict[str, np.ndarray]:
    """store._Segments' arrays of these (checked) segmentations, by whole columns."""
    kinds = np.array(
        [POLYGONS if type(s) is list else RLE if isinstance(s.counts, str) else COUNTS for s in segmentations],  # type: ignore[union-attr]
        dtype=np.uint8,
    )
    polygons = [s for s in segmentations if type(s) is list]
    texts = [s.counts.encode("ascii") for s in segmentations if type(s) is not list and isinstance(s.counts, str)]  # type: ignore[union-attr]
    runs = [s.counts for s in segmentations if type(s) is not list and not isinstance(s.counts, str)]  # type: ignore[union-attr]
    every = list(itertools.chain.from_iterable(polygons))
    point_counts = np.fromiter(map(len, every), np.int64, len(every))
    poly_start = offsets(point_counts)
    lengths = np.zeros(len(segmentations), dtype=np.int64)
    for kind, items in ((POLYGONS, polygons), (RLE, texts), (COUNTS, runs)):
        lengths[kinds == kind] = np.fromiter(map(len, items), np.int64, len(items))
    starts = np.zeros(len(segmentations), dtype=np.int64)
    for kind in (POLYGONS, RLE, COUNTS):
        of_kind = kinds == kind
        starts[of_kind] = offsets(lengths[of_kind])[:-1]
    return {
        "seg_kind": kinds,
        "seg_start": starts,
        "seg_len": lengths,
        "poly_start": poly_start,
        "coords": np.fromiter(itertools.chain.from_iterable(every), np.float64, int(poly_start[-1])),
        "rle": np.frombuffer(b"".join(texts), dtype=np.uint8),
        "counts": np.fromiter(itertools.chain.from_iterable(runs), np.int64, int(lengths[kinds == COUNTS].sum())),
    }


def _as_json(segm: list[list[float]] | _Rle) -> list[list[float]] | dict[str, Any]:
    if isinstance(segm, list):
        return segm
    return {"size": list(segm.size), "counts": segm.counts}


def _column(records: list, name: str, dtype: type) -> np.ndarray:
    """One field of every record, as an array (OverflowError for an int beyond int64, as np.array)."""
    return np.fromiter(map(attrgetter(name), records), dtype, len(records))


def _unique(values: np.ndarray) -> bool:
    ordered = np.sort(values)
    return bool((ordered[1:] != ordered[:-1]).all())


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise NotPlain(what)
