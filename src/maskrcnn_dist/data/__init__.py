"""The trainer's data: COCO instances dataset, synthetic COCO generator, batching and loaders.

The names below are imported when first asked for (PEP 562), not with the package: the modules that
find, parse and cache a dataset (resolve, store, cache, parse_ahead) need no torch, and the command line
starts parsing a large annotation file with them while torch is still being imported (parse_ahead.py).
"""

from __future__ import annotations

import importlib
from typing import Any

# Each public name and the module of this package that defines it.
_HOME = {
    "CocoInstanceDataset": "dataset",
    "flip_decision": "dataset",
    "hflip": "dataset",
    "read_image": "images.image_file",
    "ensure_synthetic": "prepare",
    "find_split": "prepare",
    "load_datasets": "prepare",
    "open_split": "prepare",
    "aspect_ratio_groups": "loader",
    "build_eval_loader": "loader",
    "build_train_loader": "loader",
    "collate": "loader",
    "epoch_batches": "loader",
    "eval_indices": "loader",
    "eval_rounds": "loader",
    "num_train_batches": "loader",
    "rank_indices": "loader",
    "DataSources": "sources",
    "SplitSource": "sources",
    "SyntheticCoco": "synthetic",
    "SyntheticSplits": "synthetic",
    "generate_synthetic_coco": "synthetic",
    "write_train_val": "synthetic",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
