"""--data-augmentation hflip: a training image and its target mirrored left-right, or not, by a hash of
(seed, epoch, index): no generator state to carry, so a resumed run and any number of loader workers
flip the same images."""

from __future__ import annotations

import hashlib

import torch

from .samples import EpochSamples, Target


def flip_decision(seed: int, epoch: int, index: int) -> bool:
    """Whether sample `index` is flipped in `epoch`."""
    digest = hashlib.sha256(f"{seed}:{epoch}:{index}".encode()).digest()
    return digest[0] < 128


def hflip(image: torch.Tensor, target: Target) -> tuple[torch.Tensor, Target]:
    """Mirror an image and its target left-right (boxes, masks)."""
    width = image.shape[-1]
    boxes = target["boxes"].clone()
    boxes[:, [0, 2]] = width - target["boxes"][:, [2, 0]]
    return image.flip(-1), {**target, "boxes": boxes, "masks": target["masks"].flip(-1)}


class Flipped(EpochSamples):
    """A dataset's samples, each flipped on flip_decision(seed, epoch, index)."""

    def transform(self, image: torch.Tensor, target: Target, index: int) -> tuple[torch.Tensor, Target]:
        if flip_decision(self.seed, self.epoch, index):
            image, target = hflip(image, target)
        return image, target
