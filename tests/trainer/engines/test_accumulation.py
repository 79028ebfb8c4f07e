"""One step over a global batch held by fewer ranks than it was cut for: the engine accumulates its
micro-batches, each weighted by its share of the images and seeded by its index, and takes the step a
rank per micro-batch takes (reference.local_accumulating: the ddp and pipeline reference), within
rounding; a zero-weight filler changes nothing. In one process: the CPU's quick check of what the
ddp world-size test (test_world_size.py) shows with real processes."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.data.loader import MicroBatch
from maskrcnn_dist.engines.torch_engine import TorchEngine

from ..stand_ins import CountingEngine
from .pipeline.pipeline_toy import NUM_CLASSES, make_batch
from .reference import local_accumulating

STEPS = 2


def config() -> TrainConfig:
    """As the ddp equivalence test's: frozen BatchNorm, no clipping (it would hide a wrong scale)."""
    flags = small_cpu_run(96, engine="local", seed=0, threads=1, lr=0.005, warmup_iters=0, backbone_norm="frozen")
    flags["lr-steps"] = "100"
    cfg = apply_overrides(TrainConfig(), flags, "accumulation test")
    return replace(cfg, optim=replace(cfg.optim, clip_grad_norm=None))


def accumulated(cfg: TrainConfig, batch, filler: bool) -> tuple[list[dict[str, float]], dict]:
    """One process holding both micro-batches of a 2-rank global batch (2 + 2 images), and a filler."""
    images, targets = batch
    engine = TorchEngine(cfg, NUM_CLASSES, iters_per_epoch=10)
    micro = [MicroBatch(images[2 * k : 2 * k + 2], targets[2 * k : 2 * k + 2], k, Fraction(1, 2)) for k in (0, 1)]
    micro += [MicroBatch(images[:1], targets[:1], 2, Fraction(0))] if filler else []
    losses = [engine.train_micro_batches(step, micro) for step in range(STEPS)]
    return losses, engine.state_dict()["model"]


@pytest.fixture(scope="module")
def reference() -> tuple[list[dict[str, float]], dict]:
    torch.set_num_threads(1)
    losses, state = local_accumulating(config(), STEPS, make_batch(4), 2, NUM_CLASSES)
    return losses, state["model"]


@pytest.mark.slow
@pytest.mark.parametrize("filler", [False, True])
def test_micro_batches_weighted_by_their_images_take_the_ranks_step(reference, filler: bool) -> None:
    ref_losses, ref_state = reference
    losses, state = accumulated(config(), make_batch(4), filler)
    for got, expected in zip(losses, ref_losses, strict=True):
        assert got.keys() == expected.keys()
        for name in expected:
            assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name
    for key, expected in ref_state.items():
        torch.testing.assert_close(state[key].float(), expected.float(), rtol=1e-5, atol=1e-6, msg=key)


def test_an_engine_that_splits_its_own_batch_reads_the_whole_global_batch() -> None:
    """The pipeline's master (the base Engine's train_micro_batches): the real micro-batches in order as
    one batch, which its own micro-batches weigh by image count; a filler is left out."""
    seen: list[tuple[list, list]] = []

    class Recording(CountingEngine):
        def train_step(self, step, images, targets):
            seen.append((images, targets))
            return super().train_step(step, images, targets)

    images, targets = [torch.full((1,), float(i)) for i in range(3)], [{"i": i} for i in range(3)]
    micro = [
        MicroBatch(images[:2], targets[:2], 0, Fraction(2, 3)),
        MicroBatch(images[2:], targets[2:], 1, Fraction(1, 3)),
    ]
    Recording().train_micro_batches(0, [*micro, MicroBatch(images[:1], targets[:1], 2, Fraction(0))])
    assert seen == [(images, targets)]
