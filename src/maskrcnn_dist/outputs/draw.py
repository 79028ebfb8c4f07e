"""Detections drawn on an image: translucent masks (one colour per instance), boxes and captions.

Pure functions on uint8 `[3, H, W]` tensors; nothing here reads or writes files or runs a model.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont
from torchvision.utils import draw_bounding_boxes, draw_segmentation_masks

# Well-separated colours (matplotlib's tab10 and a few more); instance i gets PALETTE[i % len].
PALETTE: tuple[tuple[int, int, int], ...] = (
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (188, 189, 34),
    (23, 190, 207),
    (255, 215, 0),
    (0, 128, 128),
    (128, 0, 0),
)
MASK_ALPHA = 0.45  # translucent: the object stays visible under its mask
NOTE_FONT_SIZE = 12  # PIL's built-in font at its default 10 px squeezes spaces to 2 px


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """A float image in [0, 1] (the data contract's) as uint8, for drawing and saving."""
    return (image.clamp(0, 1) * 255).round().to(torch.uint8)


def enlarge(image: torch.Tensor, factor: int) -> torch.Tensor:
    """Nearest-neighbour enlargement by an integer factor (small images get legible captions)."""
    return image.repeat_interleave(factor, dim=-2).repeat_interleave(factor, dim=-1) if factor > 1 else image


def draw_detections(
    image: torch.Tensor,
    boxes: torch.Tensor,
    masks: torch.Tensor | None,
    captions: list[str],
    empty_note: str,
    scale: int = 1,
) -> torch.Tensor:
    """`image` (uint8 [3, H, W]) with instance i's mask (bool [N, H, W]), box (xyxy pixels) and caption in
    colour i; `scale` enlarges everything by that integer factor first. No instance: the image, plainly,
    with `empty_note` written in its corner."""
    image = enlarge(image, scale)
    if len(boxes) == 0:
        return draw_note(image, empty_note)
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(boxes))]
    if masks is not None and len(masks):
        image = draw_segmentation_masks(image, enlarge(masks.bool(), scale), alpha=MASK_ALPHA, colors=colors)
    return draw_bounding_boxes(
        image, boxes.float() * scale, labels=captions, colors=colors, width=max(1, scale), fill_labels=True
    )


def draw_note(image: torch.Tensor, text: str) -> torch.Tensor:
    """`text` in the top-left corner, white on a dark band, with PIL's built-in bitmap font (no font files)."""
    canvas = Image.fromarray(image.permute(1, 2, 0).numpy())
    pen = ImageDraw.Draw(canvas)
    font = ImageFont.load_default(size=NOTE_FONT_SIZE)
    left, top, right, bottom = pen.textbbox((3, 2), text, font=font)
    pen.rectangle((0, 0, right + 3, bottom + 2), fill=(0, 0, 0))
    pen.text((3, 2), text, fill=(255, 255, 255), font=font)
    return torch.from_numpy(np.array(canvas)).permute(2, 0, 1).contiguous()
