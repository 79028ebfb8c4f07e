"""torchvision's Matcher for a batch of images at once, with masks instead of indexing.

`match` gives, for every (image, prediction), the index of its ground-truth box, or BELOW_LOW_THRESHOLD
(-1) / BETWEEN_THRESHOLDS (-2), exactly as det_utils.Matcher does image by image, low-quality matches
included: for each ground-truth box, every prediction of the highest quality with it (ties included)
takes its best box even when that quality is low. Padding rows of ground truth take part in nothing;
an image without ground truth matches every prediction BELOW_LOW_THRESHOLD (torchvision's background
image). Nothing is read back to the host.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.models.detection._utils import Matcher

from .boxes import box_iou

BELOW_LOW_THRESHOLD = Matcher.BELOW_LOW_THRESHOLD
BETWEEN_THRESHOLDS = Matcher.BETWEEN_THRESHOLDS


def quality_matrix(gt_boxes: Tensor, gt_valid: Tensor, predictions: Tensor) -> Tensor:
    """(B, G, N) IoU of each image's ground truth with its predictions; padding rows of ground truth
    are -1, below any real quality, so they are never the best match."""
    quality = box_iou(gt_boxes, predictions)
    return torch.where(gt_valid[:, :, None], quality, -1.0)


def match(matcher: Matcher, quality: Tensor, gt_valid: Tensor) -> Tensor:
    """(B, N) int64 matches from the (B, G, N) `quality_matrix`, with `matcher`'s thresholds."""
    matched_vals, matches = quality.max(dim=1)
    all_matches = matches
    below = matched_vals < matcher.low_threshold
    between = (matched_vals >= matcher.low_threshold) & (matched_vals < matcher.high_threshold)
    matches = torch.where(below, BELOW_LOW_THRESHOLD, torch.where(between, BETWEEN_THRESHOLDS, matches))
    if matcher.allow_low_quality_matches:
        # set_low_quality_matches_: the predictions tied for the best quality of some real ground truth.
        best_per_gt = quality.max(dim=2, keepdim=True).values
        tied = ((quality == best_per_gt) & gt_valid[:, :, None]).any(dim=1)
        matches = torch.where(tied, all_matches, matches)
    return matches
