"""A split's samples stored once, in flat arrays: what a dataset keeps for the whole run.

A COCO file parsed into Python objects costs ~24 KiB per image at COCO's scale (every polygon
coordinate a float object) and, in a DataLoader worker, every object read is written to (its reference
count), so each worker's copy of those pages grows through the epoch. Here the images and their kept
annotations are numpy arrays (detectron2's `DatasetFromList(serialize=True)` idea, as arrays): a handful
of objects, whatever the size, that forked workers read without writing, and that a cache file
(data/cache.py) holds byte for byte, so the ranks of a node map one copy.

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
Coordinates stay float64 and strings stay as written, so each mask decodes exactly as from the JSON.
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DatasetError, one_line
from ..cache import CacheFile, cache_name, file_identity, load_or_build
from .columns import COUNTS, POLYGONS, RLE, Columns, offsets
from .fast_read import read_columns
from .json_read import check_polygons, read_annotation_file, validate_annotations, validate_categories, validate_images

log = logging.getLogger(__name__)

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
        """The file_names of these rows (one decode of the names' bytes, then slices: 118k in ~0.1 s)."""
        blob, starts = self.arrays["names"].tobytes(), self.arrays["name_start"].tolist()
        return [blob[starts[row] : starts[row + 1]].decode("utf-8") for row in rows]

    def annotation_rows(self, row: int) -> range:
        start, end = self.arrays["ann_start"][row : row + 2]
        return range(int(start), int(end))

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

    def coco_annotation(self, ann: int, image_row: int, iscrowd: int | None = None) -> dict[str, Any]:
        """Annotation row `ann` (of image row `image_row`) as a COCO record, for pycocotools' ground truth."""
        a = self.arrays
        height, width = int(a["height"][image_row]), int(a["width"][image_row])
        return {
            "id": int(a["ann_id"][ann]),
            "image_id": int(a["image_id"][image_row]),
            "category_id": int(a["category_id"][ann]),
            "bbox": a["bbox"][ann].tolist(),
            "area": float(a["area"][ann]),
            "iscrowd": int(a["iscrowd"][ann]) if iscrowd is None else iscrowd,
            "segmentation": self.segmentation(ann, height, width),
        }

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


def read_store(annotation_file: Path, kept: list[object] | None = None) -> SampleStore:
    """Parse and validate a COCO instances file (data/annotations/json_read.py) into a store: the slow path, once
    per change of the file when a cache keeps the result (open_store). `kept`: takes the parsed objects
    instead of freeing them (cache.Build)."""
    where = str(annotation_file)
    # The parse makes millions of objects, each of which triggers the cyclic collector's scans of a
    # growing heap (40% of json.load at COCO's size); JSON builds no cycles, so the scans find nothing.
    gc.disable()
    try:
        try:
            columns, categories = read_columns(annotation_file, where, kept)
        except Exception as e:  # noqa: BLE001 - the fast path only accepts; json and the checks decide
            log.debug("%s: read with json (%s: %s)", where, type(e).__name__, one_line(e))
            columns, categories = _read_columns_json(annotation_file, where, kept)
        store = store_from_columns(columns, categories, where)
        if kept is not None:
            kept.append(columns)
    finally:
        # Enabled, the collector's next pass would scan every object just made (a second at COCO's size);
        # a caller that keeps them instead of freeing them is about to exit (cache.Build): no pass needed.
        if kept is None:
            gc.enable()
    check_polygon_points(store, where)
    return store


def _read_columns_json(
    annotation_file: Path, where: str, kept: list[object] | None = None
) -> tuple[Columns, list[dict[str, Any]]]:
    """json.load and the per-record checks: any file, and every refusal's message."""
    data = read_annotation_file(annotation_file)
    if kept is not None:
        kept.append(data)
    images = validate_images(data["images"], where)
    categories = validate_categories(data["categories"], where)
    valid, dropped = validate_annotations(data["annotations"], images, categories, where, points_later=True)
    return columns_of(images, valid, dropped), list(categories.values())


def open_store(annotation_file: Path, cache_dir: Path | None, wait_s: float = 1800.0) -> SampleStore:
    """The store of `annotation_file`: mapped from its cache in `cache_dir` when that is valid for the
    file as it is now, else read (by one process; the others wait) and cached. None: no cache."""
    cache = samples_file(annotation_file, cache_dir, wait_s) if cache_dir is not None else None
    payload = load_or_build(cache, lambda kept: read_store(annotation_file, kept).chunks(), "parsed annotations")
    try:
        return SampleStore.from_buffer(payload)
    except (ValueError, KeyError, TypeError) as e:  # a verified file of a layout this code does not read
        where = cache.path if cache is not None else annotation_file
        raise DatasetError(f"{where}: cached samples do not match this program's layout ({e}); delete it") from e


def store_cached(annotation_file: Path, cache_dir: Path | None) -> bool:
    """Whether open_store will map `annotation_file`'s store from `cache_dir` rather than parse the file
    (by the cache's header: open_store verifies the rest)."""
    return cache_dir is not None and samples_file(annotation_file, cache_dir).made_for_key()


def samples_file(annotation_file: Path, cache_dir: Path, wait_s: float = 1800.0) -> CacheFile:
    """Where `annotation_file`'s store is cached in `cache_dir`, keyed by the file as it is now."""
    key = {"annotations": file_identity(annotation_file), "store": STORE_VERSION}
    return CacheFile(cache_dir / f"{cache_name(annotation_file)}.samples", "samples", key, wait_s)


def check_polygon_points(store: SampleStore, where: str) -> None:
    """Every polygon point is finite and near its image (annotations.check_polygons' rule), checked over
    all polygons at once; the first offender is named by check_polygons itself."""
    a = store.arrays
    if not len(a["poly_start"]) or len(a["poly_start"]) == 1:
        return
    image_of_ann = np.repeat(np.arange(len(store)), np.diff(a["ann_start"]))
    polygon_anns = np.flatnonzero(a["seg_kind"] == POLYGONS)
    ann_of_poly = np.repeat(polygon_anns, a["seg_len"][polygon_anns])
    width = a["width"][image_of_ann[ann_of_poly]].astype(np.float64)
    height = a["height"][image_of_ann[ann_of_poly]].astype(np.float64)
    finite = np.isfinite(a["coords"])
    if not finite.all():
        bad = np.searchsorted(a["poly_start"], int(np.argmin(finite)), side="right") - 1
    else:
        # |v - size/2| is largest at a polygon's smallest or largest v: checking those two is the rule.
        starts = a["poly_start"][:-1] // 2
        bad_poly = np.zeros(len(starts), dtype=bool)
        for values, size in ((a["coords"][0::2], width), (a["coords"][1::2], height)):
            for extreme in (np.minimum.reduceat(values, starts), np.maximum.reduceat(values, starts)):
                bad_poly |= np.abs(extreme - size / 2) > 1.5 * size
        if not bad_poly.any():
            return
        bad = int(np.argmax(bad_poly))
    ann = int(ann_of_poly[bad])
    row = int(image_of_ann[ann])
    h, w = int(a["height"][row]), int(a["width"][row])
    ctx = f"{where}: annotation id {int(a['ann_id'][ann])} (image id {int(a['image_id'][row])})"
    check_polygons(store.segmentation(ann, h, w), h, w, ctx)  # type: ignore[arg-type]
    raise DatasetError(f"{ctx}: a polygon point is not finite or lies far outside the {w}x{h} image")


def columns_of(
    images: Mapping[int, Mapping[str, Any]], kept: Sequence[Mapping[str, Any]], dropped: Sequence[int]
) -> Columns:
    """The columns of validated images (by id) and kept annotations (data/annotations/json_read.py)."""
    ids = sorted(images)
    records = [images[iid] for iid in ids]
    return Columns(
        image_id=np.array(ids, dtype=np.int64),
        width=np.array([r["width"] for r in records], dtype=np.int32),
        height=np.array([r["height"] for r in records], dtype=np.int32),
        file_names=[r["file_name"] for r in records],
        ann_id=np.array([a["id"] for a in kept], dtype=np.int64),
        ann_image_id=np.array([a["image_id"] for a in kept], dtype=np.int64),
        category_id=np.array([a["category_id"] for a in kept], dtype=np.int64),
        iscrowd=np.array([a["iscrowd"] for a in kept], dtype=np.uint8),
        area=np.array([a["area"] for a in kept], dtype=np.float64),
        bbox=np.array([a["bbox"] for a in kept], dtype=np.float64).reshape(-1, 4),
        segmentations=[a["segmentation"] for a in kept],
        dropped=dropped,
    )


def store_from_columns(columns: Columns, categories: Sequence[Mapping], where: str = "") -> SampleStore:
    """The store of validated columns: annotations grouped by image, in file order within an image."""
    c = columns
    names = [name.encode("utf-8") for name in c.file_names]
    ann_rows = np.searchsorted(c.image_id, c.ann_image_id)
    order = np.argsort(ann_rows, kind="stable")
    try:
        segment_arrays = dict(c.segments) if c.segments is not None else _Segments.of(c.segmentations, order)
    except (TypeError, ValueError):  # a polygon holds something that is not a number: name it
        for k in order.tolist():  # the first offender in the store's order, as the check goes
            if isinstance(segm := c.segmentations[k], list):
                row = int(ann_rows[k])
                ctx = f"{where}: annotation id {int(c.ann_id[k])} (image id {int(c.ann_image_id[k])})"
                check_polygons(segm, int(c.height[row]), int(c.width[row]), ctx)
        raise
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
        **segment_arrays,
        "dropped": np.array(c.dropped, dtype=np.int64),
    }
    return SampleStore(arrays, tuple(dict(cat) for cat in categories))


class _Segments:
    """Collects segmentations into the flat arrays (coordinates chained, converted once at the end)."""

    def __init__(self) -> None:
        self.kind: list[int] = []
        self.start: list[int] = []
        self.length: list[int] = []
        self.polygons: list[list[float]] = []
        self.rle: list[bytes] = []
        self.rle_bytes = 0
        self.counts: list[list[int]] = []
        self.counts_len = 0

    @classmethod
    def of(cls, segmentations: Sequence[list | dict], order: np.ndarray) -> dict[str, np.ndarray]:
        """The arrays of `segmentations` taken in `order`."""
        segments = cls()
        for k in order.tolist():
            segments.add(segmentations[k])
        return segments.arrays()

    def add(self, segm: list | dict) -> None:
        if isinstance(segm, list):
            self.kind.append(POLYGONS)
            self.start.append(len(self.polygons))
            self.length.append(len(segm))
            self.polygons.extend(segm)
        elif isinstance(segm["counts"], str):
            text = segm["counts"].encode("ascii")
            self.kind.append(RLE)
            self.start.append(self.rle_bytes)
            self.length.append(len(text))
            self.rle.append(text)
            self.rle_bytes += len(text)
        else:
            self.kind.append(COUNTS)
            self.start.append(self.counts_len)
            self.length.append(len(segm["counts"]))
            self.counts.append(segm["counts"])
            self.counts_len += len(segm["counts"])

    def arrays(self) -> dict[str, np.ndarray]:
        poly_start = offsets([len(p) for p in self.polygons])
        coords = np.fromiter(itertools.chain.from_iterable(self.polygons), dtype=np.float64, count=int(poly_start[-1]))
        return {
            "seg_kind": np.array(self.kind, dtype=np.uint8),
            "seg_start": np.array(self.start, dtype=np.int64),
            "seg_len": np.array(self.length, dtype=np.int64),
            "poly_start": poly_start,
            "coords": coords,
            "rle": np.frombuffer(b"".join(self.rle), dtype=np.uint8),
            "counts": np.fromiter(itertools.chain.from_iterable(self.counts), dtype=np.int64, count=self.counts_len),
        }
