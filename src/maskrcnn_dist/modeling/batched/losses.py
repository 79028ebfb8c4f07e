"""torchvision's RPN, Fast R-CNN and Mask R-CNN losses over masked fixed-size tensors.

Each loss is torchvision's: a mean over the sampled rows, or a sum over the positive ones divided by
the number of sampled rows. Here the rows that torchvision would index out are masked instead (their
terms are zero, and so are their gradients), and the divisors are masks' sums on the device. Where a
masked row's target is not finite (the regression target of a row with no real box) it is replaced
before the loss, so that no NaN reaches the gradient through a zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

BOX_LOSS_BETA = 1 / 9  # torchvision's smooth L1 for box regression, RPN and RoI heads alike


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, values, torch.zeros_like(values)).sum()


def rpn_loss(
    logits: Tensor, deltas: Tensor, labels: Tensor, targets: Tensor, positive: Tensor, negative: Tensor
) -> tuple[Tensor, Tensor]:
    """RegionProposalNetwork.compute_loss: `logits` (B, A), `deltas` and `targets` (B, A, 4), `labels`
    (B, A) 0/1, the sampled `positive` / `negative` (B, A) masks."""
    sampled = positive | negative
    count = sampled.sum()
    objectness = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    safe_targets = torch.where(positive[..., None], targets, torch.zeros_like(targets))
    box = F.smooth_l1_loss(deltas, safe_targets, beta=BOX_LOSS_BETA, reduction="none").sum(dim=-1)
    return masked_sum(objectness, sampled) / count, masked_sum(box, positive) / count


def fastrcnn_loss(
    class_logits: Tensor, box_regression: Tensor, labels: Tensor, targets: Tensor, real: Tensor
) -> tuple[Tensor, Tensor]:
    """roi_heads.fastrcnn_loss over R rows of which `real` (R,) hold a sampled proposal: `labels` (R,)
    int64, `box_regression` (R, classes * 4), `targets` (R, 4)."""
    count = real.sum()
    safe_labels = torch.where(real, labels, torch.zeros_like(labels))
    classification = masked_sum(F.cross_entropy(class_logits, safe_labels, reduction="none"), real) / count
    positive = real & (labels > 0)
    per_class = box_regression.reshape(box_regression.shape[0], -1, 4)
    predicted = per_class.gather(1, safe_labels[:, None, None].expand(-1, 1, 4))[:, 0]
    safe_targets = torch.where(positive[:, None], targets, torch.zeros_like(targets))
    box = F.smooth_l1_loss(predicted, safe_targets, beta=BOX_LOSS_BETA, reduction="none").sum(dim=-1)
    return classification, masked_sum(box, positive) / count


def mask_loss(mask_logits: Tensor, labels: Tensor, mask_targets: Tensor, real: Tensor) -> Tensor:
    """roi_heads.maskrcnn_loss over R rows of which `real` (R,) hold a positive proposal: the logits of
    each row's class (R, classes, M, M) against its target (R, M, M); zero without any."""
    safe_labels = torch.where(real, labels, torch.zeros_like(labels))
    logits = mask_logits.gather(1, safe_labels[:, None, None, None].expand(-1, 1, *mask_logits.shape[2:]))[:, 0]
    per_pixel = F.binary_cross_entropy_with_logits(logits, mask_targets, reduction="none")
    cells = real.sum() * mask_targets.shape[-1] * mask_targets.shape[-2]
    return masked_sum(per_pixel, real[:, None, None]) / cells.clamp(min=1)
