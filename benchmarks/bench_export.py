"""`maskrcnn-dist export` of Mask R-CNN R50-FPN at 800 px: parity, export time, and inference speed of the
exported files against eager PyTorch, all measured in one run on this CPU.

    .venv/bin/python benchmarks/bench_export.py [--images 4] [--threads 2] [--repeats 2] [--json-out FILE]

The model is maskrcnn_resnet50_fpn for 3 classes with seeded random weights (no pretrained weights can be
downloaded here), saved as a weights file and exported through the library call the CLI wraps
(outputs.export.export_model), once as TorchScript and once as ONNX, each with its parity check on
`--images` synthetic images of 600 to 800 x 800 px (resized to 800 px by the model, --max-size 1333).
Then each of eager PyTorch (the model `predict` runs), the TorchScript file and the ONNX file in
onnxruntime predicts every image `--repeats` times after one warm-up pass, one image per call, fp32,
`--threads` threads each: the best pass gives images/s.

Eager PyTorch is timed twice: the model `predict` runs (its CPU RoIAlign and channels_last speed-ups,
perf.py and roi_align.py) and the same weights in torchvision's own modules, the model that is exported.

A random model scores every class near 1/3, so every image keeps detections_per_img (100) detections,
each with an 800 px mask to paste: the parity check compares all of them, and the timings include the
mask pasting a trained model on sparse images would mostly skip.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from maskrcnn_dist.config import ExportConfig, ModelConfig
from maskrcnn_dist.data import generate_synthetic_coco, read_image
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.outputs.export import FORMATS, export_model
from maskrcnn_dist.outputs.export.command import exportable_model
from maskrcnn_dist.outputs.export.parity import table_lines
from maskrcnn_dist.outputs.predictor import load_predictor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script's module, not a package)

MODEL = "maskrcnn_resnet50_fpn"
CLASSES = 4  # 3 shape classes and the background, as the synthetic set has
SIZE = {"min-size": 800, "max-size": 1333}
SUFFIX = {"torchscript": ".pt", "onnx": ".onnx"}


def images_per_s(run, images: list[torch.Tensor], repeats: int) -> float:
    """The best of `repeats` timed passes over `images`, one image per call, after a warm-up pass."""

    @torch.no_grad()
    def one_pass() -> None:
        for image in images:
            run(image)

    return len(images) / common.seconds_per_call(one_pass, repeats, warmup=1, statistic=min)


def measure(root: Path, count: int, threads: int, repeats: int) -> tuple[list[str], dict[str, Any]]:
    torch.manual_seed(0)
    weights = root / "r50_random.pt"
    torch.save(build_model(ModelConfig(name=MODEL, min_size=800, max_size=1333), CLASSES).state_dict(), weights)
    data = generate_synthetic_coco(root / "images", num_images=count, image_size=(600, 800), seed=1)
    paths = sorted(data.image_dir.iterdir())
    flags = {"weights": weights, "model": MODEL, **SIZE, "threads": threads}
    tensors = [read_image(path)[0] for path in paths]
    sizes = ", ".join(f"{t.shape[2]}x{t.shape[1]}" for t in tensors)
    lines = [f"{MODEL}, random weights, min/max size 800/1333, images {sizes}, {threads} threads", ""]
    report: dict[str, Any] = {"model": MODEL, "images": count, "threads": threads, "formats": {}}
    predictor = load_predictor({**flags, "device": "cpu"}, command="benchmark")
    eager = images_per_s(lambda image: predictor.predict([image]), tensors, repeats)
    exportable = exportable_model(predictor)
    plain = images_per_s(lambda image: exportable([image]), tensors, repeats)
    report["eager_images_per_s"] = round(eager, 3)
    report["eager_torchvision_modules_images_per_s"] = round(plain, 3)
    for fmt in ("torchscript", "onnx"):
        out = root / f"model{SUFFIX[fmt]}"
        shown: list[str] = []
        try:
            summary = export_model(ExportConfig(format=fmt, out=out), flags, [data.image_dir], echo=shown.append)
        finally:
            print("\n".join(shown))  # the parity table, also when the check fails
        runner = FORMATS[fmt].load(out)
        speed = images_per_s(runner, tensors, repeats)
        parity = summary.parity
        lines += ["", f"{fmt}: exported in {summary.seconds:.1f} s, {out.stat().st_size / 2**20:.0f} MiB", ""]
        lines += table_lines(parity)
        report["formats"][fmt] = {
            "export_seconds": round(summary.seconds, 2),
            "mib": round(out.stat().st_size / 2**20, 1),
            "max_box_diff_px": max(r.box_diff for r in parity),
            "max_score_diff": max(r.score_diff for r in parity),
            "min_mask_iou": min(r.mask_iou for r in parity),
            "matched": sum(r.matched for r in parity),
            "eager_detections": sum(r.eager for r in parity),
            "exported_detections": sum(r.exported for r in parity),
            "images_per_s": round(speed, 3),
            "speed_over_eager": round(speed / eager, 3),
        }
    lines += ["", f"{'inference, one image per call':32} images/s  vs eager"]
    lines.append(f"{'eager PyTorch (what predict runs)':32} {eager:8.3f}  1.00")
    lines.append(f"{'eager, torchvision modules':32} {plain:8.3f}  {plain / eager:.2f}")
    for fmt, figures in report["formats"].items():
        runtime = "onnxruntime" if fmt == "onnx" else "TorchScript"
        lines.append(f"{runtime:32} {figures['images_per_s']:8.3f}  {figures['speed_over_eager']:.2f}")
    return lines, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=4, help="parity and timing images")
    parser.add_argument("--threads", type=int, default=2, help="torch and onnxruntime threads")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes (after one warm-up)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_export_") as tmp:
        lines, report = measure(Path(tmp), args.images, args.threads, args.repeats)
    common.emit("\n".join(lines), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
