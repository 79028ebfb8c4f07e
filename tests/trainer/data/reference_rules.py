"""The annotation rules as the trainer stated them before they were one vectorised statement each
(data/annotations/rules.py): record by record, in file order. Kept here as the tests' reference: the
targets and ground truth a file gives (test_store.py), and the first refusal and its words for every
bad file (test_rules.py), must stay what these give."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pycocotools import mask as mask_utils

from maskrcnn_dist.data.annotations.image_names import image_file_name
from maskrcnn_dist.data.annotations.json_read import read_annotation_file
from maskrcnn_dist.data.annotations.mask_rules import compressed_rle_runs
from maskrcnn_dist.data.annotations.masks import to_rle
from maskrcnn_dist.data.annotations.rules import validate_categories
from maskrcnn_dist.errors import DatasetError

__all__ = ["clipped_xyxy", "read_annotation_file", "validate_annotations", "validate_categories", "validate_images"]

_REQUIRED_KEYS = ("images", "annotations", "categories")


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
        if not image_file_name(img):  # a file_name, else a URL's path (LVIS: coco_url alone)
            raise DatasetError(
                f"{ctx}: missing or empty 'file_name' (and no 'coco_url' or 'url' or 'image_url' to take it from)"
            )
        for key in ("width", "height"):
            if not _is_int(img.get(key)) or img[key] <= 0:
                raise DatasetError(f"{ctx}: {key!r} must be a positive integer, got {img.get(key)!r}")
        by_id[img["id"]] = img
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


def clipped_xyxy(bbox: list[float], width: int, height: int) -> tuple[float, float, float, float]:
    """COCO [x, y, w, h] -> [x1, y1, x2, y2] clipped to the image."""
    x, y, w, h = bbox
    return (
        min(max(x, 0.0), width),
        min(max(y, 0.0), height),
        min(max(x + w, 0.0), width),
        min(max(y + h, 0.0), height),
    )


def first_refusal(data: dict[str, Any], where: str) -> str | None:
    """The message of the first refusal of a COCO instances object as the record-by-record rules made it
    (json's read: every record in file order, then the points of the polygons kept, in the store's order:
    images by id, each one's annotations in file order), or None for a file they accept."""
    try:
        images = validate_images(data["images"], where)
        categories = validate_categories(data["categories"], where)
        kept, _ = validate_annotations(data["annotations"], images, categories, where, points_later=True)
        records = [images[iid] for iid in sorted(images)]  # the store's columns: numpy refuses what they cannot hold
        np.array(sorted(images), dtype=np.int64)
        for key in ("width", "height"):
            np.array([r[key] for r in records], dtype=np.int32)
        for key in ("id", "image_id", "category_id"):
            np.array([a[key] for a in kept], dtype=np.int64)
        _check_points_in_store_order(kept, images, where)
    except DatasetError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - as it was raised
        return f"{type(e).__name__}: {e}"
    return None


def _check_points_in_store_order(kept: list[dict], images: dict[int, dict], where: str) -> None:
    in_order = sorted(range(len(kept)), key=lambda k: kept[k]["image_id"])  # stable: file order within an image
    polygonal = [kept[k] for k in in_order if isinstance(kept[k]["segmentation"], list)]

    def ctx(ann: dict) -> str:
        return f"{where}: annotation id {ann['id']} (image id {ann['image_id']})"

    def check(ann: dict) -> None:
        img = images[ann["image_id"]]
        points = [np.asarray(p, dtype=np.float64).tolist() for p in ann["segmentation"]]
        check_polygons(points, img["height"], img["width"], ctx(ann))

    try:
        coords = [np.fromiter(iter(p), np.float64, len(p)) for ann in polygonal for p in ann["segmentation"]]
    except (TypeError, ValueError):  # a coordinate that is not a number: the first offender in the store's order
        for ann in polygonal:
            img = images[ann["image_id"]]
            check_polygons(ann["segmentation"], img["height"], img["width"], ctx(ann))
        raise
    owners = [ann for ann in polygonal for _ in ann["segmentation"]]
    finite = [bool(np.isfinite(c).all()) for c in coords]
    if not all(finite):
        check(owners[finite.index(False)])
    for ann in polygonal:
        check(ann)
