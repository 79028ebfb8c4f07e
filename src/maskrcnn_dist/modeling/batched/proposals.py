"""The RPN's proposals for a whole batch at once: RegionProposalNetwork.filter_proposals with
fixed-size tensors.

torchvision takes the top-k anchors per level (one batched topk: the same call here), then for each
image: clips the boxes, *drops* the small and the low-scoring ones (a data-dependent length), runs
`batched_nms` (levels apart), and keeps the best `post_nms_top_n`. Here the drops are a mask that the
NMS honours (a dropped box neither survives nor suppresses), the NMS is one call for the batch
(nms.py), and the best kept boxes of each image are the first rows of a (B, P, 4) tensor, its
unfilled rows padding (boxes.PAD). The kept set and its order equal torchvision's, to the bit: the
NMS sees the boxes torchvision's `batched_nms` sees (shifted apart by level with the image's largest
coordinate when the image has few boxes, as-is otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .boxes import PAD, clip_to_images, image_sizes_tensor
from .nms import Settling, segment_nms_mask

# torchvision's batched_nms shifts the boxes apart by group (one NMS call) up to this many box
# coordinates, and runs one NMS per group beyond it: the two differ in rounding.
COORDINATE_TRICK_LIMIT = {"cpu": 4000}
COORDINATE_TRICK_LIMIT_OTHER = 100_000


@dataclass(frozen=True)
class ProposalFilter:
    """The RPN's settings that choose proposals (those of its training mode, or of its eval mode)."""

    pre_nms_top_n: int
    post_nms_top_n: int
    nms_thresh: float
    score_thresh: float
    min_size: float


def top_per_level(logits: Tensor, anchors_per_level: list[int], k: int) -> tuple[Tensor, list[int]]:
    """(B, K) indices of the best `k` anchors of each level (RegionProposalNetwork._get_top_n_idx), and
    how many each level gave."""
    indices, taken, offset = [], [], 0
    for level in logits.split(anchors_per_level, dim=1):
        count = min(k, level.shape[1])
        indices.append(level.topk(count, dim=1).indices + offset)
        taken.append(count)
        offset += level.shape[1]
    return torch.cat(indices, dim=1), taken


def level_shifted(boxes: Tensor, valid: Tensor, levels: Tensor) -> Tensor:
    """The boxes torchvision's batched_nms hands to nms, per image: shifted by level x (the largest
    coordinate of the image's boxes + 1) when it has at most the coordinate trick's limit of
    coordinates, else as they are."""
    limit = COORDINATE_TRICK_LIMIT.get(boxes.device.type, COORDINATE_TRICK_LIMIT_OTHER)
    coordinates = valid.sum(dim=1) * 4
    masked = torch.where(valid[..., None], boxes, float("-inf"))
    largest = masked.amax(dim=(1, 2))
    largest = torch.where(coordinates > 0, largest, torch.zeros_like(largest))
    offsets = levels.to(boxes.dtype)[None, :] * (largest[:, None] + 1.0)
    shifted = boxes + offsets[..., None]
    return torch.where((coordinates <= limit)[:, None, None], shifted, boxes)


def select_proposals(
    boxes: Tensor,
    logits: Tensor,
    image_sizes: list[tuple[int, int]],
    anchors_per_level: list[int],
    settings: ProposalFilter,
    settling: Settling | None = None,
) -> Tensor:
    """(B, P, 4) proposals, best first, padding rows after them: what filter_proposals returns for each
    image of `boxes` (B, A, 4 decoded anchors) scored by `logits` (B, A, detached objectness)."""
    candidates, per_level = top_per_level(logits, anchors_per_level, settings.pre_nms_top_n)
    levels = torch.cat([torch.full((n,), i, device=boxes.device) for i, n in enumerate(per_level)])
    scores = torch.sigmoid(logits.gather(1, candidates))
    heights, widths = image_sizes_tensor(image_sizes, boxes)
    chosen = clip_to_images(boxes.gather(1, candidates[..., None].expand(-1, -1, 4)), heights, widths)
    # remove_small_boxes, then the score threshold (`>=`, as torchvision): a mask, honoured by the NMS.
    valid = (chosen[..., 2] - chosen[..., 0] >= settings.min_size) & (
        chosen[..., 3] - chosen[..., 1] >= settings.min_size
    )
    valid &= scores >= settings.score_thresh
    shifted = level_shifted(chosen, valid, levels)
    kept = segment_nms_mask(shifted, scores, valid, per_level, settings.nms_thresh, settling)
    # The kept boxes by falling score (ties in index order), the best post_nms_top_n of each image.
    count = min(settings.post_nms_top_n, chosen.shape[1])
    order = torch.sort(torch.where(kept, scores, -1.0), dim=1, descending=True, stable=True).indices[:, :count]
    best = chosen.gather(1, order[..., None].expand(-1, -1, 4))
    return torch.where(kept.gather(1, order)[..., None], best, PAD)
