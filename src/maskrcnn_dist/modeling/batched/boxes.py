"""Box arithmetic on padded batches, in torchvision's own arithmetic, and the padding convention.

A batch of per-image box sets travels as one (B, N, 4) tensor; the rows an image does not fill are
*padding*. Proposals mark theirs in-band with NaN coordinates (`PAD`), so that they keep
torchvision's type (a list of (N, 4) tensors, one per image) across the pipeline's stages; ground
truth carries a separate `valid` mask. Every function here computes each element exactly as
torchvision's per-image code does (the same operations in the same order), so a batched result
equals torchvision's bit for bit; none of them reads a value back to the host, and none builds a
tensor from Python data on the device (a blocking copy, which a GPU step waits for).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

PAD = float("nan")  # the coordinates of a proposal row that holds no proposal
BBOX_XFORM_CLIP = math.log(1000.0 / 16)  # torchvision's BoxCoder default


def is_real(boxes: Tensor) -> Tensor:
    """(..., 4) -> (...) bool: the rows that hold a box, not padding."""
    return ~torch.isnan(boxes[..., 0])


def stand_in(boxes: Tensor, real: Tensor) -> Tensor:
    """(R, 4) boxes with the padding rows (`real` False) replaced by (0, 0, 1, 1): something roi_align and
    the level mapper can read (a NaN box would sample outside the maps), for the caller to ignore."""
    return torch.where(real[:, None], boxes, torch.cat((boxes.new_zeros(2), boxes.new_ones(2))))


def box_iou(boxes1: Tensor, boxes2: Tensor) -> Tensor:
    """(..., N, 4) x (..., M, 4) -> (..., N, M): torchvision.ops.box_iou over leading batch dimensions."""
    area1 = (boxes1[..., 2] - boxes1[..., 0]) * (boxes1[..., 3] - boxes1[..., 1])
    area2 = (boxes2[..., 2] - boxes2[..., 0]) * (boxes2[..., 3] - boxes2[..., 1])
    lt = torch.max(boxes1[..., None, :2], boxes2[..., None, :, :2])
    rb = torch.min(boxes1[..., None, 2:], boxes2[..., None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area1[..., None] + area2[..., None, :] - inter
    return inter / union


def clip_to_images(boxes: Tensor, heights: Tensor, widths: Tensor) -> Tensor:
    """(B, N, 4) clipped to each image's (height, width) (B,) tensors: box_ops.clip_boxes_to_image."""
    x = torch.minimum(boxes[..., 0::2].clamp(min=0), widths[:, None, None])
    y = torch.minimum(boxes[..., 1::2].clamp(min=0), heights[:, None, None])
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def decode(rel_codes: Tensor, boxes: Tensor, weights: tuple[float, float, float, float]) -> Tensor:
    """BoxCoder.decode_single: (N, 4) deltas applied to (N, 4) reference boxes (rows broadcast)."""
    boxes = boxes.to(rel_codes.dtype)
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    ctr_x = boxes[:, 0] + 0.5 * widths
    ctr_y = boxes[:, 1] + 0.5 * heights
    wx, wy, ww, wh = weights
    dx = rel_codes[:, 0::4] / wx
    dy = rel_codes[:, 1::4] / wy
    dw = torch.clamp(rel_codes[:, 2::4] / ww, max=BBOX_XFORM_CLIP)
    dh = torch.clamp(rel_codes[:, 3::4] / wh, max=BBOX_XFORM_CLIP)
    pred_ctr_x = dx * widths[:, None] + ctr_x[:, None]
    pred_ctr_y = dy * heights[:, None] + ctr_y[:, None]
    pred_w = torch.exp(dw) * widths[:, None]
    pred_h = torch.exp(dh) * heights[:, None]
    half_w = 0.5 * pred_w  # torchvision multiplies by a 0-d tensor of 0.5: the same product
    half_h = 0.5 * pred_h
    corners = (pred_ctr_x - half_w, pred_ctr_y - half_h, pred_ctr_x + half_w, pred_ctr_y + half_h)
    return torch.stack(corners, dim=2).flatten(1)


def encode(reference_boxes: Tensor, proposals: Tensor, weights: tuple[float, float, float, float]) -> Tensor:
    """BoxCoder.encode_single (torchvision's encode_boxes): the deltas that take (N, 4) `proposals` to
    (N, 4) `reference_boxes`."""
    wx, wy, ww, wh = weights
    ex_widths = proposals[:, 2:3] - proposals[:, 0:1]
    ex_heights = proposals[:, 3:4] - proposals[:, 1:2]
    ex_ctr_x = proposals[:, 0:1] + 0.5 * ex_widths
    ex_ctr_y = proposals[:, 1:2] + 0.5 * ex_heights
    gt_widths = reference_boxes[:, 2:3] - reference_boxes[:, 0:1]
    gt_heights = reference_boxes[:, 3:4] - reference_boxes[:, 1:2]
    gt_ctr_x = reference_boxes[:, 0:1] + 0.5 * gt_widths
    gt_ctr_y = reference_boxes[:, 1:2] + 0.5 * gt_heights
    targets_dx = wx * (gt_ctr_x - ex_ctr_x) / ex_widths
    targets_dy = wy * (gt_ctr_y - ex_ctr_y) / ex_heights
    targets_dw = ww * torch.log(gt_widths / ex_widths)
    targets_dh = wh * torch.log(gt_heights / ex_heights)
    return torch.cat((targets_dx, targets_dy, targets_dw, targets_dh), dim=1)


def pad_rows(rows: list[Tensor], fill: float | bool | int, length: int | None = None) -> Tensor:
    """Per-image (N_i, ...) tensors stacked into (B, max N_i or `length`, ...), the missing rows `fill`.
    Shapes are host facts: nothing is read from the device."""
    length = max((r.shape[0] for r in rows), default=0) if length is None else length
    padded = []
    for r in rows:
        missing = length - r.shape[0]
        padded.append(torch.cat((r, r.new_full((missing, *r.shape[1:]), fill))) if missing else r)
    return torch.stack(padded)


def padded_targets(targets: list[dict[str, Tensor]], dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """The ground truth of a batch as (B, G, 4) boxes of `dtype`, (B, G) labels and (B, G) `valid`, G the
    most boxes of an image (at least one: a batch of background images still has a grid, all padding)."""
    rows = max(1, max(t["boxes"].shape[0] for t in targets))
    boxes = pad_rows([t["boxes"].to(dtype) for t in targets], 0.0, rows)
    labels = pad_rows([t["labels"] for t in targets], 0, rows)
    valid = pad_rows([torch.ones_like(t["labels"], dtype=torch.bool) for t in targets], False, rows)
    return boxes, labels, valid


def from_host(values: list | Tensor, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Host `values` (a list, or a CPU tensor) on `like`'s device without a blocking copy: on a GPU a
    copy from pageable memory synchronises the stream, one from pinned memory is queued like a kernel."""
    host = values if isinstance(values, Tensor) else torch.tensor(values, dtype=dtype or like.dtype)
    if like.device.type == "cpu":
        return host
    return host.pin_memory().to(like.device, non_blocking=True)


def image_sizes_tensor(image_sizes: list[tuple[int, int]], like: Tensor) -> tuple[Tensor, Tensor]:
    """(heights, widths) as (B,) tensors of `like`'s dtype on its device."""
    sizes = from_host([list(s) for s in image_sizes], like)
    return sizes[:, 0], sizes[:, 1]
