"""The order of an epoch begun before the batch plan (plan.py), so that a resume finishes it as it began.

Before the plan, each of the run's n ranks took torch's DistributedSampler share of the epoch's permutation
(the permutation padded by repeating its first images until every rank had ceil(images / n)), grouped its
share by aspect ratio itself, and cut it into batches of --batch-size; a checkpoint kept (epoch, batch) and
not n. `old_epoch_plan` rebuilds such an epoch as the plan's global batches: global batch b holds every
rank's batch b, micro-batch r rank r's, with the padding's repeats left out. So the rest of the epoch can
be shared by any number of ranks (plan.rank_share), every image of it is trained on once, and at the old
world size each rank takes its old batches (but where leaving a repeat out empties a micro-batch: the step
keeps its images, the ranks after it shift by one). Its steps per epoch are the plan's for a global batch
of n x --batch-size: ceil(ceil(images / n) / batch) = ceil(images / (n x batch)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .plan import GlobalBatch, epoch_order, grouped_batches

#: The checkpoint key of a run that still finishes an epoch in its old order: {"epoch": e, "world_size": n}.
OLD_ORDER_KEY = "old_order"


@dataclass(frozen=True)
class OldOrder:
    """Epoch `epoch` goes on in the order `world_size` ranks began it in before the batch plan."""

    epoch: int
    world_size: int

    def to_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "world_size": self.world_size}

    @classmethod
    def from_state(cls, state: Any) -> OldOrder:
        return cls(int(state["epoch"]), int(state["world_size"]))


def old_epoch_plan(
    num_samples: int,
    batch_size: int,
    world_size: int,
    *,
    epoch: int,
    seed: int,
    groups: Sequence[int] | None = None,
    shuffle: bool = True,
) -> list[GlobalBatch]:
    """The epoch as `world_size` ranks trained it before the plan, as global batches (module docstring)."""
    if not 1 <= world_size <= num_samples:
        raise ValueError(f"an old order needs 1 <= world size <= images, got {world_size} for {num_samples}")
    order = epoch_order(num_samples, epoch=epoch, seed=seed, shuffle=shuffle).tolist()
    per_rank = math.ceil(num_samples / world_size)
    padded = order + order[: per_rank * world_size - num_samples]  # DistributedSampler's padding
    rank_batches = []
    for rank in range(world_size):
        # Positions in the padded list: a position past the permutation is a repeat.
        positions = list(range(rank, len(padded), world_size))
        if groups is None:
            batches = [positions[i : i + batch_size] for i in range(0, len(positions), batch_size)]
        else:
            batches = grouped_batches(positions, [groups[padded[p]] for p in positions], batch_size)
        rank_batches.append(batches)
    steps = len(rank_batches[0])
    plan = []
    for b in range(steps):
        micro = (tuple(padded[p] for p in batches[b] if p < num_samples) for batches in rank_batches)
        plan.append(GlobalBatch(tuple(m for m in micro if m)))
    return plan


def repeated_images(num_samples: int, world_size: int) -> int:
    """How many images the old order trained twice in each epoch (DistributedSampler's padding)."""
    return math.ceil(num_samples / world_size) * world_size - num_samples
