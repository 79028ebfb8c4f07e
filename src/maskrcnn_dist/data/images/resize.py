"""The size the model's transform resizes an image to, computed without the model: an image whose side
would become 0 px is refused by the data check and predict, with its file and sizes, instead of
stopping training with torch's "Input and output sizes should be greater than 0"."""

from __future__ import annotations


def resized_size(width: int, height: int, min_size: int, max_size: int) -> tuple[int, int]:
    """(width, height) after torchvision's GeneralizedRCNNTransform (`_resize_image_and_masks`): one
    scale factor, min(min_size / short side, max_size / long side), then `interpolate(scale_factor=...,
    recompute_scale_factor=True)`, whose output size is int(side * scale), i.e. floored."""
    scale = min(min_size / min(width, height), max_size / max(width, height))
    return int(width * scale), int(height * scale)


def degenerate_size_reason(width: int, height: int, min_size: int, max_size: int) -> str | None:
    """Why a `width` x `height` image cannot go through the model at these sizes, or None."""
    new_width, new_height = resized_size(width, height, min_size, max_size)
    if new_width >= 1 and new_height >= 1:
        return None
    return (
        f"image is too thin for the model: {width}x{height} resizes to {new_width}x{new_height} "
        f"at --min-size {min_size} --max-size {max_size} (a side of 0 px)"
    )
