"""Batching: collate, a rank's deterministic steps, grouping, resume at a global batch, eval sharding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from maskrcnn_dist.data import (
    BatchLayout,
    CocoInstanceDataset,
    aspect_ratio_groups,
    build_eval_loader,
    build_step_loader,
    collate,
    epoch_plan,
    generate_synthetic_coco,
)
from maskrcnn_dist.data.loader import StepLoader
from maskrcnn_dist.data.transforms.flip import Flipped


class _FakeDataset(torch.utils.data.Dataset):
    """Index-returning dataset that records what was loaded and the epoch it was told."""

    def __init__(self, n: int, ratios: list[float] | None = None) -> None:
        self.n = n
        self.ratios = ratios or [1.0] * n
        self.loaded: list[int] = []
        self.epoch = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, dict[str, Any]]:
        self.loaded.append(idx)
        return torch.zeros(3, 4, 4), {"image_id": idx, "boxes": torch.zeros(idx % 3, 4)}

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def aspect_ratios(self) -> list[float]:
        return self.ratios


def _ids(loader: torch.utils.data.DataLoader) -> list[list[int]]:
    return [[t["image_id"] for t in targets] for _, targets in loader]


def _step_ids(loader: StepLoader) -> list[list[int]]:
    """Each step's image ids, over its micro-batches."""
    return [[t["image_id"] for m in step.micro_batches for t in m.targets] for step in loader]


def test_collate_keeps_images_and_per_image_box_counts() -> None:
    batch = [(torch.zeros(3, 4, 5), {"boxes": torch.zeros(n, 4)}) for n in (0, 3, 1)]
    images, targets = collate(batch)
    assert isinstance(images, list) and isinstance(targets, list)
    assert [t["boxes"].shape[0] for t in targets] == [0, 3, 1]
    assert all(image is b[0] for image, b in zip(images, batch, strict=True))


def test_a_rank_s_steps_are_deterministic_and_shuffled_per_epoch() -> None:
    def ids(**args: Any) -> list[list[int]]:
        return _step_ids(build_step_loader(_FakeDataset(50), BatchLayout(2, 4), share=(1, 2), **args))

    assert ids(epoch=2, seed=5) == ids(epoch=2, seed=5)
    assert ids(epoch=2, seed=5) != ids(epoch=3, seed=5)
    assert ids(epoch=2, seed=5) != ids(epoch=2, seed=6)
    rank0 = _step_ids(build_step_loader(_FakeDataset(50), BatchLayout(2, 4), epoch=2, seed=5, share=(0, 2)))
    assert sorted(i for step in ids(epoch=2, seed=5) + rank0 for i in step) == list(range(50))


def test_the_plan_drops_only_a_short_final_global_batch() -> None:
    for groups in (None, [0, 1] * 5):
        plan = epoch_plan(10, BatchLayout(1, 3), epoch=0, seed=0, groups=groups, drop_last=True)
        assert len(plan) == 3 == BatchLayout(1, 3).steps_per_epoch(10, drop_last=True)
        assert all(batch.images == 3 for batch in plan)


def test_grouping_puts_same_bin_images_together() -> None:
    assert aspect_ratio_groups([0.4, 0.9, 1.0, 1.5, 3.0], 0) == [0, 0, 1, 1, 1]
    assert aspect_ratio_groups([0.4, 0.9, 1.0, 1.5, 3.0], 1) == [0, 1, 2, 2, 3]
    ratios = [0.5 if i % 3 else 1.6 for i in range(60)]
    layout = BatchLayout(1, 4)
    batches = [
        list(b.micro_batches[0]) for b in epoch_plan(60, layout, epoch=0, seed=1, groups=aspect_ratio_groups(ratios, 0))
    ]
    mixed = [b for b in batches if len({ratios[i] for i in b}) > 1]
    assert len(mixed) <= 1  # only the leftovers, concatenated at the end, may mix two bins
    assert all(batches.index(b) == len(batches) - 1 for b in mixed)
    ungrouped = [list(b.micro_batches[0]) for b in epoch_plan(60, layout, epoch=0, seed=1)]
    assert sum(len({ratios[i] for i in b}) > 1 for b in ungrouped) > 5  # grouping is what did it


def test_the_step_loader_resumes_mid_epoch_without_loading_skipped_images() -> None:
    dataset = _FakeDataset(20)
    layout, place = BatchLayout(2, 3), {"epoch": 4, "seed": 9, "share": (1, 2)}
    full = _step_ids(build_step_loader(dataset, layout, **place))
    assert dataset.epoch == 4
    dataset.loaded.clear()
    resumed = build_step_loader(dataset, layout, start_batch=2, **place)
    assert len(resumed) == len(full) - 2
    assert _step_ids(resumed) == full[2:]
    assert sorted(dataset.loaded) == sorted(i for step in full[2:] for i in step)
    assert _step_ids(build_step_loader(dataset, layout, start_batch=4, **place)) == []
    with pytest.raises(ValueError, match="start_batch"):
        build_step_loader(dataset, layout, start_batch=5, **place)


def test_the_step_loader_groups_by_the_groups_it_is_given() -> None:
    ratios = [0.5 if i % 2 else 2.0 for i in range(16)]
    groups = aspect_ratio_groups(ratios, 0)
    loader = build_step_loader(_FakeDataset(16, ratios), BatchLayout(1, 4), epoch=0, seed=0, groups=groups)
    assert all(len({ratios[i] for i in step}) == 1 for step in _step_ids(loader))


def test_eval_sharding_covers_each_image_exactly_once() -> None:
    dataset = _FakeDataset(11)
    for world in (1, 2, 3, 4, 12):
        seen = [i for r in range(world) for b in _ids(build_eval_loader(dataset, 2, rank=r, world_size=world))
                for i in b]  # fmt: skip
        assert sorted(seen) == list(range(11)), world
    first = _ids(build_eval_loader(dataset, 2, rank=1, world_size=3))
    assert first == [[1, 4], [7, 10]]  # dataset order, unshuffled


def test_the_step_loader_with_two_workers_matches_in_process(tmp_path: Path) -> None:
    out = generate_synthetic_coco(tmp_path, num_images=6, image_size=(40, 64), max_objects=2, seed=0)
    dataset = Flipped(CocoInstanceDataset(out.image_dir, out.annotation_file), 1)
    groups = aspect_ratio_groups(dataset.aspect_ratios(), 0)
    kwargs = {"epoch": 1, "seed": 2, "groups": groups}
    serial = list(build_step_loader(dataset, BatchLayout(1, 2), num_workers=0, **kwargs))
    dataset.set_epoch(0)  # the loader must set the epoch itself, before the workers start
    parallel = list(build_step_loader(dataset, BatchLayout(1, 2), num_workers=2, **kwargs))
    assert len(serial) == len(parallel) == 3
    for step_a, step_b in zip(serial, parallel, strict=True):
        (a,), (b,) = step_a.micro_batches, step_b.micro_batches
        assert [t["image_id"] for t in a.targets] == [t["image_id"] for t in b.targets]
        assert all(torch.equal(x, y) for x, y in zip(a.images, b.images, strict=True))
        assert all(torch.equal(x["masks"], y["masks"]) for x, y in zip(a.targets, b.targets, strict=True))


def test_the_flip_of_uint8_images_is_the_flip_of_float_images(tmp_path: Path) -> None:
    """Flipped(uint8=True) (the training loader's default without copy-paste) hands out uint8 images whose
    float values are the float path's, flipped alike, with the same targets."""
    from maskrcnn_dist.engines.base import as_float_image

    out = generate_synthetic_coco(tmp_path, num_images=6, image_size=(40, 64), max_objects=2, seed=0)
    dataset = CocoInstanceDataset(out.image_dir, out.annotation_file)
    as_float, as_bytes = Flipped(dataset, 1), Flipped(dataset, 1, uint8=True)
    for index in range(len(dataset)):
        (image_f, target_f), (image_u, target_u) = as_float[index], as_bytes[index]
        assert image_u.dtype == torch.uint8
        assert torch.equal(as_float_image(image_u), image_f)
        assert torch.equal(target_u["boxes"], target_f["boxes"]) and torch.equal(target_u["masks"], target_f["masks"])
