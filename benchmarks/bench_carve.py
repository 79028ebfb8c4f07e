"""--val-fraction's carve at a start: what the carve reads to list the train file's image ids, the old
way (the file's JSON parsed whole at every start) beside the new one (the store the first start cached,
mapped and verified), measured in one run, interleaved, each trial in a fresh forked process.

    .venv/bin/python benchmarks/bench_carve.py [--images 20000] [--annotations-per-image 7] [--rounds 3]

Writes a COCO instances file of N images with polygon annotations (about 55 MB at the defaults, the
size the issue measured), caches its store once (what a first start does), then times, per trial, the
wall time and the peak RSS of the process (ru_maxrss) for each way.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from maskrcnn_dist.data.annotations.json_read import image_ids
from maskrcnn_dist.data.annotations.read import open_store
from maskrcnn_dist.data.sources.resolve import listed_ids


def write_file(path: Path, images: int, per_image: int) -> None:
    rng = np.random.default_rng(0)
    records, annotations = [], []
    for iid in range(1, images + 1):
        records.append({"id": iid, "file_name": f"{iid:012d}.jpg", "width": 640, "height": 480})
        for _ in range(per_image):
            x, y = rng.uniform(0, 500, 2).round(2).tolist()
            polygon = [round(v, 2) for v in rng.uniform(0, 100, 16).tolist()]
            polygon = [v + (x if k % 2 == 0 else y) for k, v in enumerate(polygon)]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": iid,
                    "category_id": 1,
                    "bbox": [x, y, 100.0, 100.0],
                    "segmentation": [polygon],
                    "area": 5000.0,
                    "iscrowd": 0,
                }
            )
    data = {"images": records, "annotations": annotations, "categories": [{"id": 1, "name": "thing"}]}
    path.write_text(json.dumps(data))


def _trial(way: str, path: Path, cache: Path, out: multiprocessing.Queue) -> None:
    started = time.perf_counter()
    ids = image_ids(path) if way == "old" else listed_ids(path, cache)
    seconds = time.perf_counter() - started
    out.put((seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, len(ids)))


def measure(way: str, path: Path, cache: Path) -> tuple[float, float, int]:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    child = context.Process(target=_trial, args=(way, path, cache, out))
    child.start()
    result = out.get(timeout=600)
    child.join()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--annotations-per-image", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path, cache = Path(tmp) / "train.json", Path(tmp) / "cache"
        write_file(path, args.images, args.annotations_per_image)
        open_store(path, cache)  # the first start's cache
        print(f"{path.stat().st_size / 1e6:.0f} MB JSON, {args.images} images")
        results: dict[str, list[tuple[float, float, int]]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for way in ("old", "new"):
                results[way].append(measure(way, path, cache))
        counts = {r[2] for rs in results.values() for r in rs}
        assert len(counts) == 1, counts
        for way, label in (("old", "old: the JSON parsed"), ("new", "new: the cached store")):
            seconds = sorted(r[0] for r in results[way])
            peak = max(r[1] for r in results[way])
            print(
                f"{label:24s} median {seconds[len(seconds) // 2]:.3f} s (min {seconds[0]:.3f}), peak RSS {peak:.0f} MiB"
            )


if __name__ == "__main__":
    main()
