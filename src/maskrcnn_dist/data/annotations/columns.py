"""What a COCO instances file is decoded into, whichever read decoded it (json_read.py, fast_read.py):
records as columns, one entry per image, annotation or polygon in file order, each with what its decoder
could not take as the rules want it (a flag, never an exception), so that the rules (rules.py) judge
both reads alike. Then the columns of a judged file, which its SampleStore is built from (store.SampleStore.of_columns).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A segmentation's kind: polygons, a compressed RLE string, uncompressed RLE runs (the store keeps these
# three); OTHER: neither polygons nor an RLE object (the rules refuse it).
POLYGONS, RLE, COUNTS, OTHER = 0, 1, 2, 3
REQUIRED = ("image_id", "category_id", "bbox", "segmentation")  # an annotation's keys, in the order they are named


def offsets(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Where each of consecutive items of these lengths starts, and where the last ends (int64)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def is_int(x: Any) -> bool:
    """An integer as JSON gives one (a bool is not)."""
    return isinstance(x, int) and not isinstance(x, bool)


def int_column(values: Sequence[int]) -> np.ndarray:
    """Integers as int64, or as Python's own (an object array) where one is beyond int64: the rules
    compare ids exactly, whatever their size."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array(values, dtype=object)


@dataclass
class ImageRecords:
    """The `images` list. `ok`: a record with an integer id (`ids`, 0 where not); `named`: a non-empty
    file_name; `width_ok`/`height_ok`: integers (`width`, `height`, 0 where not). `raw`: the records as
    the file has them, for the rules' words (json's read only)."""

    ids: np.ndarray
    ok: np.ndarray
    file_names: list[str]
    named: np.ndarray
    width: np.ndarray
    width_ok: np.ndarray
    height: np.ndarray
    height_ok: np.ndarray
    raw: Sequence[Any] | None = None


@dataclass
class PolygonRecords:
    """Every polygon of the polygon annotations: its annotation's row, whether it is a list, its length.
    The polygons whose points are judged in their record (an annotation without an area: its mask is
    rasterised for one) have their coordinates in `points` (NaN-filled where not a flat list of numbers),
    polygon `judged[j]`'s from `point_start[j]`."""

    ann: np.ndarray
    is_list: np.ndarray
    length: np.ndarray
    judged: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    points: np.ndarray = field(default_factory=lambda: np.zeros(0))
    point_start: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))


@dataclass
class RleRecords:
    """Every RLE segmentation (a dict): its annotation's row, its `size` as two numbers (NaN where it is
    not two numbers), its counts' kind (RLE: a string, COUNTS: a list, OTHER: neither), a string's text,
    and a list's runs (`runs`, from `run_start`; `runs_ints`: every run an integer)."""

    ann: np.ndarray
    size: np.ndarray
    counts_kind: np.ndarray
    texts: list[str | None]
    runs: np.ndarray
    run_start: np.ndarray
    runs_ints: np.ndarray


@dataclass
class AnnotationRecords:
    """The `annotations` list. `ok`: a record with an integer id; `missing`: the index in REQUIRED of its
    first missing key (-1: none); `*_ok`: the field is of its type (an integer id, 4 finite numbers,
    0 or 1, a non-negative number); `area_given`: an area is there (else it is the mask's); `kind`: its
    segmentation's (POLYGONS, RLE, COUNTS, OTHER), `polygon_count` of them; `segments`: each
    segmentation's payload (its polygons, its counts) for the store."""

    ids: np.ndarray
    ok: np.ndarray
    missing: np.ndarray
    image_id: np.ndarray
    image_id_ok: np.ndarray
    category_id: np.ndarray
    category_id_ok: np.ndarray
    kind: np.ndarray
    polygon_count: np.ndarray
    polygons: PolygonRecords
    rles: RleRecords
    bbox: np.ndarray
    bbox_ok: np.ndarray
    iscrowd: np.ndarray
    iscrowd_ok: np.ndarray
    area: np.ndarray
    area_given: np.ndarray
    area_ok: np.ndarray
    segments: Sequence[Any]
    raw: Sequence[Any] | None = None


@dataclass
class Columns:
    """What a store is built from: the images in id order, the kept annotations in file order (each
    column one entry per annotation) with their segmentations' kinds and payloads, and the ids of the
    annotations dropped for a degenerate box."""

    image_id: np.ndarray
    width: np.ndarray
    height: np.ndarray
    file_names: Sequence[str]
    ann_id: np.ndarray
    ann_image_id: np.ndarray
    category_id: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray
    bbox: np.ndarray
    kind: np.ndarray
    segments: Sequence[Any]
    dropped: Sequence[int]


def segment_arrays(kinds: np.ndarray, payloads: Sequence[Any]) -> tuple[dict[str, np.ndarray], bool]:
    """The store's segmentation arrays of these segmentations (POLYGONS: a list of polygons; RLE: the
    counts' text; COUNTS: the runs), in this order, and whether every coordinate converted to a number
    (one that did not is NaN: the points rule names it, store.polygon_points_fault)."""
    kinds = np.asarray(kinds, dtype=np.uint8)
    of_kind = {kind: [payloads[k] for k in np.flatnonzero(kinds == kind).tolist()] for kind in (POLYGONS, RLE, COUNTS)}
    polygons = list(itertools.chain.from_iterable(of_kind[POLYGONS]))
    texts = [text.encode("ascii") for text in of_kind[RLE]]
    runs = of_kind[COUNTS]
    poly_start = offsets(np.fromiter(map(len, polygons), np.int64, len(polygons)))
    lengths = np.zeros(len(kinds), dtype=np.int64)
    for kind, items in ((POLYGONS, of_kind[POLYGONS]), (RLE, texts), (COUNTS, runs)):
        lengths[kinds == kind] = np.fromiter(map(len, items), np.int64, len(items))
    starts = np.zeros(len(kinds), dtype=np.int64)
    for kind in (POLYGONS, RLE, COUNTS):
        starts[kinds == kind] = offsets(lengths[kinds == kind])[:-1]
    coords, numbers = coordinates(polygons, int(poly_start[-1]))
    return {
        "seg_kind": kinds,
        "seg_start": starts,
        "seg_len": lengths,
        "poly_start": poly_start,
        "coords": coords,
        "rle": np.frombuffer(b"".join(texts), dtype=np.uint8),
        "counts": np.fromiter(itertools.chain.from_iterable(runs), np.int64, int(lengths[kinds == COUNTS].sum())),
    }, numbers


def coordinates(polygons: Sequence[Sequence[Any]], count: int) -> tuple[np.ndarray, bool]:
    """The polygons' coordinates chained as float64 (numpy's conversion: a bool is 0 or 1, None is NaN),
    and whether all converted: a polygon that does not (a string that is no number, a nested list) is
    NaN throughout."""
    try:
        return np.fromiter(itertools.chain.from_iterable(polygons), np.float64, count), True
    except (TypeError, ValueError):
        return np.concatenate([as_points(polygon) for polygon in polygons] or [np.zeros(0)]), False


def as_points(polygon: Any) -> np.ndarray:
    """One polygon's coordinates (a flat list of numbers), NaN-filled where it is not one."""
    try:
        points = np.asarray(polygon, dtype=np.float64)
    except (TypeError, ValueError):
        points = None
    if points is None or points.ndim != 1:
        return np.full(len(polygon) if isinstance(polygon, list) else 0, np.nan)
    return points
