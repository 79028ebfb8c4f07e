"""A plain COCO instances file decoded by msgspec into the records the rules judge (rules.py): the
first start's read of a large file (docs/performance.md has its figures beside json's).

msgspec's C decoder checks the types as it goes; the rules then judge whole columns at once, as they do
json's records. This read only ever accepts: anything it does not take as plain (a missing area to
compute, a float where an id belongs, NaN, a box beyond float64's exact integers) and anything a rule
refuses make it give up (NotPlain), and json's read (json_read.py) reads the file again and decides, in
its words. So what is accepted gives the same store either way, and what is refused is refused alike.
"""

from __future__ import annotations

import itertools
import json
from operator import attrgetter
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from . import columns as c
from .rules import Fault, ImageSizes, annotation_fault, image_fault, validate_categories

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


def read_columns(path: Path, where: str, kept: list[object] | None = None) -> tuple[c.Columns, list[dict[str, Any]]]:
    """The judged columns and the categories of `path`, as json's read would accept them; NotPlain (or
    the decoder's own error) when the file is anything else. `kept`: takes the decoded records instead of
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
    images = _image_records(data.images)
    _require(bool(((images.width < 2**31) & (images.height < 2**31)).all()), "an image size beyond int32")
    _refuse(image_fault(images, where))
    categories = validate_categories(json.loads(bytes(data.categories)), where)
    anns = _annotation_records(data.annotations)
    _require(bool(anns.area_given.all()), "an area to compute from the mask")
    _require(bool((np.abs(anns.bbox) < _EXACT).all()), "a box too large to add up exactly")
    order = np.argsort(images.ids, kind="stable")
    sizes = ImageSizes(images.ids[order], images.width[order], images.height[order])
    fault, keep = annotation_fault(anns, sizes, list(categories), where)
    _refuse(fault)
    kept_rows = np.flatnonzero(keep)
    columns = c.Columns(
        image_id=sizes.ids,
        width=sizes.width,
        height=sizes.height,
        file_names=[images.file_names[k] for k in order.tolist()],
        ann_id=anns.ids[kept_rows],
        ann_image_id=anns.image_id[kept_rows],
        category_id=anns.category_id[kept_rows],
        iscrowd=anns.iscrowd[kept_rows],
        area=anns.area[kept_rows],
        bbox=anns.bbox[kept_rows],
        kind=anns.kind[kept_rows],
        segments=[anns.segments[k] for k in kept_rows.tolist()],
        dropped=anns.ids[~keep].tolist(),
    )
    return columns, list(categories.values())


def _image_records(images: list[_Image]) -> c.ImageRecords:
    ids, width, height = (_column(images, name, np.int64) for name in ("id", "width", "height"))
    every = np.ones(len(images), dtype=bool)
    names = [image.file_name for image in images]
    named = np.fromiter(map(bool, names), bool, len(names))
    return c.ImageRecords(ids, every, names, named, width, every, height, every)


def _annotation_records(anns: list[_Annotation]) -> c.AnnotationRecords:
    count = len(anns)
    every = np.ones(count, dtype=bool)
    segmentations = [a.segmentation for a in anns]
    is_polygons = np.fromiter((type(s) is list for s in segmentations), bool, count)
    polygon_anns = np.flatnonzero(is_polygons)
    polygon_lists = [segmentations[k] for k in polygon_anns.tolist()]
    polygon_count = np.zeros(count, dtype=np.int64)
    polygon_count[polygon_anns] = np.fromiter(map(len, polygon_lists), np.int64, len(polygon_lists))
    every_polygon = list(itertools.chain.from_iterable(polygon_lists))
    polygons = c.PolygonRecords(
        np.repeat(polygon_anns, polygon_count[polygon_anns]),
        np.ones(len(every_polygon), dtype=bool),
        np.fromiter(map(len, every_polygon), np.int64, len(every_polygon)),
    )
    rle_anns = np.flatnonzero(~is_polygons)
    rles = [segmentations[k] for k in rle_anns.tolist()]
    texts = [r.counts if isinstance(r.counts, str) and r.counts else None for r in rles]  # type: ignore[union-attr]
    runs = [r.counts if isinstance(r.counts, list) else [] for r in rles]  # type: ignore[union-attr]
    run_start = c.offsets(np.fromiter(map(len, runs), np.int64, len(runs)))
    counts_kind = np.array(
        [c.COUNTS if isinstance(r.counts, list) else c.RLE if t else c.OTHER for r, t in zip(rles, texts, strict=True)],  # type: ignore[union-attr]
        dtype=np.uint8,
    ).reshape(-1)
    kind = np.full(count, c.POLYGONS, dtype=np.uint8)
    kind[rle_anns] = np.where(counts_kind == c.COUNTS, c.COUNTS, c.RLE)
    area = _column(anns, "area", np.float64)
    iscrowd = _column(anns, "iscrowd", np.int64)
    return c.AnnotationRecords(
        ids=_column(anns, "id", np.int64),
        ok=every,
        missing=np.full(count, -1, dtype=np.int8),
        image_id=_column(anns, "image_id", np.int64),
        image_id_ok=every,
        category_id=_column(anns, "category_id", np.int64),
        category_id_ok=every,
        kind=kind,
        polygon_count=polygon_count,
        polygons=polygons,
        rles=c.RleRecords(
            rle_anns,
            np.array([r.size for r in rles], dtype=np.float64).reshape(-1, 2),  # type: ignore[union-attr]
            counts_kind,
            texts,
            np.fromiter(itertools.chain.from_iterable(runs), np.int64, int(run_start[-1])),
            run_start,
            np.ones(len(rles), dtype=bool),
        ),
        bbox=np.fromiter(itertools.chain.from_iterable(a.bbox for a in anns), np.float64, 4 * count).reshape(-1, 4),
        bbox_ok=every,
        iscrowd=iscrowd,
        iscrowd_ok=np.isin(iscrowd, (0, 1)),
        area=np.nan_to_num(area),
        area_given=~np.isnan(area),
        area_ok=area >= 0,
        segments=_payloads(segmentations, rle_anns),
    )


def _payloads(segmentations: list, rle_anns: np.ndarray) -> list:
    """Each segmentation's payload for the store: its polygons, or its RLE's counts."""
    payloads = list(segmentations)
    for k in rle_anns.tolist():
        payloads[k] = segmentations[k].counts
    return payloads


def _column(records: list, name: str, dtype: type) -> np.ndarray:
    """One field of every record, as an array (OverflowError for an int beyond int64, as np.array)."""
    return np.fromiter(map(attrgetter(name), records), dtype, len(records))


def _refuse(fault: Fault | None) -> None:
    if fault is not None:
        raise NotPlain(fault.rule)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise NotPlain(what)
