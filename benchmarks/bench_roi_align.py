"""RoIAlign as Mask R-CNN R50-FPN uses it at 800 px: torchvision's CPU kernel vs maskrcnn-dist's sparse one.

    .venv/bin/python benchmarks/bench_roi_align.py [--threads 2] [--repeats 3] [--json-out FILE]

Both poolers run on the same FPN pyramid (a batch of two 800 x 1088 images: maps from 200 x 272 at
stride 4 to 25 x 34 at stride 32, 256 channels, channels_last as the backbone returns them) and the
same boxes, sized like a training step's: the box head pools 512 sampled proposals per image to 7 x 7,
the mask head 128 positives per image to 14 x 14 (torchvision's defaults), box sides log-uniform
from 16 to 800 px so that every FPN level gets some. Each is timed forward and backward (the
features' gradient), in fp32 and with bf16 features under autocast (--amp); the best of `repeats`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torchvision.ops import MultiScaleRoIAlign

from maskrcnn_dist.modeling.roi_align import SparseMultiScaleRoIAlign

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script's module, not a package)

IMAGE_SHAPES = [(800, 1088), (800, 1066)]
LEVELS = ["0", "1", "2", "3"]
POOLERS = {"box": (7, 512), "mask": (14, 128)}  # output size, RoIs per image


def pyramid(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(2, 256, 800 // stride, 1088 // stride, generator=g).contiguous(
            memory_format=torch.channels_last
        )
        for name, stride in zip(LEVELS, (4, 8, 16, 32))
    }


def boxes(per_image: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    result = []
    for height, width in IMAGE_SHAPES:
        side = torch.exp(torch.empty(per_image, 2).uniform_(2.77, 6.68, generator=g))  # 16 to 800 px
        limit = torch.tensor([width, height], dtype=torch.float32)
        xy = torch.rand(per_image, 2, generator=g) * (limit - side).clamp(min=0)
        result.append(torch.cat([xy, torch.minimum(xy + side, limit)], dim=1))
    return result


def time_pooler(
    pooler: torch.nn.Module, features: dict[str, torch.Tensor], rois: list[torch.Tensor], amp: bool, repeats: int
) -> dict[str, float]:
    forward, backward = [], []
    for _ in range(repeats + 1):  # the first run warms up (and lets the pooler set up its scales)
        leaves = {k: v.detach().clone().requires_grad_() for k, v in features.items()}
        inputs = {k: v.bfloat16() if amp else v for k, v in leaves.items()}
        started = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            pooled = pooler(inputs, rois, IMAGE_SHAPES)
        forwarded = time.perf_counter()
        pooled.backward(torch.ones_like(pooled))
        forward.append(forwarded - started)
        backward.append(time.perf_counter() - forwarded)
    return {"forward_ms": round(1000 * min(forward[1:]), 1), "backward_ms": round(1000 * min(backward[1:]), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    features = pyramid(seed=0)
    rows: list[dict[str, Any]] = []
    for head, (size, per_image) in POOLERS.items():
        rois = boxes(per_image, seed=1)
        for amp in (False, True):
            for kind, cls in (("torchvision", MultiScaleRoIAlign), ("sparse", SparseMultiScaleRoIAlign)):
                timing = time_pooler(cls(LEVELS, size, 2), features, rois, amp, args.repeats)
                rows.append({"head": head, "precision": "amp" if amp else "fp32", "pooler": kind, **timing})
    lines = [f"{'head':5s} {'precision':9s} {'pooler':12s} {'forward ms':>10s} {'backward ms':>11s} {'speed-up':>8s}"]
    for row in rows:
        reference = next(
            r
            for r in rows
            if (r["head"], r["precision"], r["pooler"]) == (row["head"], row["precision"], "torchvision")
        )
        total, ref_total = row["forward_ms"] + row["backward_ms"], reference["forward_ms"] + reference["backward_ms"]
        row["speedup"] = round(ref_total / total, 2)
        lines.append(
            f"{row['head']:5s} {row['precision']:9s} {row['pooler']:12s} {row['forward_ms']:10.1f} "
            f"{row['backward_ms']:11.1f} {row['speedup']:7.2f}x"
        )
    report = {"threads": args.threads, "image_shapes": IMAGE_SHAPES, "rows": rows}
    common.emit("\n".join(lines), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
