"""Mask targets for the positive proposals of a whole batch, by one roi_align on the device.

torchvision (roi_heads.project_masks_on_boxes) runs roi_align once per image over that image's
ground-truth masks. Here the masks of every image share one canvas of the batch's largest mask size
plus one row and one column, each image's masks in its top-left corner with its last row and column
repeated once beyond it. Then one roi_align (torchvision's kernel, its adaptive sampling) crops and
resizes every positive proposal's mask: a sample within an image's mask reads what it reads there,
and one in the pixel past its edge reads the repeated edge, where torchvision's kernel clamps to the
edge: the same value, to float rounding. (Only a RoI under one pixel tall or wide, at the bottom or
right edge, could sample further out: none survives the RPN's clipping at full size.)
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import roi_align


def mask_canvas(masks: list[Tensor], dtype: torch.dtype) -> Tensor:
    """(B * G, 1, H + 1, W + 1): image b's mask g at b * G + g, G the most masks of an image, H and W
    the largest mask sizes; each mask's last row and column repeated once past it."""
    most = max(1, max(m.shape[0] for m in masks))
    height = max(m.shape[-2] for m in masks) + 1
    width = max(m.shape[-1] for m in masks) + 1
    canvas = masks[0].new_zeros((len(masks), most, height, width), dtype=dtype)
    for image, m in enumerate(masks):
        count, h, w = m.shape
        if count == 0:
            continue
        region = canvas[image, :count]
        region[:, :h, :w] = m
        region[:, h, :w] = m[:, h - 1]
        region[:, : h + 1, w] = region[:, : h + 1, w - 1]
    return canvas.view(-1, 1, height, width)


def project_masks(masks: list[Tensor], boxes: Tensor, images: Tensor, matched: Tensor, size: int) -> Tensor:
    """(R, size, size) targets: the mask `matched` (R,) of image `images` (R,) cropped to each box (R, 4)
    and resized (roi_align, spatial scale 1, adaptive sampling: torchvision's mask targets)."""
    canvas = mask_canvas(masks, boxes.dtype)
    most = canvas.shape[0] // len(masks)
    index = (images * most + matched).to(boxes.dtype)
    rois = torch.cat((index[:, None], boxes), dim=1)
    return roi_align(canvas, rois, (size, size), 1.0)[:, 0]
