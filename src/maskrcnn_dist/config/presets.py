"""Presets: torchvision's published training recipes (`--recipe`), the small CPU run (demo, tests, e2e,
benchmarks) and the embedded demo job, as flag-name -> value mappings that build_config and to_argv take."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["RECIPES", "demo_flags", "small_cpu_run", "small_stop_run"]

#: `--recipe NAME` -> the flags it sets: the commands behind torchvision's published Mask R-CNN weights.
#: Their --lr is the reference's for its global batch (v1: 8 GPUs x 2 images, v2: 32 GPUs x 2): scale it
#: to yours (docs/training.md#recipes). Flags given beside --recipe (command line or YAML) win.
RECIPES: dict[str, dict[str, Any]] = {
    # references/detection/README.md, "Mask R-CNN", with train.py's defaults: 37.9 box / 34.6 mask AP.
    "torchvision-v1": {
        "model": "maskrcnn_resnet50_fpn",
        "epochs": 26,
        "lr-scheduler": "multisteplr",
        "lr-steps": (16, 22),
        "lr-gamma": 0.1,
        "lr": 0.02,
        "momentum": 0.9,
        "weight-decay": 1e-4,
        "batch-size": 2,
        "aspect-ratio-group-factor": 3,
        "warmup-iters": 1000,
        "warmup-factor": 1e-3,
        "data-augmentation": "hflip",
    },
    # pytorch/vision#5773, the weights' "recipe" link: 47.4 box / 41.8 mask AP. Trained without frozen
    # BatchNorm (the v2 model's point), from scratch.
    "torchvision-v2": {
        "model": "maskrcnn_resnet50_fpn_v2",
        "epochs": 400,
        "lr-scheduler": "multisteplr",
        "lr-steps": (352, 384),
        "lr-gamma": 0.1,
        "lr": 0.1,
        "momentum": 0.9,
        "weight-decay": 4e-5,
        "batch-size": 2,
        "aspect-ratio-group-factor": 3,
        "warmup-iters": 1000,
        "warmup-factor": 1e-3,
        "backbone-norm": "batch",
        "sync-bn": True,
        "data-augmentation": "lsj",
    },
}


def small_cpu_run(image_size: int, **flags: Any) -> dict[str, Any]:
    """The small model on small images on CPU, flag-name -> value, plus `flags` (underscores or dashes).

    From scratch the mask head's loss can run away in the first steps (as torchvision's reference
    does at lr 0.02); clipping the gradient norm keeps these short runs stable."""
    return {
        "model": "maskrcnn_resnet18_fpn",
        "min-size": image_size,
        "max-size": image_size,
        "device": "cpu",
        "lr": 0.02,
        "clip-grad-norm": 10.0,
        **{name.replace("_", "-"): value for name, value in flags.items()},
    }


def small_stop_run(data_path: Path, output_dir: Path, **flags: Any) -> dict[str, Any]:
    """What the stop tests and benchmarks/bench_stop.py train: the small CPU run at 64 px, one epoch of
    `data_path`, one thread, no loader workers, every step logged, plus `flags`."""
    values = {"threads": 1, "workers": 0, "warmup_iters": 5, "aspect_ratio_group_factor": -1, "print_freq": 1}
    return small_cpu_run(64, data_path=data_path, output_dir=output_dir, epochs=1, **{**values, **flags})


def demo_flags(output_dir: Path, steps: int, engine: str) -> dict[str, Any]:
    """The embedded default job: a synthetic COCO set, the small model at 128 px, CPU, a short schedule."""
    return small_cpu_run(
        128,
        engine=engine,
        synthetic_images=64,
        synthetic_image_size=128,
        batch_size=4,
        workers=1,
        warmup_iters=50,
        max_steps=steps,
        epochs=100,
        lr_steps="1000",
        eval_every_epoch=False,  # COCO AP once, at the end; validation loss at every epoch end
        output_dir=output_dir,
        overwrite=True,  # a second `make demo` moves the first one's files aside, into replaced-<time>/
        print_freq=10,
        # pipeline: three processes share this machine's cores
        **({"threads": 1, "micro_batches": 2, "rpc_timeout": 60} if engine == "pipeline" else {}),
    )
