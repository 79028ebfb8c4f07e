"""Any COCO instances file, read by json: decoded into records (columns.py) that the rules judge
(rules.py), whose refusals it words, quoting the file's own values.

This read decodes and nothing else: a record of the wrong shape is a flag for the rules, not an error
here. It is the read of every file the msgspec read (fast_read.py) does not take, and of every refusal.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

from ...errors import DatasetError
from .columns import (
    COUNTS,
    OTHER,
    POLYGONS,
    REQUIRED,
    RLE,
    AnnotationRecords,
    Columns,
    ImageRecords,
    int_column,
    is_int,
)
from .image_names import image_file_name
from .json_segments import PolygonCollector, RleCollector
from .masks import to_rle
from .rules import ImageSizes, annotation_fault, image_fault, validate_categories

_REQUIRED_KEYS = ("images", "annotations", "categories")


def read_annotation_file(path: Path) -> dict[str, Any]:
    """The JSON object of a COCO instances file, with its three lists; a DatasetError naming the file."""
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


def read_columns(path: Path, where: str, kept: list[object] | None = None) -> tuple[Columns, list[dict[str, Any]]]:
    """The judged columns and the categories of `path`; a DatasetError (naming `where` and the record)
    for the first rule it breaks. `kept`: takes the decoded objects instead of freeing them (cache.Build)."""
    data = read_annotation_file(path)
    if kept is not None:
        kept.append(data)
    return judged_columns(data, where)


def judged_columns(data: dict[str, Any], where: str) -> tuple[Columns, list[dict[str, Any]]]:
    """The judged columns and the categories of COCO instances records (`images`, `annotations`,
    `categories` lists, as JSON decodes them): what another format's decoder that writes its records
    so hands the rules (annotations/read.py); a DatasetError for the first rule they break."""
    images = image_records(data["images"])
    if fault := image_fault(images, where):
        raise DatasetError(fault.message())
    categories = validate_categories(data["categories"], where)
    sizes = image_sizes(images)
    anns = annotation_records(data["annotations"])
    fault, keep = annotation_fault(anns, sizes, list(categories), where)
    if fault:
        raise DatasetError(fault.message())
    return columns_of(images, anns, keep, sizes), list(categories.values())


def image_ids(path: Path) -> list[int]:
    """The ids of the images `path` lists, in id order, judged by the image rules."""
    images = image_records(read_annotation_file(path)["images"])
    if fault := image_fault(images, str(path)):
        raise DatasetError(fault.message())
    return sorted(images.ids.tolist())


def _is_number(x: Any) -> bool:
    try:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    except OverflowError:  # an int beyond a float's range
        return False


def image_records(records: list[Any]) -> ImageRecords:
    ok, ids, names, named = [], [], [], []
    sizes: dict[str, tuple[list[int], list[bool]]] = {"width": ([], []), "height": ([], [])}
    for img in records:
        record = img if isinstance(img, dict) else {}
        iid, name = record.get("id"), image_file_name(record)
        ok.append(is_int(iid))
        ids.append(iid if ok[-1] else 0)
        named.append(bool(name))
        names.append(name)
        for key, (values, valid) in sizes.items():
            value = record.get(key)
            valid.append(is_int(value))
            values.append(value if valid[-1] else 0)
    return ImageRecords(
        int_column(ids),
        np.array(ok, dtype=bool),
        names,
        np.array(named, dtype=bool),
        int_column(sizes["width"][0]),
        np.array(sizes["width"][1], dtype=bool),
        int_column(sizes["height"][0]),
        np.array(sizes["height"][1], dtype=bool),
        raw=records,
    )


def image_sizes(images: ImageRecords) -> ImageSizes:
    order = np.argsort(images.ids, kind="stable")
    return ImageSizes(images.ids[order], images.width[order], images.height[order])


def annotation_records(records: list[Any]) -> AnnotationRecords:
    """The annotations as records. Their polygons' points are taken only for an annotation without an
    area (its mask is rasterised for one: they are judged first); the others' on the store, all at once."""
    n = len(records)
    ok, missing, kind, polygon_count = (
        np.zeros(n, bool),
        np.full(n, -1, np.int8),
        np.zeros(n, np.uint8),
        np.zeros(n, np.int64),
    )
    ids, image_ids, category_ids = [0] * n, [0] * n, [0] * n
    image_ok, category_ok = np.zeros(n, bool), np.zeros(n, bool)
    bbox, bbox_ok = np.zeros((n, 4)), np.zeros(n, bool)
    iscrowd, iscrowd_ok = np.zeros(n, np.int64), np.zeros(n, bool)
    area, area_given, area_ok = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
    segments: list[Any] = [None] * n
    polygons = PolygonCollector()
    rles = RleCollector()
    for i, ann in enumerate(records):
        if not isinstance(ann, dict):
            continue
        ok[i] = is_int(ann.get("id"))
        ids[i] = ann["id"] if ok[i] else 0
        missing[i] = next((k for k, key in enumerate(REQUIRED) if key not in ann), -1)
        image_id, category_id = ann.get("image_id"), ann.get("category_id")
        image_ok[i], category_ok[i] = is_int(image_id), is_int(category_id)
        image_ids[i], category_ids[i] = image_id if image_ok[i] else 0, category_id if category_ok[i] else 0
        segm = ann.get("segmentation")
        if isinstance(segm, list):
            kind[i], polygon_count[i], segments[i] = POLYGONS, len(segm), segm
            polygons.add(i, segm, judged="area" not in ann)
        elif isinstance(segm, dict):
            counts = segm.get("counts")
            kind[i], segments[i] = (COUNTS if isinstance(counts, list) else RLE), counts
            rles.add(i, segm)
        else:
            kind[i] = OTHER
        box = ann.get("bbox")
        bbox_ok[i] = isinstance(box, list) and len(box) == 4 and all(_is_number(v) for v in box)
        if bbox_ok[i]:
            bbox[i] = [float(v) for v in box]
        crowd = ann.get("iscrowd", 0)
        iscrowd_ok[i] = crowd in (0, 1)
        iscrowd[i] = int(crowd) if iscrowd_ok[i] else 0
        area_given[i] = "area" in ann
        area_ok[i] = area_given[i] and _is_number(ann["area"]) and ann["area"] >= 0
        area[i] = float(ann["area"]) if area_ok[i] else 0.0
    return AnnotationRecords(  # the fields in their order: ids, references, segmentation, box, crowd, area
        int_column(ids),
        ok,
        missing,
        int_column(image_ids),
        image_ok,
        int_column(category_ids),
        category_ok,
        kind,
        polygon_count,
        polygons.records(),
        rles.records(),
        bbox,
        bbox_ok,
        iscrowd,
        iscrowd_ok,
        area,
        area_given,
        area_ok,
        segments,
        raw=records,
    )


def columns_of(images: ImageRecords, anns: AnnotationRecords, keep: np.ndarray, sizes: ImageSizes) -> Columns:
    """The store's columns of a judged file: images in id order, the kept annotations in file order, an
    area missing computed from the mask (as pycocotools' COCO.annToRLE rasterises it)."""
    raw_images = images.raw or []
    by_id = sorted(range(len(raw_images)), key=lambda k: raw_images[k]["id"])
    kept = np.flatnonzero(keep)
    raw = [anns.raw[k] for k in kept.tolist()] if anns.raw is not None else []
    area = anns.area[kept].copy()
    rows, _ = sizes.rows(anns.image_id[kept], np.ones(len(kept), dtype=bool))
    for j in np.flatnonzero(~anns.area_given[kept]).tolist():
        height, width = int(sizes.height[rows[j]]), int(sizes.width[rows[j]])
        area[j] = float(mask_utils.area(to_rle(raw[j]["segmentation"], height, width)))
    return Columns(
        image_id=np.array([raw_images[k]["id"] for k in by_id], dtype=np.int64),
        width=np.array([raw_images[k]["width"] for k in by_id], dtype=np.int32),
        height=np.array([raw_images[k]["height"] for k in by_id], dtype=np.int32),
        file_names=[images.file_names[k] for k in by_id],  # file_name, or a URL's path (image_names.py)
        ann_id=np.array([a["id"] for a in raw], dtype=np.int64),
        ann_image_id=np.array([a["image_id"] for a in raw], dtype=np.int64),
        category_id=np.array([a["category_id"] for a in raw], dtype=np.int64),
        iscrowd=anns.iscrowd[kept].astype(np.uint8),
        area=area,
        bbox=np.array([a["bbox"] for a in raw], dtype=np.float64).reshape(-1, 4),
        kind=anns.kind[kept],
        segments=[anns.segments[k] for k in kept.tolist()],
        dropped=[anns.raw[k]["id"] for k in np.flatnonzero(~keep).tolist()] if anns.raw is not None else [],
    )
