"""pycocotools' masks: a segmentation as one RLE (as COCO.annToRLE makes it) and RLEs decoded, without
numpy 2's deprecation noise."""

from __future__ import annotations

import warnings

import numpy as np
from pycocotools import mask as mask_utils


def decode_masks(rles: dict | list[dict]) -> np.ndarray:
    """`pycocotools.mask.decode`: one RLE -> HxW, a list -> HxWxN (uint8)."""
    # pycocotools (2.0.x) calls np.array(copy=False) on its own arrays, which numpy 2 answers with a
    # DeprecationWarning per call: harmless, but it would flood test output and worker logs.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="__array__ implementation", category=DeprecationWarning)
        return mask_utils.decode(rles)


def to_rle(segm: list | dict, height: int, width: int) -> dict:
    """A segmentation as one RLE, exactly as pycocotools' COCO.annToRLE makes it."""
    if isinstance(segm, list):
        return mask_utils.merge(mask_utils.frPyObjects(segm, height, width))
    if isinstance(segm["counts"], list):
        return mask_utils.frPyObjects(segm, height, width)
    return segm
