"""Where a split's data is: the one shape every way in (--data-path layouts, explicit flags, the
synthetic set) resolves to, and what a checkpoint records of the data a run trained and validated on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def input_folder_problem(path: Path, flag: str, takes: str) -> str | None:
    """Why the folder `flag` names cannot be read from (`takes`: what the flag wants, said when it names a
    file instead), or None."""
    if path.is_file():
        return f"{flag} {path} is a file; it takes {takes}"
    if not path.is_dir():
        return f"{flag} {path}: no such folder"
    return None


@dataclass(frozen=True)
class SplitSource:
    """One split: an annotation file, the folder its images' `file_name`s are relative to, and, for a
    split that keeps only some of the file's images (one carved from another), the ids it keeps."""

    annotations: Path
    images: Path
    image_ids: tuple[int, ...] | None = None  # None: every image the file lists

    def describe(self) -> str:
        kept = "" if self.image_ids is None else f" ({len(self.image_ids)} of its images)"
        return f"{self.annotations}{kept} + {self.images}/"

    def to_record(self) -> dict[str, Any]:
        """JSON-able, for a checkpoint or run.json."""
        record: dict[str, Any] = {"annotations": str(self.annotations), "images": str(self.images)}
        if self.image_ids is not None:
            record["image_ids"] = list(self.image_ids)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SplitSource:
        ids = record.get("image_ids")
        return cls(Path(record["annotations"]), Path(record["images"]), None if ids is None else tuple(ids))


@dataclass(frozen=True)
class DataSources:
    """A dataset's splits ("train", "val") and how they were found (a layout's name, "flags", "synthetic")."""

    layout: str
    splits: Mapping[str, SplitSource] = field(default_factory=dict)

    def get(self, split: str) -> SplitSource | None:
        return self.splits.get(split)

    def to_record(self) -> dict[str, Any]:
        return {"layout": self.layout, "splits": {name: s.to_record() for name, s in self.splits.items()}}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> DataSources:
        splits = {name: SplitSource.from_record(s) for name, s in record.get("splits", {}).items()}
        return cls(str(record.get("layout", "")), splits)
