"""The synthetic COCO generator's speed: 64 images of 128 px with up to 4 objects (what the original
brief asked to take well under 2 s), median and fastest of a few rounds, with the load beside them.
A figure, not a test: the suite decides nothing by the clock (docs/testing.md).

    .venv/bin/python benchmarks/bench_synthetic.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from maskrcnn_dist.data import generate_synthetic_coco


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory(prefix="bench-synthetic-") as tmp:
        for k in range(args.rounds):
            out = Path(tmp) / str(k)
            started = time.perf_counter()
            generate_synthetic_coco(out, num_images=64, image_size=128, max_objects=4, seed=k)
            times.append(time.perf_counter() - started)
            shutil.rmtree(out)
    load = os.getloadavg()[0]
    print(f"64 images, 128 px: median {statistics.median(times):.2f} s, fastest {min(times):.2f} s (load {load:.1f})")


if __name__ == "__main__":
    main()
