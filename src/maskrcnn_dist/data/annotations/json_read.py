"""The COCO instances JSON, read and validated once, up front.

A bad file fails at start-up with a message that names the file and the offending image or annotation
id, instead of deep inside a data-loader worker; and nothing reaches pycocotools that its C code would
crash on or silently misread (polygons far outside the image, run-length strings of the wrong size).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

from maskrcnn_dist.errors import DatasetError

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


def validate_images(images: list[Any], where: str) -> dict[int, dict]:
    """The `images` list by id: unique integer ids, a file name, positive integer sizes."""
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


def validate_categories(categories: list[Any], where: str) -> dict[int, dict]:
    """The `categories` list by id: unique integer ids with names, at least one."""
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


def validate_annotations(
    annotations: list[Any],
    images: dict[int, dict],
    categories: dict[int, dict],
    where: str,
    *,
    points_later: bool = False,
) -> tuple[list[dict], list[int]]:
    """Check every annotation; return (kept annotations, ids dropped for a degenerate box).

    Kept annotations get defaults filled in (`iscrowd` 0, `area` from the mask) so that the targets
    and COCOeval read the same values. `points_later`: polygons are checked for their shape only, their
    points (numbers, finite, near the image) by the caller, all at once (data/annotations/store.py's
    check_polygon_points: per polygon in numpy is most of the time COCO's 860k annotations take).
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
        # An area computed from the mask rasterises the polygons here: their points are checked first.
        points = not points_later or "area" not in ann
        _check_segmentation(ann["segmentation"], img["height"], img["width"], ctx, points=points)
        x1, y1, x2, y2 = clipped_xyxy(_check_bbox(ann.get("bbox"), ctx), img["width"], img["height"])
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
        return float(mask_utils.area(to_rle(ann["segmentation"], img["height"], img["width"])))
    if not _is_number(ann["area"]) or ann["area"] < 0:
        raise DatasetError(f"{ctx}: 'area' must be a non-negative number, got {ann['area']!r}")
    return float(ann["area"])


def _check_segmentation(segm: Any, height: int, width: int, ctx: str, *, points: bool = True) -> None:
    if isinstance(segm, list):
        check_polygons(segm, height, width, ctx, points=points)
    elif isinstance(segm, dict):
        check_rle(segm, height, width, ctx)
    else:
        raise DatasetError(f"{ctx}: 'segmentation' must be a list of polygons or an RLE object")


def check_polygons(polygons: list[Any], height: int, width: int, ctx: str, *, points: bool = True) -> None:
    """A segmentation's polygons: flat lists of at least 3 points; with `points`, of finite numbers
    that lie near the image."""
    if not polygons:
        raise DatasetError(f"{ctx}: 'segmentation' has no polygon")
    for k, poly in enumerate(polygons):
        if not isinstance(poly, list) or (points and not _finite_numbers(poly)):
            raise DatasetError(f"{ctx}: polygon {k} must be a flat list of numbers [x1, y1, x2, y2, ...]")
        # Fewer than 3 points is no area; pycocotools would also read 4 numbers as a box.
        if len(poly) < 6 or len(poly) % 2:
            raise DatasetError(
                f"{ctx}: polygon {k} has {len(poly)} coordinates; it needs at least 3 points "
                "(6 numbers) and an even count"
            )
        if not points:
            continue
        # pycocotools rasterises a polygon edge by edge in C, sized by the coordinates: points far
        # outside the image make it allocate without bound or crash the process (SIGSEGV at 1e12).
        # Real annotations stray from the image by rounding only; one image size either side is lenient.
        xy = np.asarray(poly, dtype=np.float64).reshape(-1, 2)
        outside = (np.abs(xy - [width / 2, height / 2]) > [1.5 * width, 1.5 * height]).any(axis=1)
        if outside.any():
            x, y = xy[int(np.argmax(outside))]
            raise DatasetError(
                f"{ctx}: polygon {k} has the point ({x:g}, {y:g}), far outside the {width}x{height} image"
            )


def check_rle(rle: dict, height: int, width: int, ctx: str) -> None:
    """An RLE segmentation: its size is the image's, its runs cover the image exactly."""
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


def to_rle(segm: list | dict, height: int, width: int) -> dict:
    """A segmentation as one RLE, exactly as pycocotools' COCO.annToRLE makes it."""
    if isinstance(segm, list):
        return mask_utils.merge(mask_utils.frPyObjects(segm, height, width))
    if isinstance(segm["counts"], list):
        return mask_utils.frPyObjects(segm, height, width)
    return segm


def clipped_xyxy(bbox: list[float], width: int, height: int) -> tuple[float, float, float, float]:
    """COCO [x, y, w, h] -> [x1, y1, x2, y2] clipped to the image."""
    x, y, w, h = bbox
    return (
        min(max(x, 0.0), width),
        min(max(y, 0.0), height),
        min(max(x + w, 0.0), width),
        min(max(y + h, 0.0), height),
    )
