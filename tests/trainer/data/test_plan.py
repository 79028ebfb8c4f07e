"""The epoch's global batches and a rank's share of each (data/plan.py): every image once per epoch at any
world size, weights that sum to one, and a schedule that a change of world size does not move."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from fractions import Fraction

import pytest
import torch

from maskrcnn_dist.config import TrainConfig
from maskrcnn_dist.data.loader import aspect_ratio_groups
from maskrcnn_dist.data.plan import (
    LAYOUT_KEY,
    WORLD_SIZE_KEY,
    BatchLayout,
    epoch_plan,
    grouped_batches,
    layout_change,
    layout_of_run,
    rank_share,
    share_at,
)
from maskrcnn_dist.modeling.optim import build_scheduler


def _groups(rng: random.Random, n: int, factor: int) -> list[int] | None:
    return None if factor < 0 else aspect_ratio_groups([rng.uniform(0.4, 2.5) for _ in range(n)], factor)


def test_every_rank_of_every_world_size_shares_each_global_batch_whole() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n, layout = rng.randint(1, 60), BatchLayout(rng.randint(1, 5), rng.randint(1, 4))
        groups = _groups(rng, n, rng.choice([-1, 0, 2]))
        plan = epoch_plan(n, layout, epoch=rng.randint(0, 9), seed=rng.randint(0, 99), groups=groups)
        assert len(plan) == layout.steps_per_epoch(n)
        assert sorted(i for batch in plan for m in batch.micro_batches for i in m) == list(range(n))
        for batch in plan:
            assert all(0 < len(m) <= layout.batch_size for m in batch.micro_batches)
            for world in range(1, 8):
                shares = [rank_share(batch, r, world) for r in range(world)]
                assert sum(s.weight for s in shares) == 1
                assert len({len(s.micro_batches) for s in shares}) == 1  # collectives pair up
                weighted = [m for s in shares for m in s.micro_batches if not m.filler]
                assert all(m.weight == Fraction(len(m.indices), batch.images) for m in weighted)  # its image share
                real = sorted(m.micro for m in weighted)
                assert real == list(range(len(batch.micro_batches)))
                everything = Counter(i for m in batch.micro_batches for i in m)
                assert Counter(i for s in shares for i in s.trained) == everything


def test_at_the_launch_world_size_rank_r_gets_the_batches_distributed_sampler_gave_it() -> None:
    """Ungrouped, every full global batch gives rank r of the launch's n exactly its old batch, weight 1/n:
    a run that keeps its world size trains on what it trained on before this plan."""
    for n, world, batch_size in [(40, 2, 4), (37, 3, 2), (16, 4, 1), (9, 1, 4)]:
        layout = BatchLayout(world, batch_size)
        plan = epoch_plan(n, layout, epoch=3, seed=7)
        for rank in range(world):
            order = _distributed_sampler(n, rank, world, epoch=3, seed=7)
            old = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
            for j, batch in enumerate(plan):
                if batch.images == layout.global_batch_size:
                    (micro,) = rank_share(batch, rank, world).micro_batches
                    assert (micro.micro, list(micro.indices), micro.weight) == (rank, old[j], Fraction(1, world))


def test_one_rank_grouped_keeps_the_old_batches() -> None:
    """One rank, grouped: DistributedSampler's order of the epoch, grouped by aspect ratio as it fills."""
    ratios = [0.5 + (i % 7) / 3 for i in range(50)]
    groups = aspect_ratio_groups(ratios, 2)
    plan = epoch_plan(50, BatchLayout(1, 4), epoch=1, seed=2, groups=groups)
    order = _distributed_sampler(50, 0, 1, epoch=1, seed=2)
    assert [list(b.micro_batches[0]) for b in plan] == grouped_batches(order, [groups[i] for i in order], 4)
    assert sum(len({groups[i] for i in b.micro_batches[0]}) > 1 for b in plan) <= 2  # leftovers only


def _distributed_sampler(n: int, rank: int, world: int, *, epoch: int, seed: int) -> list[int]:
    """The order torch's DistributedSampler gives `rank` of `world` in `epoch`: what ddp trained on before."""
    sampler = torch.utils.data.DistributedSampler(range(n), num_replicas=world, rank=rank, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def test_a_world_that_does_not_divide_the_global_batch_runs_zero_weight_fillers() -> None:
    batch = epoch_plan(6, BatchLayout(3, 2), epoch=0, seed=0)[0]
    shares = [rank_share(batch, r, 2) for r in range(2)]
    assert [[m.micro for m in s.micro_batches] for s in shares] == [[0, 2], [1, 4]]
    filler = shares[1].micro_batches[1]
    assert filler.filler and filler.weight == 0 and len(filler.indices) == 1
    assert shares[1].trained == batch.micro_batches[1]  # a filler is not a trained sample
    # More ranks than micro-batches: the extra rank holds only a filler.
    assert rank_share(batch, 3, 4).weight == 0 and rank_share(batch, 3, 4).trained == ()


def _simulate(num_samples: int, layout: BatchLayout, epochs: int, worlds: list[tuple[int, int]], seed: int):
    """A run of `epochs` through world-size changes: `worlds` is [(world size, steps until the next
    resume)]. Each segment starts as train.py's _run does: the layout from the last checkpoint
    (layout_of_run), a scheduler built with that layout's steps per epoch, the checkpoint's scheduler state.
    Returns each epoch's trained indices and the LR at every step."""
    cfg = TrainConfig().optim
    cfg = replace(cfg, lr_steps=(1, 2), warmup_iters=3)
    samples: dict[int, list[int]] = {}
    lrs: list[float] = []
    saved: dict | None = None
    step = 0
    for world, length in worlds:
        # The launch's layout is its world size x --batch-size; a resume takes the checkpoint's.
        run_layout = layout_of_run(saved, layout.batch_size, world) if saved else layout
        iters = run_layout.steps_per_epoch(num_samples)
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        scheduler = build_scheduler(optimizer, cfg, iters, epochs * iters)
        if saved is not None:  # as TorchEngine.load_state_dict does
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
        for _ in range(length):
            if step == epochs * iters:
                break
            epoch, batch = divmod(step, iters)
            for rank in range(world):
                where = {"epoch": epoch, "batch": batch, "rank": rank, "world_size": world}
                share = share_at(num_samples, run_layout, seed=seed, **where)
                samples.setdefault(epoch, []).extend(share.trained)
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
            step += 1
        saved = {LAYOUT_KEY: run_layout.to_state(), WORLD_SIZE_KEY: world}
        saved |= {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    return samples, lrs


@pytest.mark.slow
def test_any_sequence_of_world_sizes_trains_every_image_once_per_epoch_on_the_same_schedule() -> None:
    """Random world sizes changing at random steps (mid-epoch included): each epoch's samples are its
    images exactly once, and the LR at every step is an uninterrupted run's."""
    rng = random.Random(47)
    for _ in range(60):
        num_samples, layout = rng.randint(5, 40), BatchLayout(rng.randint(1, 4), rng.randint(1, 3))
        epochs, seed = 3, rng.randint(0, 9)
        total = epochs * layout.steps_per_epoch(num_samples)
        worlds = [(rng.randint(1, 6), rng.randint(1, max(1, total // 2))) for _ in range(12)]
        worlds = [(layout.micro_batches, worlds[0][1]), *worlds[1:], (1, total)]
        samples, lrs = _simulate(num_samples, layout, epochs, worlds, seed)
        _, uninterrupted = _simulate(num_samples, layout, epochs, [(layout.micro_batches, total)], seed)
        assert sorted(samples) == list(range(epochs))
        for epoch, trained in samples.items():
            assert sorted(trained) == list(range(num_samples)), (epoch, worlds)
        assert lrs == pytest.approx(uninterrupted, rel=1e-12), worlds


def test_a_resume_keeps_the_checkpoints_global_batch_and_says_so_in_one_line(caplog) -> None:
    saved = {LAYOUT_KEY: {"micro_batches": 2, "batch_size": 3}, WORLD_SIZE_KEY: 2}
    with caplog.at_level("INFO", logger="maskrcnn_dist.data.plan"):
        assert layout_of_run(saved, 3, 1) == BatchLayout(2, 3)
        assert layout_of_run(saved, 3, 2) == BatchLayout(2, 3)  # the same world size: nothing to say
        assert layout_of_run(saved, 3, 4, announce=False) == BatchLayout(2, 3)
    assert caplog.messages == [
        "resume: world size 2 -> 1: the global batch stays 6 images (2 micro-batches of 3), "
        "2 micro-batch(es) per rank per step"
    ]
    assert layout_of_run(None, 3, 4) == BatchLayout(4, 3)
    assert "--batch-size 5 is not used" in layout_change(BatchLayout(2, 3), 2, 5, 2)
    # A checkpoint written before the layout was kept: its batches were cut for this launch's world size
    # (training/resume_plan.py reads which one, and keeps it).
    assert layout_of_run({"step": 3}, 3, 2) == BatchLayout(2, 3)


@pytest.mark.parametrize(
    ("micro_batches", "world_size", "said"),
    [
        (2, 3, "; rank 2 trains nothing: a filler of weight 0 each step"),
        (1, 3, "; ranks 1-2 train nothing: a filler of weight 0 each step"),
        (3, 2, "; rank 1 runs a filler of weight 0 in the last round"),
        (4, 3, "; ranks 1-2 run a filler of weight 0 in the last round"),
        (4, 2, ""),
    ],
)
def test_the_notice_of_more_ranks_than_micro_batches_says_which_train_nothing(
    micro_batches: int, world_size: int, said: str
) -> None:
    """The ranks the notice names are those rank_share gives only fillers (in every step, or in its last round)."""
    line = layout_change(BatchLayout(micro_batches, 1), micro_batches, 1, world_size)
    assert line is not None and ((said in line) if said else line.endswith("per rank per step")), line
    batch = epoch_plan(micro_batches, BatchLayout(micro_batches, 1), epoch=0, seed=0)[0]
    fillers = {r for r in range(world_size) for m in rank_share(batch, r, world_size).micro_batches if m.filler}
    idle = {r for r in range(world_size) if not rank_share(batch, r, world_size).trained}
    if "trains nothing" in said or "train nothing" in said:
        assert idle == fillers and f"rank{'s' if len(idle) > 1 else ''} {min(idle)}" in said
    elif said:
        assert not idle and fillers and f"{min(fillers)}" in said
    else:
        assert not fillers
