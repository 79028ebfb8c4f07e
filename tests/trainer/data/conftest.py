"""Shared by the data tests: a one-category COCO set of small images written from records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from maskrcnn_dist.data import CocoInstanceDataset
from maskrcnn_dist.errors import DatasetError

W, H = 8, 6  # every test image is 8 wide, 6 high


def image_record(image_id: int, **extra: Any) -> dict[str, Any]:
    """An `images` entry: a W x H PNG named after its id."""
    return {"id": image_id, "file_name": f"{image_id}.png", "width": W, "height": H, **extra}


def annotation_record(ann_id: int, image_id: int = 1, category_id: int = 1, **extra: Any) -> dict[str, Any]:
    """An `annotations` entry: one rectangle, as its box and its polygon; `extra` replaces fields."""
    ann = {
        "id": ann_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": [1, 1, 4, 3],
        "segmentation": [[1, 1, 5, 1, 5, 4, 1, 4]],  # the same rectangle as the box
        "area": 12.0,
        "iscrowd": 0,
    }
    ann.update(extra)
    return ann


def write_set(
    tmp_path: Path,
    annotations: list[dict] | None = None,
    *,
    images: list[dict] | None = None,
    categories: list[dict] | None = None,
    mode: str = "RGB",
) -> tuple[Path, Path]:
    """Write a COCO JSON and one small PNG per image; return (image_dir, annotation_file)."""
    images = [image_record(1)] if images is None else images
    categories = [{"id": 1, "name": "thing"}] if categories is None else categories
    image_dir = tmp_path / "images"
    image_dir.mkdir(parents=True, exist_ok=True)
    for img in images:
        Image.new(mode, (img["width"], img["height"])).save(image_dir / img["file_name"])
    ann_file = tmp_path / "instances.json"
    data = {"images": images, "annotations": annotations or [], "categories": categories}
    ann_file.write_text(json.dumps(data))
    return image_dir, ann_file


def dataset_error(tmp_path: Path, annotations: list[dict], **kwargs: Any) -> str:
    """The message of the DatasetError that reading this set raises; it names the annotation file."""
    image_dir, ann_file = write_set(tmp_path, annotations, **kwargs)
    with pytest.raises(DatasetError) as info:
        CocoInstanceDataset(image_dir, ann_file)
    message = str(info.value)
    assert str(ann_file) in message
    return message
