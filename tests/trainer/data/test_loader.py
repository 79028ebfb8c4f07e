"""Batching: collate, deterministic per-rank epoch batches, grouping, resume slicing, eval sharding."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from maskrcnn_dist.data import (
    CocoInstanceDataset,
    aspect_ratio_groups,
    build_eval_loader,
    build_train_loader,
    collate,
    epoch_batches,
    generate_synthetic_coco,
    num_train_batches,
    rank_indices,
)
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


def test_collate_keeps_images_and_per_image_box_counts() -> None:
    batch = [(torch.zeros(3, 4, 5), {"boxes": torch.zeros(n, 4)}) for n in (0, 3, 1)]
    images, targets = collate(batch)
    assert isinstance(images, list) and isinstance(targets, list)
    assert [t["boxes"].shape[0] for t in targets] == [0, 3, 1]
    assert all(image is b[0] for image, b in zip(images, batch, strict=True))


def test_epoch_batches_are_deterministic_and_shuffled_per_epoch() -> None:
    args = {"epoch": 2, "seed": 5, "shuffle": True, "rank": 1, "world_size": 2}
    assert epoch_batches(50, 4, **args) == epoch_batches(50, 4, **args)
    assert epoch_batches(50, 4, **args) != epoch_batches(50, 4, **{**args, "epoch": 3})
    assert epoch_batches(50, 4, **args) != epoch_batches(50, 4, **{**args, "seed": 6})
    flat = [i for b in epoch_batches(50, 4, **{**args, "shuffle": False}) for i in b]
    assert flat == list(range(1, 50, 2))


def test_ranks_are_disjoint_apart_from_distributed_sampler_padding() -> None:
    n, world = 10, 3
    per_rank = [[i for b in epoch_batches(n, 2, epoch=0, seed=0, shuffle=True, rank=r, world_size=world)
                 for i in b] for r in range(world)]  # fmt: skip
    assert [len(p) for p in per_rank] == [4, 4, 4]  # ceil(10 / 3) each
    counts = Counter(i for p in per_rank for i in p)
    assert set(counts) == set(range(n))
    assert sum(c - 1 for c in counts.values()) == 2  # exactly the 2 padding repeats
    sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=world, rank=1, seed=0)
    assert per_rank[1] == list(sampler)  # DistributedSampler's own order


def test_grouped_batches_keep_ranks_in_lockstep_and_use_each_sample_once() -> None:
    rng = random.Random(0)
    for n, world, batch, factor in itertools.product((1, 7, 23, 40), (1, 2, 3, 4), (1, 2, 3), (0, 1, 3)):
        ratios = [rng.choice([0.5, 0.75, 1.0, 1.33, 2.0]) for _ in range(n)]
        counts = set()
        for rank in range(world):
            kwargs = {"rank": rank, "world_size": world, "aspect_ratios": ratios, "group_factor": factor}
            batches = epoch_batches(n, batch, epoch=1, seed=3, shuffle=True, **kwargs)
            counts.add(len(batches))
            order = rank_indices(n, epoch=1, seed=3, shuffle=True, rank=rank, world_size=world)
            assert sorted(i for b in batches for i in b) == sorted(order)
            assert all(1 <= len(b) <= batch for b in batches)
        assert counts == {num_train_batches(n, batch, world_size=world)}, (n, world, batch, factor)


def test_drop_last_drops_only_a_short_final_batch() -> None:
    ratios = [0.5, 2.0] * 5
    for group_factor in (-1, 0):
        kwargs = {"aspect_ratios": ratios, "group_factor": group_factor, "epoch": 0, "seed": 0}
        batches = epoch_batches(10, 3, shuffle=True, drop_last=True, **kwargs)
        assert len(batches) == 3 == num_train_batches(10, 3, drop_last=True)
        assert all(len(b) == 3 for b in batches)


def test_grouping_puts_same_bin_images_together() -> None:
    assert aspect_ratio_groups([0.4, 0.9, 1.0, 1.5, 3.0], 0) == [0, 0, 1, 1, 1]
    assert aspect_ratio_groups([0.4, 0.9, 1.0, 1.5, 3.0], 1) == [0, 1, 2, 2, 3]
    ratios = [0.5 if i % 3 else 1.6 for i in range(60)]
    batches = epoch_batches(60, 4, epoch=0, seed=1, shuffle=True, aspect_ratios=ratios, group_factor=0)
    mixed = [b for b in batches if len({ratios[i] for i in b}) > 1]
    assert len(mixed) <= 1  # only the leftovers, concatenated at the end, may mix two bins
    assert all(batches.index(b) == len(batches) - 1 for b in mixed)
    ungrouped = epoch_batches(60, 4, epoch=0, seed=1, shuffle=True)
    assert sum(len({ratios[i] for i in b}) > 1 for b in ungrouped) > 5  # grouping is what did it


def test_train_loader_resumes_mid_epoch_without_loading_skipped_images() -> None:
    dataset = _FakeDataset(20)
    full = _ids(build_train_loader(dataset, 3, epoch=4, seed=9, rank=1, world_size=2))
    assert dataset.epoch == 4
    assert full == epoch_batches(20, 3, epoch=4, seed=9, shuffle=True, rank=1, world_size=2)
    dataset.loaded.clear()
    resumed = build_train_loader(dataset, 3, epoch=4, seed=9, rank=1, world_size=2, start_batch=2)
    assert len(resumed) == len(full) - 2
    assert _ids(resumed) == full[2:]
    assert sorted(dataset.loaded) == sorted(i for b in full[2:] for i in b)
    assert _ids(build_train_loader(dataset, 3, epoch=4, seed=9, start_batch=7)) == []
    with pytest.raises(ValueError, match="start_batch"):
        build_train_loader(dataset, 3, epoch=4, seed=9, start_batch=8)


def test_train_loader_groups_by_the_dataset_aspect_ratios() -> None:
    ratios = [0.5 if i % 2 else 2.0 for i in range(16)]
    loader = build_train_loader(_FakeDataset(16, ratios), 4, epoch=0, seed=0, group_factor=0)
    assert all(len({ratios[i] for i in batch}) == 1 for batch in _ids(loader))


def test_eval_sharding_covers_each_image_exactly_once() -> None:
    dataset = _FakeDataset(11)
    for world in (1, 2, 3, 4, 12):
        seen = [i for r in range(world) for b in _ids(build_eval_loader(dataset, 2, rank=r, world_size=world))
                for i in b]  # fmt: skip
        assert sorted(seen) == list(range(11)), world
    first = _ids(build_eval_loader(dataset, 2, rank=1, world_size=3))
    assert first == [[1, 4], [7, 10]]  # dataset order, unshuffled


def test_loader_with_two_workers_matches_in_process(tmp_path: Path) -> None:
    out = generate_synthetic_coco(tmp_path, num_images=6, image_size=(40, 64), max_objects=2, seed=0)
    dataset = Flipped(CocoInstanceDataset(out.image_dir, out.annotation_file), 1)
    kwargs = {"epoch": 1, "seed": 2, "group_factor": 0}
    serial = list(build_train_loader(dataset, 2, num_workers=0, **kwargs))
    dataset.set_epoch(0)  # the loader must set the epoch itself, before the workers start
    parallel = list(build_train_loader(dataset, 2, num_workers=2, **kwargs))
    assert len(serial) == len(parallel) == 3
    for (images_a, targets_a), (images_b, targets_b) in zip(serial, parallel, strict=True):
        assert [t["image_id"] for t in targets_a] == [t["image_id"] for t in targets_b]
        assert all(torch.equal(a, b) for a, b in zip(images_a, images_b, strict=True))
        assert all(torch.equal(a["masks"], b["masks"]) for a, b in zip(targets_a, targets_b, strict=True))
