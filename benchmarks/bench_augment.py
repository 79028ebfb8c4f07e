"""What --data-augmentation (and --use-copypaste) costs: data-loader images/s per worker for each, and a
CPU training step's time with lsj against hflip, as a ratio from one run.

    .venv/bin/python benchmarks/bench_augment.py [--images 24] [--steps 4] [--step-size 320] [--json-out FILE]

The loader part reads a synthetic COCO set of COCO-like sizes (each side 480-640 px, up to 8 objects)
through the training loader with no worker processes, so that images/s is what one loader worker
delivers (decode, masks, augmentation, collate), at the references' model size (--min-size 800,
--max-size 1333: lsj's square is 1024). The step part trains the small model (ResNet-18 FPN) on the
same images at --step-size (short side; lsj's square is 1.28 x that), batch 2, one process, and reports
the median step time after a warm-up step: lsj's padded squares are larger than hflip's resized images.
On a shared machine compare the ratios of one invocation, not figures across invocations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from contextlib import closing
from pathlib import Path

import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.data import load_datasets, write_train_val
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.trainer_parts import build_trainer, run_metrics

# (label, flags) of each augmentation measured.
AUGMENTATIONS = [
    ("hflip", {"data-augmentation": "hflip"}),
    ("multiscale", {"data-augmentation": "multiscale"}),
    ("lsj", {"data-augmentation": "lsj"}),
    ("lsj+copypaste", {"data-augmentation": "lsj", "use-copypaste": True}),
]


def config(data: Path, out: Path, size: int, max_size: int, **flags: object) -> TrainConfig:
    values = small_cpu_run(size, data_path=data, output_dir=out, workers=0, batch_size=2, threads=2)
    values.update({"max-size": max_size, "aspect-ratio-group-factor": -1, "check-data": "off", **flags})
    cfg = apply_overrides(TrainConfig(), values, "bench_augment")
    cfg.validate()
    return cfg


def loader_rate(data: Path, out: Path, flags: dict[str, object], images: int) -> float:
    """Images/s of the training loader (one process: one worker's rate) at the references' sizes."""
    cfg = config(data, out, 800, 1333, **flags)
    train_set, val_set = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=1)
    with closing(run_metrics(cfg, False, 1)) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, 1, metrics)
        seen, start = 0, time.perf_counter()
        for epoch in range(1_000):
            for batch_images, _ in trainer.loader(epoch, 0):
                seen += len(batch_images)
                if seen >= images:
                    return seen / (time.perf_counter() - start)
    raise RuntimeError("unreachable")


def step_time(data: Path, out: Path, flags: dict[str, object], size: int, steps: int) -> float:
    """Median seconds of a training step of the small model at `size` (after one warm-up step)."""
    cfg = config(data, out, size, round(size * 1333 / 800), **flags)
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)  # as the trainer's process setup does: denormals slow a CPU step 3-6x
    train_set, val_set = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=steps + 1)
    with closing(run_metrics(cfg, False, steps + 1)) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, steps + 1, metrics)
        batches = list(trainer.loader(0, 0))[: steps + 1]
    times = []
    for step, (images, targets) in enumerate(batches, start=1):
        start = time.perf_counter()
        engine.train_step(step, images, targets)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=24, help="images read per augmentation")
    parser.add_argument("--steps", type=int, default=4, help="timed training steps per augmentation")
    parser.add_argument("--step-size", type=int, default=320, help="short side of the step comparison")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        write_train_val(
            data,
            num_train=max(args.images, 2 * (args.steps + 1)),
            num_val=1,
            seed=0,
            image_size=(480, 640),
            max_objects=8,
        )
        rates = {label: loader_rate(data, Path(tmp) / label, flags, args.images) for label, flags in AUGMENTATIONS}
        steps = {
            label: step_time(data, Path(tmp) / f"step-{label}", flags, args.step_size, args.steps)
            for label, flags in AUGMENTATIONS[::2]  # hflip and lsj
        }
    print(f"data loader, one worker, images/s at --min-size 800 --max-size 1333 ({args.images} images each):")
    for label, rate in rates.items():
        print(f"  {label:<14} {rate:7.1f} images/s   ({rate / rates['hflip']:.2f} x hflip)")
    print(f"training step, small model, batch 2, short side {args.step_size}, 2 threads (median of {args.steps}):")
    for label, seconds in steps.items():
        print(f"  {label:<14} {seconds:7.3f} s")
    print(f"  lsj / hflip    {steps['lsj'] / steps['hflip']:7.2f}")
    if args.json_out:
        args.json_out.write_text(json.dumps({"loader_images_per_s": rates, "step_s": steps}, indent=2) + "\n")


if __name__ == "__main__":
    main()
