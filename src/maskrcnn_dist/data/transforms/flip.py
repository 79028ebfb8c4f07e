"""--data-augmentation hflip: a training image and its target mirrored left-right, or not, by a hash of
(seed, epoch, index): no generator state to carry, so a resumed run and any number of loader workers
flip the same images."""

from __future__ import annotations

from typing import Any

import torch

from ...seeds import draw_seed
from .samples import EpochSamples, Target


def flip_decision(seed: int, epoch: int, index: int) -> bool:
    """Whether sample `index` is flipped in `epoch`: one bit of its draw."""
    return draw_seed(seed, epoch, index) & 0x80 == 0


def hflip(image: torch.Tensor, target: Target) -> tuple[torch.Tensor, Target]:
    """Mirror an image and its target left-right (boxes, masks)."""
    width = image.shape[-1]
    boxes = target["boxes"].clone()
    boxes[:, [0, 2]] = width - target["boxes"][:, [2, 0]]
    return image.flip(-1), {**target, "boxes": boxes, "masks": target["masks"].flip(-1)}


class Flipped(EpochSamples):
    """A dataset's samples, each flipped on flip_decision(seed, epoch, index). `uint8`: 8-bit images
    read as their bytes (a flip moves bytes: the same pixels as a float image's); the engines make them
    float on the device. Off where a later step computes on the pixels (copy-paste's blend)."""

    def __init__(self, dataset: Any, seed: int, uint8: bool = False) -> None:
        super().__init__(dataset, seed)
        self.uint8 = uint8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Target]:
        if not self.uint8:
            return super().__getitem__(index)
        image, target = self.dataset.sample(index, uint8=True)
        return self.transform(image, target, index % len(self))

    def transform(self, image: torch.Tensor, target: Target, index: int) -> tuple[torch.Tensor, Target]:
        if flip_decision(self.seed, self.epoch, index):
            image, target = hflip(image, target)
        return image, target
