"""torchvision's BalancedPositiveNegativeSampler for a batch of images at once, with no `nonzero`.

Per image it takes num_pos = min(positives, int(batch_size_per_image * positive_fraction)) positives
and num_neg = min(negatives, batch_size_per_image - num_pos) negatives, uniformly at random: exactly
torchvision's counts. The counts are masks' sums on the device; the draw gives every candidate a
uniform random key and takes the num_pos (num_neg) largest keys among the positives (negatives), with
`topk` over a fixed number of columns, so no shape depends on the data. The keys come from the global
generator on the device, which StepSeeder reseeds before each random module (modeling/rng.py): a run
draws the same samples on every repeat, though not torchvision's (which draws `randperm`s).
"""

from __future__ import annotations

import torch
from torch import Tensor


def take_largest(keys: Tensor, eligible: Tensor, counts: Tensor, most: int) -> Tensor:
    """(B, N) bool: in each row, the `counts[b]` eligible entries with the largest keys (`counts[b]` at
    most the row's eligible entries, and at most `most`)."""
    k = min(most, keys.shape[1])
    top = torch.where(eligible, keys, -1.0).topk(k, dim=1).indices
    chosen = torch.arange(k, device=keys.device)[None, :] < counts[:, None]
    return torch.zeros_like(eligible).scatter(1, top, chosen)


def sample(labels: Tensor, batch_size_per_image: int, positive_fraction: float) -> tuple[Tensor, Tensor]:
    """(B, N) labels (>= 1 positive, 0 negative, -1 neither) -> (positive, negative) (B, N) bool masks."""
    positive = labels >= 1
    negative = labels == 0
    positive_cap = int(batch_size_per_image * positive_fraction)
    num_pos = positive.sum(dim=1).clamp(max=positive_cap)
    num_neg = torch.minimum(negative.sum(dim=1), batch_size_per_image - num_pos)
    keys = torch.rand(labels.shape, device=labels.device)
    return (
        take_largest(keys, positive, num_pos, positive_cap),
        take_largest(keys, negative, num_neg, batch_size_per_image),
    )
