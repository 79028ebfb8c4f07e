"""A checkpoint written before the batch plan: the order its epoch began in (data/old_order.py), checked
against torch's DistributedSampler as the old loader used it (`old_loader_batches`), and the plan a resume of
it takes (training/resume_plan.py): the world size that wrote it, its global batch, its notice."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DistributedSampler

from maskrcnn_dist.data.loader import aspect_ratio_groups
from maskrcnn_dist.data.old_order import OLD_ORDER_KEY, OldOrder, old_epoch_plan, repeated_images
from maskrcnn_dist.data.plan import LAYOUT_KEY, BatchLayout, epoch_plan, grouped_batches, rank_share
from maskrcnn_dist.training.resume_plan import old_world_size, run_plan

RATIOS = [0.6, 1.4, 0.7, 1.3, 1.0, 0.5, 1.8, 0.9, 1.2, 0.8, 1.5, 0.75, 1.1, 0.65, 1.6, 0.95, 1.25]


def old_loader_batches(
    num_samples: int, batch_size: int, *, epoch: int, seed: int, rank: int, world_size: int, groups: list[int] | None
) -> list[list[int]]:
    """Rank `rank`'s batches of `epoch` as the loader before the plan made them: torch's DistributedSampler
    (padded by repeating its first samples), the rank's share grouped by aspect ratio on its own."""
    sampler = DistributedSampler(range(num_samples), num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    order = list(sampler)
    if groups is None:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    return grouped_batches(order, [groups[i] for i in order], batch_size)


@pytest.mark.parametrize("num_samples", [16, 17])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("group_factor", [-1, 0, 3])
def test_the_old_order_is_distributed_samplers_per_rank_batches_without_its_repeats(
    num_samples: int, world_size: int, group_factor: int
) -> None:
    ratios = RATIOS[:num_samples]
    groups = aspect_ratio_groups(ratios, group_factor) if group_factor >= 0 else None
    old = [
        old_loader_batches(num_samples, 2, epoch=3, seed=7, rank=r, world_size=world_size, groups=groups)
        for r in range(world_size)
    ]
    plan = old_epoch_plan(num_samples, 2, world_size, epoch=3, seed=7, groups=groups)
    assert len(plan) == len(old[0]) == BatchLayout(world_size, 2).steps_per_epoch(num_samples)
    # Every image once in the epoch: the old order's repeats (its padding) are left out, nothing else.
    assert Counter(i for batch in plan for m in batch.micro_batches for i in m) == Counter(range(num_samples))
    repeats = repeated_images(num_samples, world_size)
    assert sum(len(o[b]) for o in old for b in range(len(plan))) - num_samples == repeats
    for b, batch in enumerate(plan):
        mine = [i for m in batch.micro_batches for i in m]
        theirs = [i for o in old for i in o[b]]
        assert set(mine) <= set(theirs) and len(theirs) - len(mine) <= repeats
        if not repeats:  # micro-batch r is old rank r's batch, as it was
            assert [list(m) for m in batch.micro_batches] == [o[b] for o in old]


def test_the_old_order_differs_from_the_plan_where_ranks_grouped_their_own_shares() -> None:
    """Why a resume cannot read an old position against the plan: with aspect-ratio grouping, the plan's
    epoch repeats some of the old order's images from a step on and leaves others out."""
    groups = aspect_ratio_groups(RATIOS[:16], 0)
    old = old_epoch_plan(16, 2, 2, epoch=0, seed=0, groups=groups)
    new = epoch_plan(16, BatchLayout(2, 2), epoch=0, seed=0, groups=groups)
    done = {i for batch in old[:2] for m in batch.micro_batches for i in m}
    rest = Counter(i for batch in new[2:] for m in batch.micro_batches for i in m)
    assert done & set(rest) or set(range(16)) - done - set(rest), "pick a seed where the orders differ"


def test_any_number_of_ranks_shares_the_rest_of_an_old_epoch_each_image_once() -> None:
    plan = old_epoch_plan(17, 2, 3, epoch=1, seed=0, groups=aspect_ratio_groups(RATIOS, 3))
    for world_size in (1, 2, 3, 4):
        trained = Counter(
            i for batch in plan[2:] for r in range(world_size) for i in rank_share(batch, r, world_size).trained
        )
        assert trained == Counter(i for batch in plan[2:] for m in batch.micro_batches for i in m)


def old_checkpoint(**position: int) -> dict:
    """A ddp checkpoint as written before the plan: no batch layout, no world size."""
    return {"engine": "ddp", "config": {"data": {"batch_size": 2}}, **position}


def write_records(run: Path, world_size: int, steps: int) -> Path:
    (run / "checkpoints").mkdir(parents=True)
    lines = [
        json.dumps({"kind": "train", "step": s, "loss": 1.0, "world_size": world_size}) for s in range(1, steps + 1)
    ]
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run / "checkpoints" / "checkpoint_00000003.pt"


def test_the_world_size_that_wrote_it_comes_from_its_records_its_engine_or_its_position(tmp_path: Path) -> None:
    source = write_records(tmp_path / "run", world_size=2, steps=3)
    assert old_world_size(old_checkpoint(step=3, epoch=0, batch=3), source, 24, 2)[0] == 2
    assert old_world_size({**old_checkpoint(step=3, epoch=0, batch=3), "engine": "pipeline"}, None, 24, 2)[0] == 1
    # 24 images, batch 2: 6 steps an epoch only at world size 2 (3 ranks: 4 steps; 4: 3; 5: 3).
    assert old_world_size(old_checkpoint(step=8, epoch=1, batch=2), None, 24, 2)[0] == 2
    assert old_world_size(old_checkpoint(step=7, epoch=1, batch=4), None, 24, 2)[0] is None  # 3 steps: 4 or 5 ranks
    assert old_world_size(old_checkpoint(step=3, epoch=0, batch=3), None, 24, 2)[0] is None  # nothing shows it


def test_a_two_rank_checkpoint_resumed_on_one_keeps_its_epoch_and_its_order(tmp_path: Path, caplog) -> None:
    """The issue's case: today's plan would give 1 rank a global batch of 2, 12 steps an epoch, not 6."""
    source = write_records(tmp_path / "run", world_size=2, steps=8)
    with caplog.at_level(logging.INFO, logger="maskrcnn_dist.training.resume_plan"):
        plan = run_plan((old_checkpoint(step=8, epoch=1, batch=2), source), 24, 2, world_size=1)
    assert plan.layout == BatchLayout(2, 2) and plan.layout.steps_per_epoch(24) == 6
    assert plan.old_order == OldOrder(1, 2) and plan.facts() == {OLD_ORDER_KEY: {"epoch": 1, "world_size": 2}}
    [line] = caplog.messages
    assert line.startswith(f"resume: checkpoint {source} has no batch layout (written before the batch plan)")
    for part in (
        "written at world size 2, as its run's train records show",
        "the global batch stays 4 images (2 x --batch-size 2), 6 steps an epoch",
        "the rest of epoch 1 (from its step 3 of 6) keeps the order it began in, each image once",
        "world size 2 -> 1",
    ):
        assert part in line, line


def test_an_old_checkpoint_at_an_epoch_end_needs_no_old_order_and_a_migrated_one_keeps_it() -> None:
    at_end = run_plan((old_checkpoint(step=12, epoch=2, batch=0), None), 24, 2, world_size=3, announce=False)
    assert at_end.layout == BatchLayout(2, 2) and at_end.old_order is None
    # The next checkpoint of the resumed run has the layout and the marker: still inside the old epoch...
    migrated = {
        LAYOUT_KEY: {"micro_batches": 2, "batch_size": 2},
        "world_size": 1,
        OLD_ORDER_KEY: {"epoch": 1, "world_size": 2},
    }
    inside = run_plan(({**migrated, "step": 9, "epoch": 1, "batch": 3}, None), 24, 2, world_size=1, announce=False)
    assert inside.old_order == OldOrder(1, 2)
    # ...or past it: the plan's order.
    after = run_plan(({**migrated, "step": 13, "epoch": 2, "batch": 1}, None), 24, 2, world_size=1, announce=False)
    assert after.old_order is None and after.layout == BatchLayout(2, 2)


def test_a_checkpoint_whose_world_size_nothing_shows_says_what_it_assumed(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="maskrcnn_dist.training.resume_plan"):
        plan = run_plan((old_checkpoint(step=3, epoch=0, batch=3), None), 24, 2, world_size=3)
    assert plan.layout == BatchLayout(3, 2) and plan.old_order == OldOrder(0, 3)
    assert "nothing it recorded shows how many ranks wrote it" in caplog.messages[0]
    assert "taken as this run's, 3" in caplog.messages[0]
