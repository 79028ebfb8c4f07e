"""Which (image, candidate) pairs a head computes: a fixed-size set of rows, or an exact one.

The RoI heads run on the sampled proposals (box head) and on their positives (mask head): a number
per image that only the device knows. Two ways to lay those out:
- `padded`: each image gets a fixed number of rows (the sampler's most), its picks first, in
  candidate order; the rest are padding, masked in the losses. No host wait, but the heads compute
  the padding rows too.
- `compact`: one host read per step learns how many picks the whole batch has; the rows are exactly
  those, image after image, in candidate order: what torchvision's heads see, so BatchNorm in a head
  sees torchvision's batch, and no row is computed in vain.
Either way the picks are found by a stable sort of a mask, never `nonzero`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

LAYOUTS = ("compact", "padded")


@dataclass(frozen=True)
class Rows:
    """R rows over a (B, N) grid of candidates: row r is candidate `index[r]` of image `images[r]`;
    `real[r]` is False for a padding row."""

    images: Tensor
    index: Tensor
    real: Tensor

    def take(self, values: Tensor) -> Tensor:
        """(B, N, ...) -> (R, ...): each row's entry."""
        return values[self.images, self.index]


def first_picks(picked: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """Along the last axis of a bool tensor: the positions of its first `count` True entries, in order,
    and whether each is a real pick (False where fewer are True)."""
    order = torch.sort((~picked).to(torch.uint8), dim=-1, stable=True).indices[..., :count]
    return order, picked.gather(-1, order)


def padded_rows(picked: Tensor, per_image: int) -> Rows:
    """`per_image` rows for every image of the (B, N) `picked` mask (at most N)."""
    batch, n = picked.shape
    index, real = first_picks(picked, min(per_image, n))
    images = torch.arange(batch, device=picked.device)[:, None].expand_as(index)
    return Rows(images.flatten(), index.flatten(), real.flatten())


def compact_rows(picked: Tensor, count: int) -> Rows:
    """The `count` picks of the (B, N) mask (its total: the caller read it), image after image."""
    n = picked.shape[1]
    flat, real = first_picks(picked.flatten(), count)
    return Rows(flat // n, flat % n, real)
