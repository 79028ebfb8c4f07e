"""Batching: collate, the loader of training steps (this rank's share of each of the epoch's global
batches, plan.py) and the loader of evaluation. A step's batches are a pure function of (seed, epoch,
world size, rank): a resumed run starts at its global batch without loading a single image before it."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..lifetime.stop import leave_process_group
from .plan import BatchLayout, GlobalBatch, RankShare, RankShares, epoch_plan

Batch = tuple[list[torch.Tensor], list[dict[str, Any]]]


def collate(batch: Sequence[tuple[torch.Tensor, dict[str, Any]]]) -> Batch:
    """(image, target) pairs -> (images, targets) lists; never stacked (sizes and box counts differ)."""
    return [image for image, _ in batch], [target for _, target in batch]


def aspect_ratio_bins(group_factor: int) -> list[float]:
    """Bin edges as in torchvision's references: 2k+1 edges from 1/2 to 2, log-spaced; [1.0] for k=0."""
    if group_factor < 0:
        raise ValueError(f"group_factor must be >= 0 to group, got {group_factor}")
    if group_factor == 0:
        return [1.0]
    return (2 ** np.linspace(-1, 1, 2 * group_factor + 1)).tolist()


def aspect_ratio_groups(aspect_ratios: Sequence[float], group_factor: int) -> list[int]:
    """The bin of every width/height ratio (torchvision's `_quantize`)."""
    bins = aspect_ratio_bins(group_factor)
    return [bisect.bisect_right(bins, r) for r in aspect_ratios]


def eval_indices(num_samples: int, *, rank: int, world_size: int) -> list[int]:
    """Unpadded sharding for evaluation: each image on exactly one rank (ranks may differ by one)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    return list(range(rank, num_samples, world_size))


def eval_rounds(num_samples: int, batch_size: int, *, world_size: int = 1) -> int:
    """Batches of the largest evaluation shard (rank 0's): what every rank iterates to stay in step."""
    return math.ceil(len(eval_indices(num_samples, rank=0, world_size=world_size)) / batch_size)


@dataclass
class MicroBatch:
    """A loaded micro-batch: its images and targets, its index in the global batch (seeds its random
    draws) and its loss weight (its share of the global batch's images; 0: a filler)."""

    images: list[torch.Tensor]
    targets: list[dict[str, Any]]
    micro: int
    weight: Fraction


@dataclass
class StepBatch:
    """What this rank trains on in one step: its micro-batches of one global batch (plan.rank_share)."""

    micro_batches: list[MicroBatch]
    share: RankShare

    @property
    def images(self) -> int:
        """Images this rank trains on with a weight (fillers left out)."""
        return len(self.share.trained)


class StepLoader:
    """The steps of an epoch from a global batch on: one StepBatch per step. One DataLoader reads every
    micro-batch of the rank in order (its workers prefetch across steps); this regroups them per step."""

    def __init__(self, loader: DataLoader, shares: Sequence[RankShare]) -> None:
        self.loader, self.shares = loader, shares

    def __len__(self) -> int:
        return len(self.shares)

    def __iter__(self) -> Iterator[StepBatch]:
        micro_batches = iter(self.loader)
        for share in self.shares:
            loaded = [MicroBatch(*next(micro_batches), m.micro, m.weight) for m in share.micro_batches]
            yield StepBatch(loaded, share)


def build_step_loader(
    dataset: Dataset,
    layout: BatchLayout,
    *,
    epoch: int,
    seed: int,
    groups: Sequence[int] | None = None,
    start_batch: int = 0,
    share: tuple[int, int] = (0, 1),
    plan: Sequence[GlobalBatch] | None = None,
    **options: Any,
) -> StepLoader:
    """Rank r of n's (`share`) part of every global batch of `epoch` (plan.py) from global batch
    `start_batch` on. `groups`: each image's aspect-ratio group (aspect_ratio_groups; None: no grouping);
    `plan`: the epoch's global batches where they are not the plan's (old_order.py); `options`: the
    DataLoader's (num_workers, pin_memory, collate_fn).

    Build one per epoch. `len(loader)` is the number of steps left in the epoch, the same on every rank.
    """
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)  # flips depend on the epoch; set before workers copy the dataset
    if plan is None:
        plan = epoch_plan(len(dataset), layout, epoch=epoch, seed=seed, groups=groups)  # type: ignore[arg-type]
    shares = RankShares(plan, *share, start=start_batch)  # each made as the loader reaches it
    return StepLoader(_loader(dataset, MicroBatches(shares), **options), shares)


class MicroBatches:
    """The DataLoader's batches: every micro-batch of `shares`, in order, made as the loader asks for them."""

    def __init__(self, shares: RankShares) -> None:
        self.shares = shares

    def __iter__(self) -> Iterator[list[int]]:
        for share in self.shares:
            for micro in share.micro_batches:
                yield list(micro.indices)

    def __len__(self) -> int:
        return self.shares.micro_batch_count()


def build_eval_loader(
    dataset: Dataset, batch_size: int, *, rank: int = 0, world_size: int = 1, num_workers: int = 0
) -> DataLoader:
    """A loader over this rank's unpadded evaluation shard, in dataset order.

    Ranks may get different numbers of batches (no image is counted twice), so nothing inside the
    loop may be a collective; merge results across ranks after it.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    indices = eval_indices(len(dataset), rank=rank, world_size=world_size)  # type: ignore[arg-type]
    batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    return _loader(dataset, batches, num_workers=num_workers, pin_memory=False)


def _loader(
    dataset: Dataset,
    batches: Iterable[list[int]],
    *,
    num_workers: int = 0,
    pin_memory: bool = False,
    collate_fn: Callable[[Sequence[tuple[torch.Tensor, dict[str, Any]]]], Batch] = collate,
) -> DataLoader:
    # No persistent_workers: loaders are built per epoch (the batch list and the flips change), so
    # persistent workers would be thrown away with their loader anyway.
    return DataLoader(
        dataset,
        batch_sampler=batches,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        worker_init_fn=leave_process_group,  # a signal to the trainer's group must not kill its workers
    )
