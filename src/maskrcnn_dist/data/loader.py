"""Batching: collate, the loaders of training steps (the epoch's global batches, plan.py, and this
rank's share of each) and of evaluation, and the per-rank batch lists of one world size.

An epoch's batches are computed eagerly as a list of index lists. That makes them a pure function of
(seed, epoch, rank, world size, ...): a resumed run slices the list and skips finished batches
without loading a single image, and every rank can be checked to get the same number of batches.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..lifetime.stop import leave_process_group
from .plan import BatchLayout, GlobalBatch, RankShare, epoch_plan, grouped_batches, rank_share

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


def rank_indices(num_samples: int, *, epoch: int, seed: int, shuffle: bool, rank: int, world_size: int) -> list[int]:
    """This rank's sample order for the epoch, exactly as `DistributedSampler` gives it.

    The list is padded by repeating the first samples so every rank gets ceil(n / world_size).
    """
    if num_samples == 0:
        return []
    # DistributedSampler only calls len() on the dataset, so a range stands in for it.
    sampler = DistributedSampler(
        range(num_samples), num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed, drop_last=False
    )
    sampler.set_epoch(epoch)
    return list(sampler)


def epoch_batches(
    num_samples: int,
    batch_size: int,
    *,
    epoch: int,
    seed: int,
    shuffle: bool,
    rank: int = 0,
    world_size: int = 1,
    aspect_ratios: Sequence[float] | None = None,
    group_factor: int = -1,
    drop_last: bool = False,
) -> list[list[int]]:
    """The batches of dataset indices that `rank` processes in `epoch`.

    Every rank gets ceil(m / batch_size) batches (floor with `drop_last`), m = ceil(num_samples /
    world_size), so DDP ranks stay in lockstep. `group_factor >= 0` groups images of similar aspect
    ratio (needs `aspect_ratios`); -1 disables grouping, as in torchvision.
    """
    _check_batch_args(num_samples, batch_size, rank, world_size, aspect_ratios, group_factor)
    order = rank_indices(num_samples, epoch=epoch, seed=seed, shuffle=shuffle, rank=rank, world_size=world_size)
    if group_factor >= 0:
        assert aspect_ratios is not None  # checked above; tells the type checker
        groups = aspect_ratio_groups(aspect_ratios, group_factor)
        batches = grouped_batches(order, [groups[i] for i in order], batch_size)
    else:
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def _check_batch_args(
    num_samples: int,
    batch_size: int,
    rank: int,
    world_size: int,
    aspect_ratios: Sequence[float] | None,
    group_factor: int,
) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    if group_factor >= 0 and (aspect_ratios is None or len(aspect_ratios) != num_samples):
        raise ValueError("aspect-ratio grouping needs one aspect ratio per sample")


def eval_indices(num_samples: int, *, rank: int, world_size: int) -> list[int]:
    """Unpadded sharding for evaluation: each image on exactly one rank (ranks may differ by one)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")
    return list(range(rank, num_samples, world_size))


def eval_rounds(num_samples: int, batch_size: int, *, world_size: int = 1) -> int:
    """Batches of the largest evaluation shard (rank 0's): what every rank iterates to stay in step."""
    return math.ceil(len(eval_indices(num_samples, rank=0, world_size=world_size)) / batch_size)


def build_train_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    epoch: int,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    group_factor: int = -1,
    num_workers: int = 0,
    start_batch: int = 0,
    pin_memory: bool = False,
    drop_last: bool = False,
    collate_fn: Callable[[Sequence[tuple[torch.Tensor, dict[str, Any]]]], Batch] = collate,
) -> DataLoader:
    """A loader over this rank's shuffled batches of `epoch`, starting at batch `start_batch` (resume).

    Build one per epoch. `len(loader)` is the number of batches left in the epoch. `collate_fn`: what
    makes a batch of the samples (batch-level augmentation: data/transforms/copy_paste.py).
    """
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)  # flips depend on the epoch; set before workers copy the dataset
    ratios = dataset.aspect_ratios() if group_factor >= 0 else None  # type: ignore[attr-defined]
    batches = epoch_batches(
        len(dataset),  # type: ignore[arg-type]
        batch_size,
        epoch=epoch,
        seed=seed,
        shuffle=True,
        rank=rank,
        world_size=world_size,
        aspect_ratios=ratios,
        group_factor=group_factor,
        drop_last=drop_last,
    )
    if not 0 <= start_batch <= len(batches):
        raise ValueError(f"start_batch {start_batch} is outside the epoch's {len(batches)} batches")
    return _loader(
        dataset, batches[start_batch:], num_workers=num_workers, pin_memory=pin_memory, collate_fn=collate_fn
    )


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

    def __init__(self, loader: DataLoader, shares: list[RankShare]) -> None:
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
    if not 0 <= start_batch <= len(plan):
        raise ValueError(f"start_batch {start_batch} is outside the epoch's {len(plan)} global batches")
    shares = [rank_share(batch, *share) for batch in plan[start_batch:]]
    micro_batches = [list(m.indices) for share in shares for m in share.micro_batches]
    return StepLoader(_loader(dataset, micro_batches, **options), shares)


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
    batches: list[list[int]],
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


def num_train_batches(num_samples: int, batch_size: int, *, world_size: int = 1, drop_last: bool = False) -> int:
    """Batches per epoch on every rank, without building the list (for schedules and progress)."""
    per_rank = math.ceil(num_samples / world_size)
    return per_rank // batch_size if drop_last else math.ceil(per_rank / batch_size)
