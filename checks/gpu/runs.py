"""What the checks share: the run they start from, the synthetic data, and reading a run's results."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from benchmarks import common

from .harness import Env


def base_flags(env: Env, data: Path, output_dir: Path, **flags: Any) -> dict[str, Any]:
    """The run every check starts from: the profile's model and size, a few steps with every step logged,
    no validation, evaluation or periodic checkpoint inside the run (the last step's checkpoint is written)."""
    p = env.profile
    values: dict[str, Any] = {
        "model": p.model,
        "min-size": p.image_size,
        "max-size": p.max_size,
        "device": env.device,
        "data-path": data,
        "output-dir": output_dir,
        "batch-size": p.batch_size,
        "workers": 0,
        "seed": 0,
        "lr": 0.02,
        # From scratch the mask head's loss can run away in the first steps: clipping keeps short runs stable.
        "clip-grad-norm": 10.0,
        "max-steps": p.run_steps,
        "epochs": 1000,
        "eval-every-epoch": False,
        "val-period": 0,
        "checkpoint-period": 0,
        "keep-checkpoints": 1,
        "print-freq": 1,
        "warmup-iters": 10,
        "aspect-ratio-group-factor": -1,
        "threads": p.threads,
        "box-batch-size-per-image": p.rois_per_image,
        "detections-per-image": p.detections_per_image,
    }
    values.update({k.replace("_", "-"): v for k, v in flags.items()})
    return {k: v for k, v in values.items() if v is not None}


def train_config(values: dict[str, Any]):
    from maskrcnn_dist.config import TrainConfig, apply_overrides

    cfg = apply_overrides(TrainConfig(), values, "gpu-check")
    cfg.validate()
    return cfg


def make_data(env: Env) -> None:
    from maskrcnn_dist.data import generate_synthetic_coco

    p = env.profile
    size = (int(p.image_size * 0.75), p.image_size)
    generate_synthetic_coco(env.data / "train", num_images=p.train_images, image_size=size, seed=0)
    generate_synthetic_coco(env.eval_data / "val", num_images=p.val_images, image_size=size, seed=1)
    (env.eval_data / "train").symlink_to((env.data / "train").resolve())


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest absolute difference between the floating tensors of two state dicts with the same keys."""
    if set(a) != set(b):
        raise AssertionError(f"state dicts differ in keys: {sorted(set(a) ^ set(b))[:4]}")
    return max(
        (float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a if a[k].is_floating_point()),
        default=0.0,
    )


def train_losses(metrics_file: Path) -> dict[int, float]:
    from maskrcnn_dist.training.metrics import read_metrics

    return {r["step"]: float(r["loss"]) for r in read_metrics(metrics_file) if r["kind"] == "train"}


def run_logged(command: list[str], log_file: Path, timeout_s: float, threads: int, **env: str) -> str:
    """Run a process tree to completion (common.run_group: own session, ended afterwards); its log."""
    variables = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", **env}
    common.run_group(command, variables, log_file, timeout_s)
    return log_file.read_text()


def torchrun_command(processes: int, flags: dict[str, Any]) -> list[str]:
    """`maskrcnn-dist train` under torchrun with `processes` ranks on this host."""
    from maskrcnn_dist.config import to_argv

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    return [*torchrun, "-m", "maskrcnn_dist.cli", "train", *to_argv(flags)]


def train_local_run(values: dict[str, Any]) -> Path:
    """The local engine in this process through the library (train.train), as `maskrcnn-dist train` runs it."""
    from maskrcnn_dist.train import train

    train(train_config({**values, "engine": "local"}))
    return Path(values["output-dir"])


def final_checkpoint(output_dir: Path) -> dict[str, Any]:
    from maskrcnn_dist.checkpoint import load_checkpoint

    return load_checkpoint(output_dir / "checkpoints")
