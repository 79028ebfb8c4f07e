"""--data-augmentation multiscale|lsj: torchvision's detection references' presets on transforms.v2 (image,
boxes and masks together), sized by --min-size / 800; the model keeps the sizes they give (`_skip_resize`).
Each image draws from seeds.draw_seed(seed, epoch, index, "augment") inside `fork_rng`: a resumed run and
any number of loader workers see the same augmentations, and nothing else's random numbers move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from ...seeds import draw_seed
from .samples import EpochSamples

__all__ = [
    "AugmentedDataset",
    "Augmentation",
    "augment_batch",
    "FixedSizeCrop",
    "build_augmentation",
    "lsj_side",
    "multiscale_sides",
]

REFERENCE_MIN_SIZE = 800  # the model size the references' numbers below are for
MULTISCALE_SHORT_SIDES = tuple(range(480, 801, 32))  # references/detection/presets.py
LSJ_SIDE = 1024
LSJ_SCALE_RANGE = (0.1, 2.0)
# The references pad with their mean colour (uint8 RGB); images here are floats in [0, 1].
PAD_FILL = (123.0 / 255, 117.0 / 255, 104.0 / 255)

Target = dict[str, Any]


def multiscale_sides(min_size: int) -> list[int]:
    """The short sides multiscale draws from at the model's --min-size."""
    scaled = (max(1, round(side * min_size / REFERENCE_MIN_SIZE)) for side in MULTISCALE_SHORT_SIDES)
    return list(dict.fromkeys(scaled))


def lsj_side(min_size: int) -> int:
    """The square lsj crops and pads every image to at the model's --min-size."""
    return max(1, round(LSJ_SIDE * min_size / REFERENCE_MIN_SIZE))


class ScaleJitter(v2.ScaleJitter):
    """v2.ScaleJitter, never to a side of 0 px. The data check refuses only images the model's own resize
    would empty; jitter down to 0.1 x can empty a side of a thinner one (a 2000 x 3 image at
    0.1 x 1024 / 2000), and torch would stop the run. (multiscale cannot: its scale is at most the
    model's where --max-size bounds it, and leaves a short side of 480 x --min-size / 800 where not.)"""

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        params = super().make_params(flat_inputs)
        return {**params, "size": tuple(max(1, side) for side in params["size"])}


class FixedSizeCrop(v2.Transform):
    """The references' fixed-size crop: an image larger than `size` (height, width) is cropped to it at
    one random fraction r of the slack, the same r down and across (the references' draw); one smaller
    is padded right and bottom to it with `fill` (masks with 0). Boxes move with the pixels and are
    clipped to the crop (SanitizeBoundingBoxes after it drops those cropped away)."""

    def __init__(self, size: tuple[int, int], fill: tuple[float, ...] = PAD_FILL) -> None:
        super().__init__()
        self.size = size
        self.fill = fill

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        height, width = v2.query_size(flat_inputs)
        crop_height, crop_width = min(height, self.size[0]), min(width, self.size[1])
        r = float(torch.rand(1)) if (crop_height, crop_width) != (height, width) else 0.0
        return {
            "top": int(max(height - self.size[0], 0) * r),
            "left": int(max(width - self.size[1], 0) * r),
            "height": crop_height,
            "width": crop_width,
            "padding": [0, 0, self.size[1] - crop_width, self.size[0] - crop_height],
        }

    def transform(self, inpt: Any, params: dict[str, Any]) -> Any:
        cropped = self._call_kernel(F.crop, inpt, params["top"], params["left"], params["height"], params["width"])
        fill = list(self.fill) if isinstance(inpt, tv_tensors.Image) else 0
        return self._call_kernel(F.pad, cropped, padding=params["padding"], fill=fill)


def build_transform(name: str, min_size: int, max_size: int) -> v2.Compose:
    """The references' composition for `name` at the model's sizes, then a horizontal flip: multiscale draws
    a short side from 480, 512, ..., 800 (long side at most --max-size); lsj jitters to a square (scale
    0.1-2.0), crops to it and pads right and bottom with the references' mean colour (every image leaves
    with the same size). SanitizeBoundingBoxes then drops a box cropped to under a pixel with its mask and
    label; an image left without objects still trains."""
    if name == "multiscale":
        resize: list[v2.Transform] = [v2.RandomShortestSize(multiscale_sides(min_size), max_size=max_size)]
    elif name == "lsj":
        side = lsj_side(min_size)
        resize = [ScaleJitter((side, side), scale_range=LSJ_SCALE_RANGE), FixedSizeCrop((side, side))]
    else:
        raise ValueError(f"no transform for data augmentation {name!r}")
    return v2.Compose([*resize, v2.RandomHorizontalFlip(0.5), v2.SanitizeBoundingBoxes()])


@dataclass(frozen=True)
class Augmentation:
    """One augmentation of a training image and its target, drawn from (seed, epoch, index)."""

    name: str
    transform: v2.Compose

    def __call__(self, image: torch.Tensor, target: Target, seed: int, epoch: int, index: int) -> tuple:
        boxes = tv_tensors.BoundingBoxes(target["boxes"], format="XYXY", canvas_size=tuple(image.shape[-2:]))
        inputs = {"boxes": boxes, "masks": tv_tensors.Mask(target["masks"]), "labels": target["labels"]}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(draw_seed(seed, epoch, index, "augment"))
            out_image, out = self.transform(tv_tensors.Image(image), inputs)
        masks = out["masks"].as_subclass(torch.Tensor)
        return out_image.as_subclass(torch.Tensor), {
            **target,
            "boxes": out["boxes"].as_subclass(torch.Tensor),
            "masks": masks,
            "labels": out["labels"],
            # The annotation's area no longer describes the object; the references' copy-paste counts pixels too.
            "area": masks.sum((-1, -2)).to(torch.float32),
            "iscrowd": torch.zeros((len(masks),), dtype=torch.int64),
        }


def build_augmentation(name: str, min_size: int, max_size: int) -> Augmentation | None:
    """The augmentation --data-augmentation `name` adds to the dataset, or None for hflip (transforms/flip.py)."""
    if name == "hflip":
        return None
    return Augmentation(name, build_transform(name, min_size, max_size))


def augment_batch(
    augmentation: Augmentation | None, images: list[torch.Tensor], targets: list[Target], seed: int
) -> tuple[list[torch.Tensor], list[Target]]:
    """A batch as the first epoch's training would see it (image i drawn as index i): what `profile`
    measures. None (hflip) leaves it as it is: a flip changes no cost."""
    if augmentation is None:
        return images, targets
    pairs = [augmentation(image, target, seed, 0, i) for i, (image, target) in enumerate(zip(images, targets))]
    return [image for image, _ in pairs], [target for _, target in pairs]


class AugmentedDataset(EpochSamples):
    """A training dataset's samples through `augmentation` (which flips on its own draw)."""

    def __init__(self, dataset: Any, augmentation: Augmentation, seed: int) -> None:
        super().__init__(dataset, seed)
        self.augmentation = augmentation

    def transform(self, image: torch.Tensor, target: Target, index: int) -> tuple[torch.Tensor, Target]:
        return self.augmentation(image, target, self.seed, self.epoch, index)
