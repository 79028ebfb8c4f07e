"""Shared fixtures for the trainer tests: a small synthetic COCO set and a fast configuration."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.data import BatchLayout, build_step_loader, write_train_val


@pytest.fixture(scope="session")
def tiny_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 training and 4 validation images of at most 96 px, written once per session."""
    root = tmp_path_factory.mktemp("tiny_coco")
    write_train_val(root, num_train=12, num_val=4, seed=3, image_size=(72, 96), max_objects=3)
    return root


@pytest.fixture(scope="session")
def stop_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 training and 4 validation images of at most 64 px: eight steps of two images, for the stop tests."""
    root = tmp_path_factory.mktemp("stop_coco")
    write_train_val(root, num_train=16, num_val=4, seed=3, image_size=(48, 64), max_objects=3)
    return root


@pytest.fixture(scope="session")
def four_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 training and 2 validation images of at most 64 px: two steps an epoch, for the hook tests."""
    root = tmp_path_factory.mktemp("four_images")
    write_train_val(root, num_train=4, num_val=2, seed=3, image_size=(48, 64), max_objects=2)
    return root


def fast_config(data_path: Path, output_dir: Path, **flags: object) -> TrainConfig:
    """The small CPU run (config.small_cpu_run) at 96 px, a few steps: what every trainer test starts from.
    One thread: `make test` runs two xdist workers on two cores, where two threads each only wait on each
    other (docs/testing.md has the figures); the same in one process, so a test's numbers do not depend
    on how it was run."""
    torch.set_num_threads(1)
    values = small_cpu_run(
        96,
        data_path=data_path,
        output_dir=output_dir,
        batch_size=2,
        workers=0,
        epochs=1,
        warmup_iters=10,
        print_freq=1,
        eval_every_epoch=False,
        aspect_ratio_group_factor=-1,
    )
    values.update(flags)
    cfg = apply_overrides(TrainConfig(), values, "test")
    cfg.validate()
    return cfg


def first_steps(dataset: Any, batch_size: int, count: int, seed: int = 0) -> list[tuple[list, list]]:
    """The first `count` steps of epoch 0 of training's loader (data.build_step_loader, the plan) at one
    rank, each as the (images, targets) that engine.train_step takes."""
    steps = itertools.islice(build_step_loader(dataset, BatchLayout(1, batch_size), epoch=0, seed=seed), count)
    return [(step.micro_batches[0].images, step.micro_batches[0].targets) for step in steps]


# The amp tests' RoIs an image (the small model samples 128, a quarter of them at most positive, and those
# go through the mask head's four 256-channel convolutions). A CPU without bf16 or fp16 units (AVX2 only)
# runs the heads' half-precision convolutions and products on im2col's slow path, 20-25x fp32: one --amp
# step of two 64-px images took 26 s at 128 RoIs an image and 12 s at 32 (measured on an AMD EPYC). Every
# run a test compares samples alike, so what it compares (floors, reads, scaling) is unchanged.
AMP_TEST_ROIS = 32
FEWER_ROIS = {"box-batch-size-per-image": AMP_TEST_ROIS}
