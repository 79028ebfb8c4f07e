"""The rules of an annotation's segmentation, over whole columns (columns.py), for rules.py's
annotation_fault: a list of polygons (each a flat list of 3 points or more, near its image) or an RLE
object (its size the image's, its runs covering the image exactly), each fault in the words a refusal says.

Invariant: nothing reaches pycocotools that its C code would crash on or silently misread (polygons far
outside the image, run-length strings of the wrong size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import columns
from .columns import COUNTS, OTHER, POLYGONS, RLE, offsets

# pycocotools rasterises a polygon edge by edge in C, sized by the coordinates: points far outside the
# image make it allocate without bound or crash the process (SIGSEGV at 1e12). Real annotations stray from
# the image by rounding only; one image size either side is lenient.
NEAR = 1.5


@dataclass(frozen=True)
class SegmentationFaults:
    """Which annotations' segmentations are refused, and the words for one."""

    bad: np.ndarray
    words: Callable[[int], str]


def segmentation_faults(anns: columns.AnnotationRecords, width: np.ndarray, height: np.ndarray) -> SegmentationFaults:
    """A list of polygons (at least one; each a flat list of 3 points or more; an annotation without an
    area has its points judged too: finite, near the image) or an RLE object (its size the image's, its
    runs covering the image exactly)."""
    polygon_code = polygon_faults(anns, width, height)
    rle_code = rle_faults(anns.rles, width, height)
    code = np.zeros(len(anns.ids), dtype=np.int64)
    code[anns.kind == OTHER] = 1
    code[(anns.kind == POLYGONS) & (anns.polygon_count == 0)] = 2
    code[np.unique(anns.polygons.ann[polygon_code > 0])] = 3
    code[anns.rles.ann[rle_code > 0]] = 4

    def words(i: int) -> str:
        h, w = int(height[i]), int(width[i])
        if code[i] == 1:
            return "'segmentation' must be a list of polygons or an RLE object"
        if code[i] == 2:
            return "'segmentation' has no polygon"
        if code[i] == 3:
            return _polygon_fault_words(anns, polygon_code, i, w, h)
        (k,) = np.flatnonzero(anns.rles.ann == i)
        return rle_words(int(rle_code[k]), anns.raw[i]["segmentation"], w, h)

    return SegmentationFaults(code > 0, words)


# A polygon's faults, in the order they are named: not a flat list of numbers, too few coordinates, a
# point far outside the image.
NOT_NUMBERS, TOO_FEW, FAR = 1, 2, 3


def polygon_faults(anns: columns.AnnotationRecords, width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """Each polygon's first fault (0: none). Points are judged here only for the annotations without an
    area (the rest on the store, store.polygon_points_fault: all at once is most of the time COCO's
    polygons would take one by one)."""
    p = anns.polygons
    code = np.zeros(len(p.ann), dtype=np.int64)
    judged_code = point_faults(p.points, p.point_start, width[p.ann[p.judged]], height[p.ann[p.judged]])
    points = np.zeros(len(p.ann), dtype=np.int64)
    points[p.judged] = judged_code
    code[~p.is_list | (points == NOT_NUMBERS)] = NOT_NUMBERS
    code[(code == 0) & ((p.length < 6) | (p.length % 2 == 1))] = TOO_FEW
    code[(code == 0) & (points == FAR)] = FAR
    return code


def point_faults(coords: np.ndarray, start: np.ndarray, width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """Per polygon (its coordinates coords[start[p]:start[p+1]] alternate x and y; its image's width and
    height): NOT_NUMBERS where one is not a finite number, FAR where a point lies far outside the image
    (NEAR sizes from its centre), 0 where all is well. By each polygon's smallest and largest x and y:
    |v - size/2| is largest at one of them."""
    count = len(start) - 1
    code = np.zeros(count, dtype=np.int64)
    lengths = np.diff(start)
    if not count or not lengths.sum():
        return code
    finite = np.isfinite(coords)
    if not finite.all():
        code[np.unique(np.repeat(np.arange(count), lengths)[~finite])] = NOT_NUMBERS
    whole = np.flatnonzero((lengths > 0) & (lengths % 2 == 0))  # the rest is refused for its length
    if len(whole) < count:
        coords = coords[np.repeat(np.isin(np.arange(count), whole), lengths)]
        start = offsets(lengths[whole])
    pairs = start[:-1] // 2
    far = np.zeros(len(whole), dtype=bool)
    for values, size in ((coords[0::2], width[whole]), (coords[1::2], height[whole])):
        size = np.asarray(size, dtype=np.float64)
        for extreme in (np.minimum.reduceat(values, pairs), np.maximum.reduceat(values, pairs)):
            far |= np.abs(extreme - size / 2) > NEAR * size
    code[whole[far & (code[whole] == 0)]] = FAR
    return code


def polygon_words(k: int, code: int, length: int, points: np.ndarray | None, width: int, height: int) -> str:
    """Why polygon `k` of an annotation is refused (its first fault `code`; `points`: its coordinates)."""
    if code == NOT_NUMBERS:
        return f"polygon {k} must be a flat list of numbers [x1, y1, x2, y2, ...]"
    if code == TOO_FEW:
        return f"polygon {k} has {length} coordinates; it needs at least 3 points (6 numbers) and an even count"
    assert points is not None
    xy = points.reshape(-1, 2)
    outside = (np.abs(xy - [width / 2, height / 2]) > [NEAR * width, NEAR * height]).any(axis=1)
    x, y = xy[int(np.argmax(outside))]
    return f"polygon {k} has the point ({x:g}, {y:g}), far outside the {width}x{height} image"


def _polygon_fault_words(anns: columns.AnnotationRecords, codes: np.ndarray, i: int, width: int, height: int) -> str:
    p = anns.polygons
    mine = np.flatnonzero(p.ann == i)
    first = int(mine[np.argmax(codes[mine] > 0)])
    points = None
    if (j := np.flatnonzero(p.judged == first)).size:
        points = p.points[p.point_start[j[0]] : p.point_start[j[0] + 1]]
    return polygon_words(first - int(mine[0]), int(codes[first]), int(p.length[first]), points, width, height)


# An RLE's faults, in the order they are named.
SIZE, RUNS, COUNTS_TYPE, COMPRESSED = 1, 2, 3, 4


def rle_faults(rles: columns.RleRecords, width: np.ndarray, height: np.ndarray) -> np.ndarray:
    """Each RLE's first fault (0: none): its size is not the image's [height, width]; its runs (a list)
    are not non-negative integers summing to height*width; its counts are neither such a list nor a
    non-empty string; the string is not a run-length string covering the image (pycocotools decodes
    whatever it is given: garbage raises a bare ValueError, a short string gives a mask of the wrong size)."""
    h, w = height[rles.ann].astype(np.int64), width[rles.ann].astype(np.int64)
    pixels = h * w
    code = np.zeros(len(rles.ann), dtype=np.int64)
    code[~((rles.size[:, 0] == h) & (rles.size[:, 1] == w))] = SIZE
    lists = np.flatnonzero((code == 0) & (rles.counts_kind == COUNTS))
    code[lists[~_runs_cover(rles, lists, pixels[lists])]] = RUNS
    code[(code == 0) & (rles.counts_kind == OTHER)] = COUNTS_TYPE
    for r in np.flatnonzero((code == 0) & (rles.counts_kind == RLE)).tolist():
        runs = compressed_rle_runs(rles.texts[r] or "")
        if runs is None or min(runs) < 0 or sum(runs) != pixels[r]:
            code[r] = COMPRESSED
    return code


def _runs_cover(rles: columns.RleRecords, chosen: np.ndarray, pixels: np.ndarray) -> np.ndarray:
    """Whether each chosen RLE's runs are non-negative integers summing to its pixel count."""
    if not len(chosen):
        return np.zeros(0, dtype=bool)
    begin, end = rles.run_start[chosen], rles.run_start[chosen + 1]
    count = end - begin
    ok = rles.runs_ints[chosen] & (count > 0)
    # Summed in int64 where no run is above the pixel count and few enough runs: no sum can wrap around to it.
    dense = ok & (rles.runs.dtype != object) & (count < np.iinfo(np.int64).max // np.maximum(pixels, 1))
    if dense.any():
        picked = np.flatnonzero(dense)
        segments = offsets(count[picked])
        gather = np.repeat(begin[picked] - segments[:-1], count[picked]) + np.arange(int(segments[-1]))
        runs = rles.runs[gather]
        low, high = np.minimum.reduceat(runs, segments[:-1]), np.maximum.reduceat(runs, segments[:-1])
        covered = (low >= 0) & (high <= pixels[picked]) & (np.add.reduceat(runs, segments[:-1]) == pixels[picked])
        ok[picked] = covered
    for k in np.flatnonzero(ok & ~dense).tolist():  # the rest summed exactly, by Python's ints
        runs = rles.runs[begin[k] : end[k]].tolist()
        ok[k] = min(runs) >= 0 and sum(runs) == pixels[k]
    return ok


def rle_words(code: int, raw: Any, width: int, height: int) -> str:
    """Why an RLE (`raw`: as the file wrote it) is refused (its first fault `code`)."""
    if code == SIZE:
        return f"RLE 'size' is {raw.get('size')!r}, the image is [height, width] = {[height, width]}"
    if code == RUNS:
        return f"uncompressed RLE 'counts' must be non-negative integers summing to height*width = {height * width}"
    if code == COUNTS_TYPE:
        return "RLE 'counts' must be a list of integers or a compressed string"
    return f"compressed RLE 'counts' is not a valid run-length string covering height*width = {height * width} pixels"


def compressed_rle_runs(text: str) -> list[int] | None:
    """The runs of a compressed COCO RLE string (pycocotools' rleFrString, in Python), or None when the
    text is not one: 6 bits per character from '0', 5 of value, the sixth "more follows"; from the
    third run on, each value is a difference to the run two before."""
    runs: list[int] = []
    pos = 0
    while pos < len(text):
        value, shift, more = 0, 0, True
        while more:
            if pos >= len(text):
                return None  # the last run was cut off
            code = ord(text[pos]) - 48
            if not 0 <= code < 64:
                return None
            value |= (code & 0x1F) << shift
            more = bool(code & 0x20)
            pos, shift = pos + 1, shift + 5
            if not more and code & 0x10:
                value |= -1 << shift  # sign extension of the last group
        runs.append(value + runs[-2] if len(runs) > 2 else value)
    return runs or None
