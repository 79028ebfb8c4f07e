"""The trainer's data: COCO instances dataset, synthetic COCO generator, batching and loaders."""

from maskrcnn_dist.data.coco import CocoInstanceDataset, flip_decision, hflip
from maskrcnn_dist.data.image_file import read_image
from maskrcnn_dist.data.layout import ensure_synthetic, find_split, load_datasets
from maskrcnn_dist.data.loader import (
    aspect_ratio_groups,
    build_eval_loader,
    build_train_loader,
    collate,
    epoch_batches,
    eval_indices,
    eval_rounds,
    num_train_batches,
    rank_indices,
)
from maskrcnn_dist.data.sources import DataSources, SplitSource
from maskrcnn_dist.data.synthetic import (
    SyntheticCoco,
    SyntheticSplits,
    generate_synthetic_coco,
    write_train_val,
)

__all__ = [
    "DataSources",
    "SplitSource",
    "ensure_synthetic",
    "find_split",
    "load_datasets",
    "CocoInstanceDataset",
    "SyntheticCoco",
    "SyntheticSplits",
    "aspect_ratio_groups",
    "build_eval_loader",
    "build_train_loader",
    "collate",
    "epoch_batches",
    "eval_indices",
    "eval_rounds",
    "flip_decision",
    "generate_synthetic_coco",
    "hflip",
    "read_image",
    "num_train_batches",
    "rank_indices",
    "write_train_val",
]
