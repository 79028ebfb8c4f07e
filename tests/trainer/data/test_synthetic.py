"""Synthetic COCO generator: determinism, exact masks, both RLE kinds, empty images, speed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as mask_utils

from maskrcnn_dist.data import CocoInstanceDataset, generate_synthetic_coco, write_train_val
from maskrcnn_dist.data.annotations.masks import decode_masks
from maskrcnn_dist.data.synthetic import CLASSES


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_different_seed_different(tmp_path: Path) -> None:
    options = {"num_images": 6, "image_size": (48, 80), "max_objects": 4, "empty_fraction": 0.2}
    generate_synthetic_coco(tmp_path / "a", seed=1, **options)
    generate_synthetic_coco(tmp_path / "b", seed=1, **options)
    generate_synthetic_coco(tmp_path / "c", seed=2, **options)
    a, b, c = _files(tmp_path / "a"), _files(tmp_path / "b"), _files(tmp_path / "c")
    assert len(a) == 7 and a == b
    assert a["annotations.json"] != c["annotations.json"]
    assert any(a[name] != c.get(name) for name in a if name.endswith(".png"))


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("synthetic")
    return generate_synthetic_coco(
        root, num_images=20, image_size=(48, 96), num_classes=5, max_objects=5, seed=7, empty_fraction=0.25
    )


def test_annotations_are_exact_and_both_rle_kinds_appear(synthetic) -> None:
    data = json.loads(synthetic.annotation_file.read_text())
    kinds = {_kind(a["segmentation"]) for a in data["annotations"]}
    assert kinds == {"polygon", "compressed", "uncompressed"}
    sizes = {i["id"]: (i["height"], i["width"]) for i in data["images"]}
    for ann in data["annotations"]:
        h, w = sizes[ann["image_id"]]
        rle = _rle(ann["segmentation"], h, w)
        mask = decode_masks(rle)
        ys, xs = np.nonzero(mask)
        assert ann["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
        assert ann["area"] == mask.sum() > 0


def test_pixels_under_each_mask_have_the_class_colour(synthetic) -> None:
    dataset = CocoInstanceDataset(synthetic.image_dir, synthetic.annotation_file)
    checked = 0
    for idx in range(len(dataset)):
        image, target = dataset[idx]
        pixels = (image * 255).permute(1, 2, 0).numpy()
        for mask, label in zip(target["masks"], target["labels"], strict=True):
            inside = pixels[mask.numpy().astype(bool)]
            colour = np.array(CLASSES[label - 1][1])
            assert np.abs(inside.mean(axis=0) - colour).max() < 20
            assert np.abs(inside - colour).max() < 60  # every pixel, not just most: the mask is exact
            checked += 1
    assert checked > 10


def test_empty_images_and_varied_aspect_ratios(synthetic) -> None:
    data = json.loads(synthetic.annotation_file.read_text())
    with_objects = {a["image_id"] for a in data["annotations"]}
    assert len(data["images"]) - len(with_objects) == 5  # round(0.25 * 20)
    dataset = CocoInstanceDataset(synthetic.image_dir, synthetic.annotation_file)
    assert dataset.num_classes == 6 and len(dataset) == 20
    assert len(set(dataset.aspect_ratios())) > 5
    with Image.open(synthetic.image_dir / data["images"][0]["file_name"]) as im:
        assert im.format == "PNG" and im.size == (data["images"][0]["width"], data["images"][0]["height"])


def test_train_val_splits_differ(tmp_path: Path) -> None:
    splits = write_train_val(tmp_path, num_train=4, num_val=3, seed=0, image_size=48, max_objects=2)
    assert splits.train.image_dir == tmp_path / "train" / "images"
    assert len(CocoInstanceDataset(splits.val.image_dir, splits.val.annotation_file)) == 3
    train = (splits.train.image_dir / "000001.png").read_bytes()
    assert train != (splits.val.image_dir / "000001.png").read_bytes()


def test_jpeg_output(tmp_path: Path) -> None:
    out = generate_synthetic_coco(tmp_path, num_images=2, image_size=48, seed=0, image_format="jpeg")
    image, _ = CocoInstanceDataset(out.image_dir, out.annotation_file)[0]
    assert image.shape[0] == 3 and (out.image_dir / "000001.jpg").is_file()


@pytest.mark.parametrize(
    "bad", [{"num_images": 0}, {"num_classes": 6}, {"image_size": (64, 32)}, {"empty_fraction": 1.5}]
)
def test_bad_arguments(tmp_path: Path, bad: dict) -> None:
    with pytest.raises(ValueError):
        generate_synthetic_coco(tmp_path, **{"num_images": 2, **bad})


def _kind(segmentation: list | dict) -> str:
    if isinstance(segmentation, list):
        return "polygon"
    return "uncompressed" if isinstance(segmentation["counts"], list) else "compressed"


def _rle(segmentation: list | dict, h: int, w: int) -> dict:
    if isinstance(segmentation, list):
        return mask_utils.merge(mask_utils.frPyObjects(segmentation, h, w))
    if isinstance(segmentation["counts"], list):
        return mask_utils.frPyObjects(segmentation, h, w)
    return segmentation


def test_ranks_on_other_hosts_with_the_same_pid_do_not_share_a_temporary_folder(tmp_path: Path) -> None:
    """Pods share the volume and each pod's first process often has the same PID: the synthetic set is
    written under a name no other writer has, and nobody else's unfinished folder is touched."""
    from maskrcnn_dist.data.synthetic import ensure_synthetic

    from ..conftest import fast_config

    root = tmp_path / "data"
    other_host = tmp_path / f".data.tmp-{os.getpid()}"  # the same PID on another host, mid-write
    (other_host / "train").mkdir(parents=True)
    (other_host / "train" / "annotations.json").write_text("{}")
    cfg = fast_config(root, tmp_path / "run", **{"synthetic-images": 4, "synthetic-image-size": 64})
    assert ensure_synthetic(cfg) == root
    assert (root / "train" / "annotations.json").is_file()
    assert (other_host / "train" / "annotations.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == [other_host.name]
