"""What predict's batch independence costs: seconds per image with one image per forward pass (predict's
default since each image's detections stopped depending on the others given with it) against batches of
2 and 4 (its old default, and eval's), measured interleaved in one run.

    .venv/bin/python benchmarks/bench_predict_batch.py [--images 8] [--rounds 3] [--size 320] [--same-shape]
        [--json-out FILE]

The model is the small one (ResNet-18 FPN) at --size (short side; long side at most 5/3 of it), its
class and objectness biases raised so that every image keeps torchvision's 100 detections (the mask
head's work included), on COCO-like images alternating landscape and portrait (480x640 and 640x480),
so that each batch of two or more is padded to a square (--same-shape: all landscape, batching's best
case, where no batch pads an image). CPU, on the current thread count. Each round
times every batch size once, in turn; the figure is the median round's seconds per image. On a shared
machine compare the ratios of one invocation, not figures across invocations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.engines.torch_engine import TorchEngine

BATCH_SIZES = (1, 2, 4)


def make_engine(size: int) -> TorchEngine:
    torch.manual_seed(0)
    cfg = apply_overrides(TrainConfig(), {**small_cpu_run(size), "max-size": size * 5 // 3}, "bench")
    cfg.validate()
    engine = TorchEngine(cfg, 4, iters_per_epoch=1)
    with torch.no_grad():  # an untrained head detects nothing: make it keep its 100 detections, as a trained one
        engine.model.roi_heads.box_predictor.cls_score.bias[1:] += 3
        engine.model.rpn.head.cls_logits.bias += 2
    return engine


def seconds_per_image(engine: TorchEngine, images: list[torch.Tensor], batch_size: int) -> float:
    started = time.perf_counter()
    for start in range(0, len(images), batch_size):
        engine.predict(images[start : start + batch_size])
    return (time.perf_counter() - started) / len(images)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--same-shape", action="store_true", help="every image 480x640 (no padding in a batch)")
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    engine = make_engine(args.size)
    generator = torch.Generator().manual_seed(0)
    shapes = [(480, 640) if i % 2 == 0 or args.same_shape else (640, 480) for i in range(args.images)]
    images = [torch.rand(3, *shape, generator=generator) for shape in shapes]
    seconds_per_image(engine, images[:2], 2)  # warm-up
    times: dict[int, list[float]] = {b: [] for b in BATCH_SIZES}
    for _ in range(args.rounds):
        for batch_size in BATCH_SIZES:
            times[batch_size].append(seconds_per_image(engine, images, batch_size))
    median = {b: statistics.median(t) for b, t in times.items()}
    kind = "one shape" if args.same_shape else "landscape and portrait"
    print(f"predict, ResNet-18 FPN at {args.size} px, {args.images} images ({kind}), {torch.get_num_threads()} threads")
    for batch_size in BATCH_SIZES:
        ratio = median[1] / median[batch_size]
        print(f"  batch {batch_size}: {median[batch_size]:.3f} s/image  (batch 1 takes {ratio:.2f}x its time)")
    if args.json_out:
        args.json_out.write_text(json.dumps({"seconds_per_image": median, "rounds": times}, indent=2) + "\n")


if __name__ == "__main__":
    main()
