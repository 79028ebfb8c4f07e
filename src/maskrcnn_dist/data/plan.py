"""The training position that does not depend on the number of ranks: an epoch is one list of global
batches, and a rank takes its share of each.

A run's `BatchLayout` is fixed when it starts and kept in its checkpoints: a global batch is
`micro_batches` micro-batches of at most `batch_size` images (the launch's world size and
--batch-size). `epoch_plan` (seed, epoch) -> the epoch's global batches, aspect-ratio grouping done
over the whole epoch; `rank_share` (global batch, rank r of n) -> the micro-batches rank r runs and the
weight of each (its share of the global batch's images). Both are pure functions: a resume on another
number of ranks, or an in-place change of world size inside an epoch, continues the same sequence.

Invariants, whatever the world size n:
- every image of the epoch is in exactly one micro-batch of one global batch (no padding, no repeat);
- the ranks' real micro-batches of a global batch are its micro-batches, each on one rank, and their
  weights sum to one; a micro-batch keeps its index (its random draws are seeded by it);
- steps per epoch are ceil(images / global batch), so the learning-rate schedule does not move;
- every rank runs the same number of micro-batches in a step (DDP's and SyncBatchNorm's collectives
  pair up): a rank with fewer real ones runs fillers of weight 0 (one image, trained on but
  contributing nothing), which happens only where n does not divide the global batch's micro-batches.

At the launch's world size a global batch of full micro-batches gives rank r exactly micro-batch r,
of weight 1/n: the batches torch's DistributedSampler gave rank r (the same permutation, rank r's
interleaved share), and a step the same step as before.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, overload

import numpy as np
import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchLayout:
    """What a global batch is: `micro_batches` micro-batches of at most `batch_size` images."""

    micro_batches: int
    batch_size: int

    def __post_init__(self) -> None:
        if self.micro_batches < 1 or self.batch_size < 1:
            raise ValueError(f"a global batch needs >= 1 micro-batch of >= 1 image, got {self}")

    @property
    def global_batch_size(self) -> int:
        return self.micro_batches * self.batch_size

    def steps_per_epoch(self, num_samples: int, drop_last: bool = False) -> int:
        """Global batches per epoch, whatever the world size (the schedule's iterations per epoch)."""
        size = self.global_batch_size
        return num_samples // size if drop_last else math.ceil(num_samples / size)

    def to_state(self) -> dict[str, int]:
        return {"micro_batches": self.micro_batches, "batch_size": self.batch_size}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> BatchLayout:
        return cls(int(state["micro_batches"]), int(state["batch_size"]))


@dataclass(frozen=True)
class GlobalBatch:
    """One optimizer step's images: its micro-batches of dataset indices, in micro-batch order."""

    micro_batches: tuple[tuple[int, ...], ...]

    @property
    def images(self) -> int:
        return sum(len(m) for m in self.micro_batches)


@dataclass(frozen=True)
class MicroShare:
    """A micro-batch a rank runs: its index in the global batch (what seeds its random draws), its
    dataset indices and its loss weight (its share of the global batch's images; 0: a filler)."""

    micro: int
    indices: tuple[int, ...]
    weight: Fraction

    @property
    def filler(self) -> bool:
        return self.weight == 0


@dataclass(frozen=True)
class RankShare:
    """What one rank runs of one global batch, fillers included; `weight` is the sum of its micro-batches'."""

    micro_batches: tuple[MicroShare, ...]

    @property
    def weight(self) -> Fraction:
        return sum((m.weight for m in self.micro_batches), Fraction(0))

    @property
    def trained(self) -> tuple[int, ...]:
        """The dataset indices this rank trains on with a weight (fillers left out)."""
        return tuple(i for m in self.micro_batches if not m.filler for i in m.indices)


def epoch_order(num_samples: int, *, epoch: int, seed: int, shuffle: bool) -> np.ndarray:
    """The epoch's order of all images: DistributedSampler's permutation (a generator seeded seed + epoch)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=generator).numpy()


class EpochPlan(Sequence[GlobalBatch]):
    """An epoch's global batches (epoch_plan), each made when it is asked for: the images in batch order
    as one array and where each global batch starts in it. At COCO's size that is one 1 MiB array where
    a list of 59k batches was ~6 objects each, built at every start and epoch and rescanned by the
    garbage collector (docs/performance-data.md, issue 57)."""

    def __init__(self, order: np.ndarray, starts: np.ndarray, micro_batches: int) -> None:
        self._order, self._starts, self._micro_batches = order, starts, micro_batches

    def __len__(self) -> int:
        return len(self._starts) - 1

    @overload
    def __getitem__(self, index: int) -> GlobalBatch: ...

    @overload
    def __getitem__(self, index: slice) -> list[GlobalBatch]: ...

    def __getitem__(self, index: int | slice) -> GlobalBatch | list[GlobalBatch]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        b = range(len(self))[index]  # an IndexError past either end ends iteration
        return _cut(self._order[self._starts[b] : self._starts[b + 1]].tolist(), self._micro_batches)

    def shares(self, rank: int, world_size: int, start: int = 0) -> RankShares:
        """Rank `rank` of `world_size`'s share of each global batch from `start` on (rank_share)."""
        return RankShares(self, rank, world_size, start)

    def micro_batch_counts(self) -> np.ndarray:
        """How many micro-batches each global batch has (fewer than the layout's in a short last one)."""
        return np.minimum(np.diff(self._starts), self._micro_batches)


def epoch_plan(
    num_samples: int,
    layout: BatchLayout,
    *,
    epoch: int,
    seed: int,
    shuffle: bool = True,
    groups: Sequence[int] | None = None,
    drop_last: bool = False,
) -> EpochPlan:
    """The epoch's global batches. `groups`: each image's aspect-ratio group (None: no grouping); a
    global batch then holds one group's images where it can (grouped_batches)."""
    if groups is not None and len(groups) != num_samples:
        raise ValueError("aspect-ratio grouping needs one group per sample")
    order = epoch_order(num_samples, epoch=epoch, seed=seed, shuffle=shuffle)
    size = layout.global_batch_size
    if groups is not None:
        listed = order.tolist()
        batches = grouped_batches(listed, [groups[i] for i in listed], size)
        order = np.fromiter(itertools.chain.from_iterable(batches), np.int64, num_samples)
        starts = np.cumsum([0, *map(len, batches)], dtype=np.int64)
    else:
        starts = np.append(np.arange(0, num_samples, size, dtype=np.int64), num_samples)
    if drop_last and len(starts) > 1 and starts[-1] - starts[-2] < size:
        starts = starts[:-1]
    return EpochPlan(order, starts, layout.micro_batches)


def _cut(batch: list[int], micro_batches: int) -> GlobalBatch:
    """Micro-batch k takes every k-th image (DistributedSampler's interleaving); a short last global
    batch has as many micro-batches as it can fill, their sizes differing by at most one."""
    count = min(micro_batches, len(batch))
    return GlobalBatch(tuple(tuple(batch[k::count]) for k in range(count)))


def grouped_batches(order: list[int], groups: list[int], batch_size: int) -> list[list[int]]:
    """Batches of one aspect-ratio group each, as they fill in `order`; then the leftovers.

    torchvision's GroupedBatchSampler fills its leftover batches by repeating samples of one group and
    leaves other leftovers out. Here the leftovers are concatenated in group order (neighbouring
    groups have similar shapes) and cut into batches: every sample of the epoch is used exactly once
    and the batch count, ceil(len(order) / batch_size), depends on the sample count alone.
    """
    full: list[list[int]] = []
    buffers: dict[int, list[int]] = {}
    for index, group in zip(order, groups, strict=True):
        buffer = buffers.setdefault(group, [])
        buffer.append(index)
        if len(buffer) == batch_size:
            full.append(buffer)
            buffers[group] = []
    leftovers = [i for group in sorted(buffers) for i in buffers[group]]
    return full + [leftovers[i : i + batch_size] for i in range(0, len(leftovers), batch_size)]


def rank_share(batch: GlobalBatch, rank: int, world_size: int) -> RankShare:
    """Rank `rank` of `world_size` takes micro-batches rank, rank + n, ...; each weighs its images'
    share of the global batch. Every rank runs ceil(micro-batches / n) of them: a rank short of real
    ones runs fillers (the batch's first image, weight 0) so that collectives pair up."""
    _check_rank(rank, world_size)
    total, count = batch.images, len(batch.micro_batches)
    micro = batch.micro_batches
    mine = [MicroShare(k, micro[k], Fraction(len(micro[k]), total)) for k in range(rank, count, world_size)]
    rounds = math.ceil(count / world_size)
    # A filler's index is past the real ones' (its draws are nobody's), distinct per rank and round.
    fillers = [MicroShare(count + rank + i * world_size, micro[0][:1], Fraction(0)) for i in range(rounds - len(mine))]
    return RankShare(tuple(mine + fillers))


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")


class RankShares(Sequence[RankShare]):
    """A rank's share of each global batch of a plan from `start` on, each made when it is asked for (an
    EpochPlan, or global batches listed whole: old_order.py's)."""

    def __init__(self, plan: Sequence[GlobalBatch], rank: int, world_size: int, start: int = 0) -> None:
        if not 0 <= start <= len(plan):
            raise ValueError(f"start_batch {start} is outside the epoch's {len(plan)} global batches")
        _check_rank(rank, world_size)
        self.plan, self.rank, self.world_size, self.start = plan, rank, world_size, start

    def __len__(self) -> int:
        return len(self.plan) - self.start

    @overload
    def __getitem__(self, index: int) -> RankShare: ...

    @overload
    def __getitem__(self, index: slice) -> list[RankShare]: ...

    def __getitem__(self, index: int | slice) -> RankShare | list[RankShare]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return rank_share(self.plan[self.start + range(len(self))[index]], self.rank, self.world_size)

    def micro_batch_count(self) -> int:
        """The micro-batches this rank runs over these shares, fillers included (every rank runs as many)."""
        plan = self.plan
        if isinstance(plan, EpochPlan):
            counts = plan.micro_batch_counts()
        else:  # global batches listed whole
            counts = np.array([len(batch.micro_batches) for batch in plan], dtype=np.int64)
        return int((-(-counts[self.start :] // self.world_size)).sum())


def share_at(
    num_samples: int,
    layout: BatchLayout,
    *,
    epoch: int,
    batch: int,
    rank: int,
    world_size: int,
    seed: int,
    groups: Sequence[int] | None = None,
) -> RankShare:
    """Global batch `batch` of `epoch`, rank r of n -> its micro-batches and their weights."""
    plan = epoch_plan(num_samples, layout, epoch=epoch, seed=seed, groups=groups)
    return rank_share(plan[batch], rank, world_size)


def layout_of_run(
    saved: Mapping[str, Any] | None, batch_size: int, world_size: int, announce: bool = True
) -> BatchLayout:
    """The layout a run trains with: a checkpoint's (its global batch and sequence go on at any world
    size), else this launch's (world size x --batch-size). With `announce` (the main process), one log
    line says that a resume changed the world size or does not use --batch-size."""
    if saved is None or LAYOUT_KEY not in saved:  # a fresh run, or a checkpoint cut for this world size
        return BatchLayout(world_size, batch_size)
    layout = BatchLayout.from_state(saved[LAYOUT_KEY])
    before = int(saved.get(WORLD_SIZE_KEY, world_size))
    if announce and (change := layout_change(layout, before, batch_size, world_size)):
        log.info("%s", change)
    return layout


def layout_change(layout: BatchLayout, before: int, batch_size: int, world_size: int) -> str | None:
    """The line that says how a resume at `world_size` from a checkpoint written at `before` trains."""
    notes = []
    if before != world_size:
        rounds = math.ceil(layout.micro_batches / world_size)
        notes.append(
            f"world size {before} -> {world_size}: the global batch stays {layout.global_batch_size} images "
            f"({layout.micro_batches} micro-batches of {layout.batch_size}), {rounds} micro-batch(es) per rank per step"
            + _idle_ranks(layout.micro_batches, world_size)
        )
    if batch_size != layout.batch_size:
        notes.append(f"--batch-size {batch_size} is not used: the run's micro-batches hold {layout.batch_size}")
    return ("resume: " + "; ".join(notes)) if notes else None


def _idle_ranks(micro_batches: int, world_size: int) -> str:
    """What the ranks without a real micro-batch of their own do (rank_share's fillers), in words; empty when
    every rank trains in every full step."""
    idle = world_size - micro_batches
    short = micro_batches % world_size
    if idle > 0:
        ranks = f"rank {micro_batches}" if idle == 1 else f"ranks {micro_batches}-{world_size - 1}"
        return (
            f"; {ranks} train{'s' if idle == 1 else ''} nothing: a filler of weight 0 each step keeps the "
            "collectives paired (more ranks than micro-batches add no speed)"
        )
    if short:
        ranks = f"rank {short}" if world_size - short == 1 else f"ranks {short}-{world_size - 1}"
        return f"; {ranks} run{'s' if world_size - short == 1 else ''} a filler of weight 0 in the last round"
    return ""


#: The checkpoint's keys for the run's layout and the world size that wrote it.
LAYOUT_KEY = "batch_layout"
WORLD_SIZE_KEY = "world_size"
