"""The data check's speed (data/images/check.py): images/s in header and full mode, and what that makes of
COCO 2017's 118,287 train images.

    .venv/bin/python benchmarks/bench_data_check.py [--images 20000] [--full-images 2000] [--processes N]
        [--format jpeg|png]

Writes a COCO-layout folder (annotations/instances_train2017.json + train2017/) of N images at COCO's
typical 640 x 480 (JPEGs with a camera's EXIF block, or PNGs), copied from 16 distinct encoded images
(content matters to decoding, not to the header check), then times `check_images` on it with the
process pool the trainer uses. The files were just written, so they are in the page cache: this
measures the check's CPU cost, not a cold disk's or a network volume's read speed. The CPU time per
image (this process and the pool's, user + system) varies less than the rate on a shared machine.
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from maskrcnn_dist.data.dataset import CocoInstanceDataset
from maskrcnn_dist.data.images.check import CheckRules, available_cores, check_images

COCO_TRAIN_IMAGES = 118_287
SIZE = (640, 480)
TEMPLATES = 16


def _encoded(seed: int, fmt: str) -> bytes:
    """A smooth random picture with some noise: about the size a COCO photo has at this resolution;
    a JPEG carries the EXIF block a camera writes (make, model, time, orientation 1)."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (SIZE[1] // 32, SIZE[0] // 32, 3)).astype(np.uint8)
    smooth = Image.fromarray(coarse).resize(SIZE, Image.BILINEAR)
    pixels = np.asarray(smooth, dtype=np.int16) + rng.integers(-12, 13, (SIZE[1], SIZE[0], 3))
    buffer = io.BytesIO()
    picture = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    if fmt == "png":
        picture.save(buffer, "PNG")
        return buffer.getvalue()
    exif = Image.Exif()
    exif.update({0x010F: "Camera maker", 0x0110: "Camera 1", 0x0132: "2024:05:01 12:00:00", 0x0112: 1})
    picture.save(buffer, "JPEG", quality=90, exif=exif)
    return buffer.getvalue()


def write_folder(root: Path, count: int, fmt: str = "jpeg") -> Path:
    """A COCO 2017 layout of `count` images (no annotations: the check reads only `images`)."""
    images = root / "train2017"
    images.mkdir(parents=True)
    templates = [_encoded(seed, fmt) for seed in range(TEMPLATES)]
    entries = []
    for i in range(1, count + 1):
        name = f"{i:012d}.{'png' if fmt == 'png' else 'jpg'}"
        (images / name).write_bytes(templates[i % TEMPLATES])
        entries.append({"id": i, "file_name": name, "width": SIZE[0], "height": SIZE[1]})
    annotations = root / "annotations" / "instances_train2017.json"
    annotations.parent.mkdir()
    data = {"images": entries, "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    annotations.write_text(json.dumps(data))
    return annotations


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (the check's pool)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000, help="images in the folder (header mode)")
    parser.add_argument("--full-images", type=int, default=2_000, help="the first N of them, decoded (full mode)")
    parser.add_argument("--processes", type=int, default=None, help="pool size (default: the available cores)")
    parser.add_argument("--format", choices=("jpeg", "png"), default="jpeg", help="the images' file format")
    args = parser.parse_args()
    processes = args.processes or available_cores()
    root = Path(tempfile.mkdtemp(prefix="bench_data_check_"))
    try:
        annotations = write_folder(root, args.images, args.format)
        entries = CocoInstanceDataset(root / "train2017", annotations).image_entries()
        print(f"{args.images} {args.format.upper()}s of {SIZE[0]}x{SIZE[1]} under {root}, {processes} processes")
        for mode, subset in (("header", entries), ("full", entries[: args.full_images])):
            cpu = cpu_seconds()
            report = check_images(subset, CheckRules(mode), source=str(annotations), processes=processes)
            cpu = cpu_seconds() - cpu
            assert not report.bad, report.bad[:3]
            rate = report.images_per_second
            print(
                f"{mode:6s}: {report.checked} images in {report.seconds:.2f} s = {rate:.0f} images/s "
                f"(CPU {1e6 * cpu / report.checked:.0f} us per image); "
                f"COCO train ({COCO_TRAIN_IMAGES}) would take {COCO_TRAIN_IMAGES / rate:.0f} s"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
