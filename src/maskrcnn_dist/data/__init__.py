"""The trainer's data. Its front door is prepare.py: from a run's flags to datasets checked and built
whole, and their loaders. The rooms below it import downward only (tests/test_layering.py):

    cache < annotations/ < classes < sources/ < parse_ahead < images/ < check_ahead < synthetic
          < dataset < plan < old_order < loader < transforms/ < prepare

The names below are imported when first asked for (PEP 562), not with the package: annotations/,
sources/, cache and parse_ahead need no torch, and the command line starts parsing a large annotation
file with them while torch is still being imported (parse_ahead.py). The TYPE_CHECKING block names
the same homes for readers and editors (tests/test_faces.py keeps the two equal).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module of this package that defines it.
_HOME = {
    # the front door (prepare.py)
    "flagged_sources": "prepare",
    "open_data": "prepare",
    "OpenedData": "prepare",
    "load_datasets": "prepare",
    "open_split": "prepare",
    "check_split": "prepare",
    "train_loaders": "transforms.training",
    "sources_of": "prepare",
    # what it builds and the pieces its callers name
    "CocoInstanceDataset": "dataset",
    "Split": "dataset",
    "DataSources": "sources",
    "SplitSource": "sources",
    "ParseAhead": "parse_ahead",
    "read_image": "images.image_file",
    "raise_if_bad": "images.check",
    "flip_decision": "transforms.flip",
    "hflip": "transforms.flip",
    "aspect_ratio_groups": "loader",
    "build_eval_loader": "loader",
    "collate": "loader",
    "eval_indices": "loader",
    "eval_rounds": "loader",
    "build_step_loader": "loader",
    "StepBatch": "loader",
    "MicroBatch": "loader",
    "BatchLayout": "plan",
    "LAYOUT_KEY": "plan",
    "WORLD_SIZE_KEY": "plan",
    "epoch_plan": "plan",
    "layout_of_run": "plan",
    "rank_share": "plan",
    "share_at": "plan",
    "SyntheticCoco": "synthetic",
    "SyntheticSplits": "synthetic",
    "ensure_synthetic": "synthetic",
    "generate_synthetic_coco": "synthetic",
    "write_train_val": "synthetic",
}

__all__ = sorted(_HOME)

if TYPE_CHECKING:  # the same names from their homes, for readers and type checkers (tests/test_faces.py)
    from .dataset import CocoInstanceDataset, Split
    from .images.check import raise_if_bad
    from .images.image_file import read_image
    from .loader import (
        MicroBatch,
        StepBatch,
        aspect_ratio_groups,
        build_eval_loader,
        build_step_loader,
        collate,
        eval_indices,
        eval_rounds,
    )
    from .parse_ahead import ParseAhead
    from .plan import LAYOUT_KEY, WORLD_SIZE_KEY, BatchLayout, epoch_plan, layout_of_run, rank_share, share_at
    from .prepare import (
        OpenedData,
        check_split,
        flagged_sources,
        load_datasets,
        open_data,
        open_split,
        sources_of,
    )
    from .sources import DataSources, SplitSource
    from .synthetic import SyntheticCoco, SyntheticSplits, ensure_synthetic, generate_synthetic_coco, write_train_val
    from .transforms.flip import flip_decision, hflip
    from .transforms.training import train_loaders


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
