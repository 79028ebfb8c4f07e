"""The columns a SampleStore (data/annotations/store.py) is built from, whichever way the file was read."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

# A segmentation's kind in the store: polygons, a compressed RLE string, uncompressed RLE runs.
POLYGONS, RLE, COUNTS = 0, 1, 2


def offsets(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Where each of consecutive items of these lengths starts, and where the last ends (int64)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


@dataclass
class Columns:
    """What a store is built from: the images in id order, the kept annotations in file order (each
    column one entry per annotation), their segmentations as the JSON has them (polygon lists or RLE
    dicts) or already flat (`segments`: the store's segmentation arrays, in its order, built by
    data/annotations/fast_read.py), and the ids of the annotations dropped for a degenerate box."""

    image_id: np.ndarray
    width: np.ndarray
    height: np.ndarray
    file_names: Sequence[str]
    ann_id: np.ndarray
    ann_image_id: np.ndarray
    category_id: np.ndarray
    iscrowd: np.ndarray
    area: np.ndarray
    bbox: np.ndarray
    segmentations: Sequence[list | dict]
    dropped: Sequence[int]
    segments: Mapping[str, np.ndarray] | None = None
