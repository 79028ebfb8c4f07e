"""A segmentation's records as json decodes them (json_read.py): every polygon and every RLE object of a
file collected into the columns the rules judge (columns.PolygonRecords, columns.RleRecords), whatever
their shape: a value of the wrong kind is a flag for the rules, never an error here."""

from __future__ import annotations

from typing import Any

import numpy as np

from .columns import COUNTS, OTHER, RLE, PolygonRecords, RleRecords, as_points, int_column, is_int, offsets


class PolygonCollector:
    """Collects the polygon records (rules: shapes; points for the annotations without an area)."""

    def __init__(self) -> None:
        self.ann: list[int] = []
        self.is_list: list[bool] = []
        self.length: list[int] = []
        self.judged: list[int] = []
        self.points: list[np.ndarray] = []

    def add(self, ann: int, polygons: list[Any], judged: bool) -> None:
        for polygon in polygons:
            if judged:
                self.judged.append(len(self.ann))
                self.points.append(as_points(polygon))
            self.ann.append(ann)
            self.is_list.append(isinstance(polygon, list))
            self.length.append(len(polygon) if isinstance(polygon, list) else 0)

    def records(self) -> PolygonRecords:
        return PolygonRecords(
            np.array(self.ann, dtype=np.int64),
            np.array(self.is_list, dtype=bool),
            np.array(self.length, dtype=np.int64),
            np.array(self.judged, dtype=np.int64),
            np.concatenate(self.points) if self.points else np.zeros(0),
            offsets([len(p) for p in self.points]),
        )


class RleCollector:
    """Collects the RLE records."""

    def __init__(self) -> None:
        self.ann: list[int] = []
        self.size: list[tuple[float, float]] = []
        self.counts_kind: list[int] = []
        self.texts: list[str | None] = []
        self.runs: list[int] = []
        self.run_start: list[int] = [0]
        self.runs_ints: list[bool] = []

    def add(self, ann: int, rle: dict[str, Any]) -> None:
        self.ann.append(ann)
        size, counts = rle.get("size"), rle.get("counts")
        self.size.append(_pair(size))
        ints = isinstance(counts, list) and all(is_int(c) for c in counts)
        self.runs_ints.append(ints)
        if ints:
            self.runs.extend(counts)  # type: ignore[arg-type]
        self.run_start.append(len(self.runs))
        text = isinstance(counts, str) and bool(counts)
        self.counts_kind.append(COUNTS if isinstance(counts, list) else RLE if text else OTHER)
        self.texts.append(counts if text else None)

    def records(self) -> RleRecords:
        return RleRecords(
            np.array(self.ann, dtype=np.int64),
            np.array(self.size, dtype=np.float64).reshape(-1, 2),
            np.array(self.counts_kind, dtype=np.uint8),
            self.texts,
            int_column(self.runs),
            np.array(self.run_start, dtype=np.int64),
            np.array(self.runs_ints, dtype=bool),
        )


def _pair(size: Any) -> tuple[float, float]:
    """An RLE's [height, width] as two floats, compared as Python compares the list; NaN where not."""
    if not isinstance(size, list) or len(size) != 2:
        return (np.nan, np.nan)
    pair = []
    for value in size:
        try:
            pair.append(float(value) if isinstance(value, (int, float)) else np.nan)
        except OverflowError:
            pair.append(np.nan)
    return pair[0], pair[1]
