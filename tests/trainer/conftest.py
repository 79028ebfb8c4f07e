"""Shared fixtures for the trainer tests: a small synthetic COCO set and a fast configuration."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.data import BatchLayout, build_step_loader, write_train_val
from maskrcnn_dist.modeling.model import SMALL_VARIANT_SAMPLING

# The RoIs an image (--box-batch-size-per-image) a trainer test samples unless it says otherwise. At
# 64-96 px the box and mask heads, not the trunk, dominate a CPU step of the small model, and its own 128
# an image are far more than a few objects need: one fp32 step of two images took 2.2 s at 96 px and
# 1.5 s at 64 px with 128, 1.7 s and 1.0 s with 32 (AMD EPYC, one thread). Half precision more so: a CPU
# without bf16 or fp16 units (AVX2 only) runs the heads' half-precision convolutions and products on
# im2col's slow path (one --amp step of two 64-px images: 26 s with 128, 12 s with 32). What a test
# compares (runs that sample alike: resumes, engines, world sizes, floors, reads) does not depend on it.
TEST_ROIS = 32
FEWER_ROIS = {"box-batch-size-per-image": TEST_ROIS}
# And the detections an image that evaluation keeps (--detections-per-image): a barely trained model's
# are low-score boxes everywhere, each through the mask head. Evaluating 4 images of 96 px took 12.2 CPU s
# at the model's own 100 an image, 2.8 s at 20.
TEST_HEADS = {**FEWER_ROIS, "detections-per-image": 20}
# The small model's own (modeling/model.py; torchvision's 100 detections), for the runs whose verdict is a
# level that a short run reaches by chance (the loss falls by 40%, AP > 0, bf16 within 2% of fp32 a
# step): those were settled with it, and with fewer RoIs one RoI more or less is a larger share of each
# loss term.
MODEL_HEADS = {
    "box-batch-size-per-image": SMALL_VARIANT_SAMPLING["box_batch_size_per_image"],
    "detections-per-image": 100,
}


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
    """The small CPU run (config.small_cpu_run) at 96 px, a few steps, TEST_HEADS' RoIs and detections:
    what every trainer test starts from.
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
    values.update(TEST_HEADS)
    values.update(flags)
    cfg = apply_overrides(TrainConfig(), values, "test")
    cfg.validate()
    return cfg


def first_steps(dataset: Any, batch_size: int, count: int, seed: int = 0) -> list[tuple[list, list]]:
    """The first `count` steps of epoch 0 of training's loader (data.build_step_loader, the plan) at one
    rank, each as the (images, targets) that engine.train_step takes."""
    steps = itertools.islice(build_step_loader(dataset, BatchLayout(1, batch_size), epoch=0, seed=seed), count)
    return [(step.micro_batches[0].images, step.micro_batches[0].targets) for step in steps]
