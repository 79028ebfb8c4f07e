"""Shared fixtures for the trainer tests: a small synthetic COCO set and a fast configuration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides
from maskrcnn_dist.data import write_train_val


@pytest.fixture(scope="session")
def tiny_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 training and 4 validation images of at most 96 px, written once per session."""
    root = tmp_path_factory.mktemp("tiny_coco")
    write_train_val(root, num_train=12, num_val=4, seed=3, image_size=(72, 96), max_objects=3)
    return root


def fast_config(data_path: Path, output_dir: Path, **flags: object) -> TrainConfig:
    """The small model on small images, CPU, a few steps: what every trainer test starts from.

    From scratch the mask head's loss can run away in the first steps (as torchvision's reference
    does at lr 0.02); clipping the gradient norm keeps these short runs stable."""
    torch.set_num_threads(2)
    values = {
        "model": "maskrcnn_resnet18_fpn",
        "min-size": 96,
        "max-size": 96,
        "data-path": data_path,
        "output-dir": output_dir,
        "batch-size": 2,
        "workers": 0,
        "device": "cpu",
        "epochs": 1,
        "lr": 0.02,
        "warmup-iters": 10,
        "clip-grad-norm": 10.0,
        "print-freq": 1,
        "eval-every-epoch": False,
        "aspect-ratio-group-factor": -1,
        **flags,
    }
    cfg = apply_overrides(TrainConfig(), values, "test")
    cfg.validate()
    return cfg
