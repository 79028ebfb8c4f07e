"""A deterministic synthetic COCO instance-segmentation set: coloured shapes on textured backgrounds.

Each class is one shape in one colour, so a small Mask R-CNN learns it in a few hundred steps. Masks
are exact: every object is painted through the very mask pycocotools decodes from its annotation,
and objects never overlap, so no mask covers a pixel of another object.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from pycocotools import mask as mask_utils

from ..config import TrainConfig
from ..errors import ConfigError
from ..run_dir import output_folder_problem
from .annotations.masks import decode_masks
from .sources import DataSources, SplitSource

log = logging.getLogger(__name__)

# (name, RGB) per class, in label order. Saturated colours, far from the grey-ish backgrounds.
CLASSES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("rectangle", (220, 40, 40)),
    ("ellipse", (40, 200, 60)),
    ("triangle", (50, 80, 230)),
    ("diamond", (230, 200, 30)),
    ("cross", (200, 50, 210)),
)
# Every 7th object is stored as RLE (alternating compressed/uncompressed), the rest as polygons.
_RLE_EVERY = 7


@dataclass(frozen=True)
class SyntheticCoco:
    """Where a generated split lives."""

    image_dir: Path
    annotation_file: Path
    num_images: int
    num_classes: int  # object classes, without the background


@dataclass(frozen=True)
class SyntheticSplits:
    train: SyntheticCoco
    val: SyntheticCoco


def generate_synthetic_coco(
    out_dir: Path,
    *,
    num_images: int,
    image_size: int | tuple[int, int] = 128,
    num_classes: int = 3,
    max_objects: int = 4,
    seed: int = 0,
    empty_fraction: float = 0.1,
    image_format: str = "png",
) -> SyntheticCoco:
    """Write `out_dir/images/*.png` and `out_dir/annotations.json`; same arguments, same bytes.

    `image_size` is one side length, or a (min, max) range drawn per side so aspect ratios vary.
    `round(empty_fraction * num_images)` images have no object. JPEG (`image_format="jpeg"`) is lossy:
    pixels near edges then differ a little from the masks.
    """
    _check_args(num_images, image_size, num_classes, max_objects, empty_fraction, image_format)
    out_dir = Path(out_dir)
    image_dir = out_dir / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lo, hi = (image_size, image_size) if isinstance(image_size, int) else image_size
    empty = set(rng.choice(num_images, size=round(empty_fraction * num_images), replace=False).tolist())
    suffix = "png" if image_format == "png" else "jpg"

    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i in range(num_images):
        width, height = (int(v) for v in rng.integers(lo, hi + 1, size=2))
        image_id = i + 1
        file_name = f"{image_id:06d}.{suffix}"
        pixels = _background(rng, height, width)
        n_objects = 0 if i in empty else int(rng.integers(1, max_objects + 1))
        for obj in _place_objects(rng, n_objects, num_classes, width, height):
            rle = _paint(pixels, obj, rng)
            if mask_utils.area(rle) == 0:  # a sliver that covers no pixel centre: not an object
                continue
            annotations.append(_annotation(len(annotations) + 1, image_id, obj, rle))
        _save(pixels, image_dir / file_name, image_format)
        images.append({"id": image_id, "file_name": file_name, "width": width, "height": height})

    categories = [{"id": k + 1, "name": CLASSES[k][0], "supercategory": "shape"} for k in range(num_classes)]
    dataset = {
        "info": {"description": f"maskrcnn-dist synthetic shapes, seed {seed}"},
        "images": images,
        "annotations": annotations,
        "categories": categories,
    }
    annotation_file = out_dir / "annotations.json"
    annotation_file.write_text(json.dumps(dataset, separators=(",", ":")))
    return SyntheticCoco(image_dir, annotation_file, num_images, num_classes)


def write_train_val(
    out_dir: Path,
    *,
    num_train: int,
    num_val: int,
    seed: int = 0,
    **options: Any,
) -> SyntheticSplits:
    """Generate `out_dir/train` and `out_dir/val` with independent seeds derived from `seed`.

    `options` are passed to `generate_synthetic_coco` (image_size, num_classes, max_objects, ...).
    """
    # Two independent streams: seed+1 for val would make val(seed) equal train(seed+1).
    train_seed, val_seed = (int(s) for s in np.random.SeedSequence(seed).generate_state(2))
    out_dir = Path(out_dir)
    return SyntheticSplits(
        train=generate_synthetic_coco(out_dir / "train", num_images=num_train, seed=train_seed, **options),
        val=generate_synthetic_coco(out_dir / "val", num_images=num_val, seed=val_seed, **options),
    )


def _check_args(
    num_images: int,
    image_size: int | tuple[int, int],
    num_classes: int,
    max_objects: int,
    empty_fraction: float,
    image_format: str,
) -> None:
    sizes = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if num_images < 1:
        raise ValueError(f"num_images must be >= 1, got {num_images}")
    if len(sizes) != 2 or not 32 <= sizes[0] <= sizes[1]:
        raise ValueError(f"image_size must be >= 32, or a (min, max) range with 32 <= min <= max: {image_size}")
    if not 1 <= num_classes <= len(CLASSES):
        raise ValueError(f"num_classes must be in 1..{len(CLASSES)}, got {num_classes}")
    if max_objects < 1:
        raise ValueError(f"max_objects must be >= 1, got {max_objects}")
    if not 0.0 <= empty_fraction <= 1.0:
        raise ValueError(f"empty_fraction must be in [0, 1], got {empty_fraction}")
    if image_format not in ("png", "jpeg"):
        raise ValueError(f"image_format must be 'png' or 'jpeg', got {image_format!r}")


@dataclass(frozen=True)
class _Object:
    label: int  # 0-based class index into CLASSES
    polygon: list[float]  # x1, y1, x2, y2, ... in pixels


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Grey-ish gradient between two random colours plus per-pixel noise, uint8 HxWx3."""
    c0, c1 = rng.uniform(70, 170, size=(2, 3))
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    t = (np.cos(angle) * xx / width + np.sin(angle) * yy / height + 1.0) / 2.0
    image = c0 + (c1 - c0) * t[:, :, None]
    image += rng.normal(0.0, 12.0, size=(height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


def _place_objects(rng: np.random.Generator, count: int, num_classes: int, width: int, height: int) -> list[_Object]:
    """Up to `count` objects whose boxes (plus a 2 px margin) do not overlap."""
    placed: list[tuple[float, float, float, float]] = []
    objects: list[_Object] = []
    short = min(width, height)
    for _ in range(count):
        for _attempt in range(20):
            w, h = rng.uniform(0.18, 0.45, size=2) * short
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            box = (x - 2, y - 2, x + w + 2, y + h + 2)
            if all(box[2] <= p[0] or p[2] <= box[0] or box[3] <= p[1] or p[3] <= box[1] for p in placed):
                break
        else:
            continue  # the image is full: fewer objects, not an endless loop
        placed.append(box)
        label = int(rng.integers(num_classes))
        objects.append(_Object(label, _shape_polygon(CLASSES[label][0], x, y, w, h, rng)))
    return objects


def _shape_polygon(shape: str, x: float, y: float, w: float, h: float, rng: np.random.Generator) -> list[float]:
    cx, cy = x + w / 2, y + h / 2
    if shape == "rectangle":
        points = [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]
    elif shape == "ellipse":
        angles = np.linspace(0, 2 * math.pi, 32, endpoint=False)
        points = list(zip(cx + w / 2 * np.cos(angles), cy + h / 2 * np.sin(angles), strict=True))
    elif shape == "triangle":
        apex = x + rng.uniform(0.2, 0.8) * w
        points = [(apex, y), (x + w, y + h), (x, y + h)]
    elif shape == "diamond":
        points = [(cx, y), (x + w, cy), (cx, y + h), (x, cy)]
    else:  # cross: a plus sign with arms a third of the box wide
        a, b = w / 3, h / 3
        points = [
            (x + a, y), (x + 2 * a, y), (x + 2 * a, y + b), (x + w, y + b), (x + w, y + 2 * b),
            (x + 2 * a, y + 2 * b), (x + 2 * a, y + h), (x + a, y + h), (x + a, y + 2 * b),
            (x, y + 2 * b), (x, y + b), (x + a, y + b),
        ]  # fmt: skip
    return [round(float(v), 2) for p in points for v in p]


def _paint(pixels: np.ndarray, obj: _Object, rng: np.random.Generator) -> dict:
    """Paint the object through its own decoded mask; return its compressed RLE."""
    height, width = pixels.shape[:2]
    rle = mask_utils.merge(mask_utils.frPyObjects([obj.polygon], height, width))
    mask = decode_masks(rle).astype(bool)
    colour = np.array(CLASSES[obj.label][1], dtype=np.float32) + rng.uniform(-15, 15, size=3)
    texture = rng.normal(0.0, 8.0, size=(int(mask.sum()), 3))
    pixels[mask] = np.clip(colour + texture, 0, 255).astype(np.uint8)
    return rle


def _annotation(ann_id: int, image_id: int, obj: _Object, rle: dict) -> dict[str, Any]:
    if ann_id % _RLE_EVERY:
        segmentation: Any = [obj.polygon]
    elif (ann_id // _RLE_EVERY) % 2:
        segmentation = {"size": rle["size"], "counts": rle["counts"].decode("ascii")}
    else:
        segmentation = {"size": rle["size"], "counts": _uncompressed_counts(decode_masks(rle))}
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": obj.label + 1,
        "segmentation": segmentation,
        # The box and area of the decoded mask, so box, mask and area agree to the pixel.
        "bbox": [float(v) for v in mask_utils.toBbox(rle)],
        "area": float(mask_utils.area(rle)),
        "iscrowd": 0,
    }


def _uncompressed_counts(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE: run lengths in column-major order, starting with a run of zeros."""
    flat = mask.flatten(order="F").astype(np.int8)
    changes = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], changes, [flat.size]])
    runs = np.diff(bounds).tolist()
    return runs if flat[0] == 0 else [0, *runs]


def _save(pixels: np.ndarray, path: Path, image_format: str) -> None:
    image = Image.fromarray(pixels)
    if image_format == "png":
        image.save(path, format="PNG", compress_level=1)  # fast; PNG bytes are deterministic
    else:
        image.save(path, format="JPEG", quality=95)


def synthetic_sources(root: Path) -> DataSources:
    """The splits of a set synth-data (or --synthetic-images) wrote."""
    return DataSources(
        "synthetic", {s: SplitSource(root / s / "annotations.json", root / s / "images") for s in ("train", "val")}
    )


def ensure_synthetic(cfg: TrainConfig) -> Path:
    """Generate the synthetic set once. Every rank may call this: the set is written to a private
    temporary folder and renamed into place, so concurrent ranks never see half a dataset."""
    root = cfg.data.data_path or (cfg.output_dir / "data")
    if (root / "train" / "annotations.json").is_file():
        return root
    flag = "--data-path" if cfg.data.data_path else "--output-dir"
    if problem := output_folder_problem(root, flag):
        raise ConfigError(problem)
    # The set is renamed into place whole: a folder with other files cannot take it (and must not be
    # mixed with it). The second look is for a rank that renamed its copy in between.
    if root.is_dir() and any(root.iterdir()) and not (root / "train" / "annotations.json").is_file():
        raise ConfigError(
            f"--synthetic-images: {root} holds other files but no synthetic set (train/annotations.json); "
            f"the set is written into a new or empty folder: give another {flag}"
        )
    # A name no other writer has: ranks on different hosts share the volume and can have the same PID
    # (each pod's first process), so a PID is not a private name there. (Not mkdtemp: its mode 0700
    # would reach the renamed set, which other users of the volume read.)
    tmp = root.with_name(f".{root.name}.tmp-{uuid.uuid4().hex}")
    n = cfg.data.synthetic_images
    write_train_val(
        tmp,
        num_train=n,
        num_val=max(4, n // 4),
        seed=cfg.seed,
        image_size=(int(cfg.data.synthetic_image_size * 0.75), cfg.data.synthetic_image_size),
    )
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(tmp, root)
    except OSError:  # another rank won the race; its copy is byte-identical
        shutil.rmtree(tmp, ignore_errors=True)
        if not (root / "train" / "annotations.json").is_file():
            raise
    log.info("synthetic COCO set with %d training images at %s", n, root)
    return root
