"""pycocotools mask decoding without its numpy 2 deprecation noise."""

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
