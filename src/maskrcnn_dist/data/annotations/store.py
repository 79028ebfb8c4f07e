"""A split's samples stored once, in flat arrays: what a dataset keeps for the whole run.

SampleStore owns its layout: the dataset, the ground truth and the data check read a store through its
per-row views (`image_ids`, `size`, `instances`, `ground_truth`, ...), never through its arrays, so a
change of layout stays in this module. The arrays are a handful of objects whatever the size (detectron2's
`DatasetFromList(serialize=True)` idea, as arrays): forked loader workers read them without writing, and a
cache file (data/cache.py) holds them byte for byte, so the ranks of a node map one copy.

Layout (N images in id order, A kept annotations grouped by image in file order):
    image_id, width, height               [N]
    name_start [N+1], names               utf-8 file_names, concatenated
    ann_start [N+1]                       an image's annotations are ann_start[i]:ann_start[i+1]
    ann_id, category_id, iscrowd, area    [A]
    bbox                                  [A, 4] as the file gives it (x, y, w, h), float64
    seg_kind [A]                          POLYGONS, RLE (compressed string) or COUNTS (uncompressed RLE)
    seg_start, seg_len [A]                a polygon annotation's rows of poly_start; an RLE's bytes of
                                          rle; a COUNTS annotation's runs of counts
    poly_start [P+1], coords              polygon p's coordinates are coords[poly_start[p]:poly_start[p+1]]
    rle, counts                           compressed strings (bytes), uncompressed runs (int64)
    dropped                               ids of the annotations left out for a degenerate box
Coordinates stay float64 and strings stay as written, so each mask decodes exactly as from the JSON.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import DatasetError
from .columns import POLYGONS, RLE, Columns, offsets, segment_arrays
from .mask_rules import NOT_NUMBERS, point_faults, polygon_words
from .masks import decode_masks, to_rle
from .rules import clip_boxes

STORE_VERSION = 1  # the layout below; a cache of another layout is rebuilt

_DTYPES: dict[str, str] = {
    "image_id": "<i8",
    "width": "<i4",
    "height": "<i4",
    "name_start": "<i8",
    "names": "u1",
    "ann_start": "<i8",
    "ann_id": "<i8",
    "category_id": "<i8",
    "iscrowd": "u1",
    "area": "<f8",
    "bbox": "<f8",
    "seg_kind": "u1",
    "seg_start": "<i8",
    "seg_len": "<i8",
    "poly_start": "<i8",
    "coords": "<f8",
    "rle": "u1",
    "counts": "<i8",
    "dropped": "<i8",  # ids of the annotations left out for a degenerate box (for the warning)
}
_ALIGN = 64  # each array starts on a cache line: views need aligned data


@dataclass(frozen=True)
class SampleStore:
    """The arrays above (read-only views when mapped from a cache file) and the file's categories."""

    arrays: Mapping[str, np.ndarray]
    categories: tuple[dict[str, Any], ...]  # the file's category records, every one

    @classmethod
    def of_columns(cls, columns: Columns, categories: Sequence[Mapping], where: str = "") -> SampleStore:
        """The store of judged columns: annotations grouped by image, in file order within an image. The
        last rule is judged on it: its polygons' points (polygon_points_fault: a DatasetError naming
        `where`)."""
        c = columns
        names = [name.encode("utf-8") for name in c.file_names]
        ann_rows = np.searchsorted(c.image_id, c.ann_image_id)
        order = np.argsort(ann_rows, kind="stable")
        segments, numbers = segment_arrays(c.kind[order], [c.segments[k] for k in order.tolist()])
        arrays = {
            "image_id": c.image_id,
            "width": c.width.astype(np.int32),
            "height": c.height.astype(np.int32),
            "name_start": offsets([len(n) for n in names]),
            "names": np.frombuffer(b"".join(names), dtype=np.uint8),
            "ann_start": np.searchsorted(ann_rows[order], np.arange(len(c.image_id) + 1), side="left").astype(np.int64),
            "ann_id": c.ann_id[order],
            "category_id": c.category_id[order],
            "iscrowd": c.iscrowd[order].astype(np.uint8),
            "area": c.area[order].astype(np.float64),
            "bbox": c.bbox.reshape(-1, 4)[order].astype(np.float64),
            **segments,
            "dropped": np.array(c.dropped, dtype=np.int64),
        }
        store = cls(arrays, tuple(dict(cat) for cat in categories))
        if refused := store.polygon_points_fault(where, in_order=not numbers):
            raise DatasetError(refused)
        return store

    def __len__(self) -> int:
        return len(self.arrays["image_id"])

    @property
    def num_annotations(self) -> int:
        return len(self.arrays["ann_id"])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def file_name(self, row: int) -> str:
        start, end = self.arrays["name_start"][row : row + 2]
        return bytes(self.arrays["names"][start:end]).decode("utf-8")

    def file_names(self, rows: Sequence[int]) -> list[str]:
        """The file_names of these rows (one decode of the names' bytes, then slices)."""
        blob, starts = self.arrays["names"].tobytes(), self.arrays["name_start"].tolist()
        return [blob[starts[row] : starts[row + 1]].decode("utf-8") for row in rows]

    # --- per-row views: what the dataset, the ground truth and the check read ---------------------

    def rows_of(self, image_ids: Sequence[int] | None, where: str) -> np.ndarray:
        """The rows of these images, in id order (every image for None); a DatasetError (naming `where`)
        for ids the file does not list."""
        if image_ids is None:
            return np.arange(len(self), dtype=np.int64)
        ids = self.arrays["image_id"]
        wanted = np.array(sorted(image_ids), dtype=np.int64)
        rows = np.searchsorted(ids, wanted)
        known = (rows < len(self)) & (ids[np.minimum(rows, len(self) - 1)] == wanted)
        if unknown := wanted[~known].tolist():
            raise DatasetError(f"{where}: the split keeps image ids the file does not list, e.g. {unknown[:5]}")
        return rows

    def rows_without(self, rows: np.ndarray, image_ids: Collection[int]) -> np.ndarray:
        """These rows less those of these images."""
        left_out = np.isin(self.arrays["image_id"][rows], np.array(sorted(image_ids), dtype=np.int64))
        return rows[~left_out]

    def image_id(self, row: int) -> int:
        return int(self.arrays["image_id"][row])

    def image_ids(self, rows: np.ndarray) -> list[int]:
        return self.arrays["image_id"][rows].tolist()

    def size(self, row: int) -> tuple[int, int]:
        """(width, height) the annotation file gives image row `row`."""
        return int(self.arrays["width"][row]), int(self.arrays["height"][row])

    def sizes(self, rows: np.ndarray) -> tuple[list[int], list[int]]:
        """The widths and the heights of these rows."""
        return self.arrays["width"][rows].tolist(), self.arrays["height"][rows].tolist()

    def aspect_ratios(self, rows: np.ndarray) -> list[float]:
        """Width / height of these rows."""
        a = self.arrays
        return (a["width"][rows].astype(np.float64) / a["height"][rows]).tolist()

    def annotation_rows(self, row: int) -> range:
        start, end = self.arrays["ann_start"][row : row + 2]
        return range(int(start), int(end))

    def annotation_rows_of(self, rows: np.ndarray) -> np.ndarray:
        """The annotation rows of these image rows, in their order."""
        ann_start = self.arrays["ann_start"]
        starts, ends = ann_start[rows], ann_start[rows + 1]
        lengths = ends - starts
        if not lengths.sum():
            return np.zeros(0, dtype=np.int64)
        # each image's range start..end, concatenated, without a Python loop
        shift = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) + shift

    def category_counts(self, rows: np.ndarray) -> tuple[Counter, Counter]:
        """Per category id, the instances and the crowd regions of these image rows."""
        anns = self.annotation_rows_of(rows)
        crowd = self.arrays["iscrowd"][anns].astype(bool)
        category_ids = self.arrays["category_id"][anns]
        return _count(category_ids[~crowd]), _count(category_ids[crowd])

    @property
    def dropped(self) -> list[int]:
        """The ids of the annotations left out for a degenerate box."""
        return self.arrays["dropped"].tolist()

    def segmentation(self, ann: int, height: int, width: int) -> list[list[float]] | dict[str, Any]:
        """Annotation row `ann`'s segmentation as the JSON had it (pycocotools reads it as from the file)."""
        a = self.arrays
        start, length, kind = int(a["seg_start"][ann]), int(a["seg_len"][ann]), int(a["seg_kind"][ann])
        if kind == POLYGONS:
            bounds = a["poly_start"][start : start + length + 1]
            return [a["coords"][s:e].tolist() for s, e in itertools.pairwise(bounds)]
        if kind == RLE:
            return {"size": [height, width], "counts": bytes(a["rle"][start : start + length]).decode("ascii")}
        return {"size": [height, width], "counts": a["counts"][start : start + length].tolist()}

    def instances(self, row: int, crowd_as_instances: bool = False) -> Instances:
        """Image row `row`'s training instances. Crowd regions (iscrowd 1) are none, as in torchvision's
        detection reference: not instances to learn; COCOeval reads them from the ground truth to ignore
        detections on them (`crowd_as_instances`: they are instances)."""
        a = self.arrays
        anns = np.arange(a["ann_start"][row], a["ann_start"][row + 1])
        if not crowd_as_instances:
            anns = anns[a["iscrowd"][anns] == 0]
        width, height = self.size(row)
        if len(anns):
            boxes = clip_boxes(a["bbox"][anns], width, height)
            rles = [to_rle(self.segmentation(int(i), height, width), height, width) for i in anns]
            masks = np.ascontiguousarray(decode_masks(rles).transpose(2, 0, 1))
        else:
            boxes = np.zeros((0, 4), dtype=np.float64)
            masks = np.zeros((0, height, width), dtype=np.uint8)
        return Instances(boxes, masks, a["category_id"][anns], a["area"][anns])

    def ground_truth(self, rows: np.ndarray, crowd_as_instances: bool = False) -> dict[str, Any]:
        """These images and their annotations as a COCO instances dict, for pycocotools' ground truth:
        crowd regions included (as instances with `crowd_as_instances`), degenerate boxes excluded."""
        a = self.arrays
        images, annotations = [], []
        for row in rows.tolist():
            width, height = self.size(row)
            images.append(
                {"id": self.image_id(row), "file_name": self.file_name(row), "width": width, "height": height}
            )
            for ann in self.annotation_rows(row):
                annotations.append(
                    {
                        "id": int(a["ann_id"][ann]),
                        "image_id": self.image_id(row),
                        "category_id": int(a["category_id"][ann]),
                        "bbox": a["bbox"][ann].tolist(),
                        "area": float(a["area"][ann]),
                        "iscrowd": 0 if crowd_as_instances else int(a["iscrowd"][ann]),
                        "segmentation": self.segmentation(ann, height, width),
                    }
                )
        return {"images": images, "annotations": annotations, "categories": list(self.categories)}

    def polygon_points_fault(self, where: str, in_order: bool = False) -> str | None:
        """Why a polygon point of the store is refused (not a finite number, or far outside its image:
        rules.point_faults, over every polygon at once), naming the annotation and its first refused
        polygon; None when none is. The annotation named: the first in the store's order with a refused
        polygon (`in_order`: a coordinate did not convert to a number), else the first with a point
        that is not a finite number, else the first with a far one."""
        a = self.arrays
        if len(a["poly_start"]) <= 1:
            return None
        image_of_ann = np.repeat(np.arange(len(self)), np.diff(a["ann_start"]))
        polygon_anns = np.flatnonzero(a["seg_kind"] == POLYGONS)
        ann_of_polygon = np.repeat(polygon_anns, a["seg_len"][polygon_anns])
        rows = image_of_ann[ann_of_polygon]
        codes = point_faults(a["coords"], a["poly_start"], a["width"][rows], a["height"][rows])
        if not codes.any():
            return None
        named = codes > 0 if in_order or not (codes == NOT_NUMBERS).any() else codes == NOT_NUMBERS
        ann = int(ann_of_polygon[int(np.argmax(named))])
        mine = np.flatnonzero(ann_of_polygon == ann)
        first = int(mine[np.argmax(codes[mine] > 0)])
        points = a["coords"][a["poly_start"][first] : a["poly_start"][first + 1]]
        row = int(rows[first])
        width, height = self.size(row)
        words = polygon_words(first - int(mine[0]), int(codes[first]), len(points), points, width, height)
        return f"{where}: annotation id {int(a['ann_id'][ann])} (image id {self.image_id(row)}): {words}"

    # --- one buffer: what the cache file holds -------------------------------------------------

    def chunks(self) -> Iterator[bytes]:
        """The store as one buffer, in pieces (a cache file is written without a second copy in memory):
        the header's length, a JSON header (each array's shape and offset; the categories), then each
        array's bytes, every piece aligned."""
        index, offset = {}, 0
        for name in _DTYPES:
            index[name] = {"shape": list(self.arrays[name].shape), "offset": offset}
            offset += _aligned(self.arrays[name].nbytes)
        head = json.dumps({"arrays": index, "categories": list(self.categories)}).encode()
        yield _padded(len(head).to_bytes(8, "little") + head)
        for name in _DTYPES:
            yield _padded(np.ascontiguousarray(self.arrays[name], dtype=_DTYPES[name]).tobytes())

    @classmethod
    def from_buffer(cls, buffer: memoryview | bytes) -> SampleStore:
        """Views into `buffer` (no copy: a mapped file's pages stay shared). ValueError when the buffer is
        not one `chunks` wrote (the cache checks its checksum first; this guards the layout itself)."""
        size = int.from_bytes(bytes(buffer[:8]), "little")
        head = json.loads(bytes(buffer[8 : 8 + size]))
        base = _aligned(size + 8)
        arrays = {}
        for name, dtype in _DTYPES.items():
            spec = head["arrays"][name]
            shape = tuple(spec["shape"])
            count = int(np.prod(shape)) if shape else 1
            start = base + spec["offset"]
            if start + count * np.dtype(dtype).itemsize > len(buffer):
                raise ValueError(f"array {name} runs past the end of the buffer")
            if count == 0:  # frombuffer refuses an offset at the very end
                arrays[name] = np.empty(shape, dtype=dtype)
            else:
                arrays[name] = np.frombuffer(buffer, dtype=dtype, count=count, offset=start).reshape(shape)
        store = cls(arrays, tuple(head["categories"]))
        store.check_layout()
        return store

    def check_layout(self) -> None:
        """The offsets agree with the arrays' lengths (a buffer of the wrong layout fails here, not later
        inside a worker)."""
        a, n, m = self.arrays, len(self), self.num_annotations
        for name, length in (("width", n), ("height", n), ("name_start", n + 1), ("ann_start", n + 1)):
            if len(a[name]) != length:
                raise ValueError(f"{name} has {len(a[name])} rows, expected {length}")
        if n and (a["ann_start"][-1] != m or a["name_start"][-1] != len(a["names"])):
            raise ValueError("image offsets do not end at the annotation count")
        for name in ("category_id", "iscrowd", "area", "bbox", "seg_kind", "seg_start", "seg_len"):
            if len(a[name]) != m:
                raise ValueError(f"{name} has {len(a[name])} rows, expected {m}")
        if len(a["poly_start"]) and a["poly_start"][-1] != len(a["coords"]):
            raise ValueError("polygon offsets do not end at the coordinate count")


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _padded(data: bytes) -> bytes:
    return data + bytes(_aligned(len(data)) - len(data))


@dataclass(frozen=True)
class Instances:
    """One image's instances as arrays: boxes [n, 4] (x1, y1, x2, y2, clipped to the image, float64),
    masks [n, H, W] (uint8), category ids [n], areas [n] (float64)."""

    boxes: np.ndarray
    masks: np.ndarray
    category_ids: np.ndarray
    area: np.ndarray


def _count(category_ids: np.ndarray) -> Counter:
    ids, counts = np.unique(category_ids, return_counts=True)
    return Counter(dict(zip(ids.tolist(), counts.tolist(), strict=True)))
