"""A training dataset's samples through a per-sample transform drawn from (seed, epoch, index): the base
of the flip (flip.py) and the augmentations (augment.py). The loader sets the epoch
(loader.build_step_loader) before its workers copy the wrapper; the dataset under it never changes."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset

Target = dict[str, Any]


class EpochSamples(Dataset):
    """`dataset`'s samples, each through `transform(image, target, index)` of the epoch set last."""

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def aspect_ratios(self) -> list[float]:
        return self.dataset.aspect_ratios()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, Target]:
        image, target = self.dataset[index]
        return self.transform(image, target, index % len(self))

    def transform(self, image: torch.Tensor, target: Target, index: int) -> tuple[torch.Tensor, Target]:
        raise NotImplementedError
