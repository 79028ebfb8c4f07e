"""What a label index means: the dataset's COCO category ids and names, carried in checkpoints.

A checkpoint stores them as `[[category_id, name], ...]` indexed by label (0 is the background), plain
types so that `weights_only=True` still loads it. Files without them are labelled by index ("class 3").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import CheckpointError

BACKGROUND = (-1, "__background__")


@dataclass(frozen=True)
class Categories:
    """`ids[label]` and `names[label]` for every label of the model, background (label 0) included."""

    ids: tuple[int, ...]
    names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.ids)

    @classmethod
    def of_dataset(cls, dataset: Any) -> Categories:
        """From a CocoInstanceDataset (its label_to_category_id and category_names)."""
        return cls(tuple(dataset.label_to_category_id), tuple(dataset.category_names))

    @classmethod
    def by_index(cls, num_classes: int) -> Categories:
        """No names known: label k is category id k, called "class k"."""
        labels = range(1, num_classes)
        return cls((BACKGROUND[0], *labels), (BACKGROUND[1], *(f"class {k}" for k in labels)))

    def to_state(self) -> list[list[Any]]:
        return [[int(i), str(n)] for i, n in zip(self.ids, self.names)]

    @classmethod
    def from_state(cls, state: Any, where: str) -> Categories | None:
        """Read what `to_state` wrote; None for files written before checkpoints carried categories."""
        if state is None:
            return None
        pairs_ok = isinstance(state, list) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], str)
            for p in state
        )
        if not pairs_ok or len(state) < 2:
            raise CheckpointError(f"{where}: 'categories' is not a list of [category_id, name] pairs")
        return cls(tuple(p[0] for p in state), tuple(p[1] for p in state))

    def caption(self, label: int) -> str:
        return self.names[label] if 0 <= label < len(self.names) else f"class {label}"

    def coco_categories(self) -> list[dict[str, Any]]:
        """The `categories` list of a COCO file (background left out)."""
        return [{"id": i, "name": n} for i, n in zip(self.ids[1:], self.names[1:])]
