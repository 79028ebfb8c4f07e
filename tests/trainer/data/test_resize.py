"""Degenerate sizes (data/images/resize.py): the check computes each image's size after the model's resize exactly
as torchvision does, and refuses (or skips) one whose side would be 0 px, in every mode and in training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from maskrcnn_dist.data.images.check import CheckRules, ImageEntry, check_image
from maskrcnn_dist.data.images.resize import degenerate_size_reason, resized_size
from maskrcnn_dist.errors import DatasetError
from maskrcnn_dist.train import train

from ..conftest import fast_config
from .photos import OBJECT, SHOWN, encode, shown_photo, write_coco

THIN = "image is too thin for the model: 256x1 resizes to 96x0 at --min-size 96 --max-size 96 (a side of 0 px)"


def _torchvision_size(width: int, height: int, min_size: int, max_size: int) -> tuple[int, int]:
    transform = GeneralizedRCNNTransform(min_size, max_size, [0.0] * 3, [1.0] * 3).eval()
    images, _ = transform([torch.zeros(3, height, width)])
    (h, w) = images.image_sizes[0]
    return w, h


SIZES = [(256, 1), (1, 256), (97, 1), (3, 1000), (1, 1), (640, 480), (481, 640), (333, 777), (1000, 11), (37, 3)]


@pytest.mark.parametrize(("min_size", "max_size"), [(96, 96), (32, 64), (800, 1333), (100, 333)])
def test_the_resized_size_is_torchvisions(min_size: int, max_size: int):
    rng = np.random.default_rng(min_size)
    sizes = SIZES + [tuple(int(v) for v in rng.integers(1, 700, 2)) for _ in range(40)]
    for width, height in sizes:
        expected = None
        try:
            expected = _torchvision_size(width, height, min_size, max_size)
        except RuntimeError as exc:  # torch refuses an output side of 0
            assert "greater than 0" in str(exc)
        ours = resized_size(width, height, min_size, max_size)
        if expected is None:
            assert min(ours) == 0 and degenerate_size_reason(width, height, min_size, max_size), (width, height)
        else:
            assert ours == expected, (width, height)
            assert degenerate_size_reason(width, height, min_size, max_size) is None


def test_the_reason_names_the_sizes():
    assert degenerate_size_reason(256, 1, 96, 96) == THIN
    assert degenerate_size_reason(256, 1, 800, 1333) is None  # 1333x5: thin, but the model takes it


def _thin_png(path: Path) -> Path:
    Image.new("RGB", (256, 1), (10, 200, 30)).save(path)
    return path


@pytest.mark.parametrize("mode", ["header", "full", "off"])
def test_the_check_refuses_a_thin_image_in_every_mode(tmp_path: Path, mode: str):
    path = _thin_png(tmp_path / "thin.png")
    assert check_image(ImageEntry(1, path, 256, 1), CheckRules(mode, min_size=96, max_size=96)) == THIN
    assert not isinstance(check_image(ImageEntry(1, path, 256, 1), CheckRules(mode)), str)  # no model, no limit
    unannotated = check_image(ImageEntry(1, path), CheckRules(mode, min_size=96, max_size=96))  # predict's files
    assert unannotated == (None if mode == "off" else THIN)


def _set_with_a_thin_image(root: Path) -> Path:
    photo = encode(shown_photo(), "png-exif", 1)
    for split in ("train", "val"):
        thin = (root / split / "thin.png").parent
        thin.mkdir(parents=True)
        files = [(f"{i}.png", photo, SHOWN, OBJECT) for i in range(2)]
        # 96x1 stays 96x1 at 96 px: thin, but the model takes it (only a side of 0 px is refused)
        Image.new("RGB", (96, 1), (10, 200, 30)).save(thin / "line.png")
        files.append(("line.png", (thin / "line.png").read_bytes(), (96, 1), None))
        files.append(("thin.png", _thin_png(thin / "thin.png").read_bytes(), (256, 1), None))
        write_coco(root / split, files)
    return root


@pytest.mark.slow
def test_training_refuses_or_skips_a_thin_image(tmp_path: Path):
    data = _set_with_a_thin_image(tmp_path / "data")
    cfg = fast_config(data, tmp_path / "run", **{"max-steps": 1})
    with pytest.raises(DatasetError, match=r"1 of 4 images are bad: .*thin.png \(image id 4\): ") as info:
        train(cfg)
    assert THIN in str(info.value)
    # The thin image skipped, every other one trained on (one epoch of 2 steps), even with --check-data off.
    skipping = fast_config(data, tmp_path / "run2", **{"skip-bad-images": True, "check-data": "off"})
    result = train(skipping)
    assert result is not None and result.position.step == 2
