"""--use-copypaste: torchvision's references' SimpleCopyPaste, written to their documented behaviour.

Batch level, after lsj (which gives every image of the batch the same size, as the references require):
image i receives a random subset of the objects of image i - 1 (the batch rolled by one). The pasted
pixels cover the image under the union of the pasted masks (its edge blended with a 5 x 5 Gaussian of
sigma 2, as the references do); the image's own masks lose what was pasted over them, an object left
with no pixel is dropped, and the boxes of those kept are recomputed from their masks. Every box here
bounds the pixels its mask covers (x2, y2 one past the last pixel, as the dataset's boxes).

The subset is drawn from torch's generator seeded by (seed, epoch, receiving image id), so a resumed run
and any number of loader workers paste the same objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torchvision.ops import masks_to_boxes

from ...seeds import draw_seed
from ..loader import Batch, collate

__all__ = ["CopyPaste", "blend_weights", "copy_paste"]

Target = dict[str, Any]


def _boxes_of(masks: torch.Tensor) -> torch.Tensor:
    """Boxes bounding each mask's pixels, x2/y2 exclusive."""
    if len(masks) == 0:
        return torch.zeros((0, 4), dtype=torch.float32)
    boxes = masks_to_boxes(masks)
    boxes[:, 2:] += 1
    return boxes


BLUR_KERNEL, BLUR_SIGMA = 5, 2.0  # the references' blending
# Zeros around the pasted pixels that the blur's reflecting border must see to give what it gives on the
# whole image: twice its reach.
BLUR_MARGIN = 2 * (BLUR_KERNEL // 2)


def blend_weights(covered: torch.Tensor) -> torch.Tensor:
    """The references' blending weights: the pasted pixels (a [H, W] bool) blurred with a 5 x 5 Gaussian of
    sigma 2. Blurred around those pixels only (the rest stays 0): the same numbers, at a fraction of the
    cost of blurring a 1024 x 1024 square."""
    alpha = torch.zeros(covered.shape, dtype=torch.float32)
    rows, cols = covered.any(1).nonzero(), covered.any(0).nonzero()
    if len(rows) == 0:
        return alpha
    top, bottom = max(0, int(rows[0]) - BLUR_MARGIN), min(covered.shape[0], int(rows[-1]) + 1 + BLUR_MARGIN)
    left, right = max(0, int(cols[0]) - BLUR_MARGIN), min(covered.shape[1], int(cols[-1]) + 1 + BLUR_MARGIN)
    window = covered[None, None, top:bottom, left:right].float()
    alpha[top:bottom, left:right] = _separable_blur(window)[0, 0]
    return alpha


def _separable_blur(image: torch.Tensor) -> torch.Tensor:
    """torchvision's gaussian_blur (reflecting border) of a [1, 1, H, W] image as two 1-D passes: the 2-D
    Gaussian kernel is the outer product of the 1-D ones, so the same numbers for a fifth of the work."""
    half = BLUR_KERNEL // 2
    x = torch.linspace(-half, half, BLUR_KERNEL)
    kernel = torch.exp(-0.5 * (x / BLUR_SIGMA) ** 2)
    kernel = kernel / kernel.sum()
    padded = torch.nn.functional.pad(image, [half, half, half, half], mode="reflect")
    rows = torch.nn.functional.conv2d(padded, kernel.view(1, 1, 1, -1))
    return torch.nn.functional.conv2d(rows, kernel.view(1, 1, -1, 1))


def copy_paste(
    image: torch.Tensor, target: Target, source: torch.Tensor, source_target: Target, generator: torch.Generator
) -> tuple[torch.Tensor, Target]:
    """`image` with a random subset of `source`'s objects pasted on top (both of one size)."""
    count = len(source_target["masks"])
    if count == 0:  # lsj can crop every object away
        return image, target
    if image.shape != source.shape:
        raise ValueError(
            f"copy-paste needs images of one size (lsj), got {tuple(image.shape)} and {tuple(source.shape)}"
        )
    # The references' draw: `count` picks with repetition, each object kept once.
    chosen = torch.unique(torch.randint(0, count, (count,), generator=generator))
    pasted_masks = source_target["masks"][chosen]
    covered = pasted_masks.bool().any(0)  # (any() of uint8 masks is uint8, whose ~ is not "not")
    alpha = blend_weights(covered)
    blended = image * (1 - alpha) + source * alpha
    own = target["masks"] * ~covered
    kept = own.flatten(1).bool().any(1)
    masks = torch.cat([own[kept], pasted_masks])
    out = {
        **target,
        "masks": masks,
        "boxes": torch.cat([_boxes_of(own[kept]), source_target["boxes"][chosen]]),
        "labels": torch.cat([target["labels"][kept], source_target["labels"][chosen]]),
        "area": masks.flatten(1).sum(1, dtype=torch.int32).to(torch.float32),
        "iscrowd": torch.zeros((len(masks),), dtype=torch.int64),
    }
    return blended, out


@dataclass(frozen=True)
class CopyPaste:
    """The training loader's collate with copy-paste: picklable, so that loader workers can run it."""

    seed: int
    epoch: int

    def __call__(self, batch: Sequence[tuple[torch.Tensor, Target]]) -> Batch:
        images, targets = collate(batch)
        sources = list(zip(images[-1:] + images[:-1], targets[-1:] + targets[:-1], strict=True))
        out_images, out_targets = [], []
        for image, target, (source, source_target) in zip(images, targets, sources, strict=True):
            generator = torch.Generator().manual_seed(draw_seed(self.seed, self.epoch, target["image_id"], "paste"))
            pasted_image, pasted = copy_paste(image, target, source, source_target, generator)
            out_images.append(pasted_image)
            out_targets.append(pasted)
        return out_images, out_targets
