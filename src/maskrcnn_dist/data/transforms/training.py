"""The training loader of a run: its dataset through --data-augmentation (the flip: flip.py; multiscale,
lsj: augment.py), batched by collate or copy-paste's (copy_paste.py), over the rank's share of each
global batch of an epoch (data/plan.py, data/loader.py). Invariant: the same (epoch, global batch)
gives the same samples on any rank count (transforms/ draw from the seed, the epoch and the image)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ...config import TrainConfig
from ..dataset import CocoInstanceDataset
from ..loader import StepLoader, aspect_ratio_groups, build_step_loader, collate
from ..old_order import OldOrder, old_epoch_plan
from ..plan import BatchLayout
from .flip import Flipped


class Feeder(Protocol):
    """What the loaders need of the engine that consumes them."""

    data_rank: int
    data_world_size: int
    pin_memory: bool


def train_loaders(
    cfg: TrainConfig,
    train_set: CocoInstanceDataset,
    feeder: Feeder,
    layout: BatchLayout | None = None,
    old_order: OldOrder | None = None,
) -> Callable[[int, int], StepLoader]:
    """(epoch, first global batch) -> the loader of `feeder`'s share of that epoch's global batches of
    `layout` (plan.py; default: this launch's, world size x --batch-size; `old_order`'s epoch: the order it
    began in before the plan, old_order.py), one StepBatch per step: the dataset
    through --data-augmentation, batched by collate or, with --use-copypaste, by copy-paste's."""
    # Imported here: torchvision's v2 transforms cost every process that imports the trainer without
    # training (check-data, predict, profile, a loader benchmark) a third of a second and ~160 MiB.
    from .augment import AugmentedDataset, build_augmentation
    from .copy_paste import CopyPaste

    data = cfg.data
    augmentation = build_augmentation(data.data_augmentation, cfg.model.min_size, cfg.model.max_size)
    if augmentation is None:  # 8-bit images cross as bytes unless copy-paste blends them on the host
        samples = Flipped(train_set, cfg.seed, uint8=not data.use_copypaste)
    else:
        samples = AugmentedDataset(train_set, augmentation, cfg.seed)

    layout = layout or BatchLayout(feeder.data_world_size, data.batch_size)
    factor = data.aspect_ratio_group_factor
    groups = aspect_ratio_groups(train_set.aspect_ratios(), factor) if factor >= 0 else None

    def loader(epoch: int, start_batch: int) -> StepLoader:
        plan = None
        if old_order is not None and epoch == old_order.epoch:
            plan = old_epoch_plan(
                len(train_set), layout.batch_size, old_order.world_size, epoch=epoch, seed=cfg.seed, groups=groups
            )
        return build_step_loader(
            samples,
            layout,
            epoch=epoch,
            seed=cfg.seed,
            groups=groups,
            share=(feeder.data_rank, feeder.data_world_size),
            num_workers=data.workers,
            start_batch=start_batch,
            plan=plan,
            pin_memory=feeder.pin_memory,
            collate_fn=CopyPaste(cfg.seed, epoch) if data.use_copypaste else collate,
        )

    return loader
