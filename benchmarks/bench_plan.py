"""The cost of an epoch's batch list at COCO's size (118,287 images): one rank's per-rank list as the
loader built it before data/plan.py (DistributedSampler's shard, grouped per rank: `per_rank_list`), beside
the epoch's global batches and this rank's share of each (`epoch_plan` + `rank_share` over the whole
epoch: what `build_step_loader` did at every epoch start until issue 57; now it makes each step's when
the step comes), measured in one run, interleaved.

    PYTHONPATH=src:launcher python benchmarks/bench_plan.py [--images 118287] [--world 8] [--batch-size 2]

Each rank builds its list once per epoch (and once per resume). Printed: median seconds over the
repetitions, and the peak of Python allocations while building (tracemalloc), for world sizes of the
launch and, for the plan, the share at other world sizes (a resume on fewer ranks).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections.abc import Callable

import numpy as np
from torch.utils.data import DistributedSampler

from maskrcnn_dist.data.loader import aspect_ratio_groups
from maskrcnn_dist.data.plan import BatchLayout, epoch_plan, grouped_batches, rank_share


def coco_like_ratios(n: int, seed: int = 0) -> list[float]:
    """Width/height ratios spread as COCO's are: most near 4:3 and 3:4, a tail either side."""
    rng = np.random.default_rng(seed)
    landscape = rng.random(n) < 0.7
    ratios = np.where(landscape, rng.normal(1.36, 0.15, n), rng.normal(0.76, 0.08, n))
    return np.clip(ratios, 0.25, 4.0).tolist()


def per_rank_list(ratios: list[float], batch_size: int, world: int, rank: int) -> int:
    """The baseline, the loader's list before the plan: this rank's DistributedSampler shard of the epoch
    (padded to ceil(n / world) images), cut into batches grouped by aspect ratio."""
    sampler = DistributedSampler(range(len(ratios)), num_replicas=world, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(1)
    order = list(sampler)
    groups = aspect_ratio_groups(ratios, 3)
    return len(grouped_batches(order, [groups[i] for i in order], batch_size))


def planned(ratios: list[float], batch_size: int, launch: int, world: int, rank: int) -> int:
    groups = aspect_ratio_groups(ratios, 3)
    plan = epoch_plan(len(ratios), BatchLayout(launch, batch_size), epoch=1, seed=0, groups=groups)
    shares = [rank_share(batch, rank, world) for batch in plan]
    return len(shares)


def timed(run: Callable[[], int]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def peak_mib(run: Callable[[], int]) -> float:
    tracemalloc.start()
    run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=118_287)
    parser.add_argument("--world", type=int, default=8, help="the launch's world size")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    ratios = coco_like_ratios(args.images)
    b, n = args.batch_size, args.world
    cases: dict[str, Callable[[], int]] = {
        f"before the plan: per-rank list, {n} ranks (rank 0)": lambda: per_rank_list(ratios, b, n, 0),
        f"plan: global batches + rank 0's share, {n} ranks": lambda: planned(ratios, b, n, n, 0),
        f"plan: the same, resumed on {max(1, n // 2)} ranks": lambda: planned(ratios, b, n, max(1, n // 2), 0),
        "plan: the same, resumed on 1 rank": lambda: planned(ratios, b, n, 1, 0),
    }
    assert per_rank_list(ratios, b, n, 0) == planned(ratios, b, n, n, 0)  # the same steps per epoch
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeat):  # interleaved: each round runs every case once
        for name, run in cases.items():
            seconds[name].append(timed(run))
    print(f"{args.images} images, --batch-size {b}, launch world size {n}, aspect-ratio groups (factor 3)")
    print(f"{'case':<52} {'median s':>9} {'min s':>7} {'peak MiB':>9}")
    for name, run in cases.items():
        times = seconds[name]
        print(f"{name:<52} {statistics.median(times):>9.3f} {min(times):>7.3f} {peak_mib(run):>9.1f}")


if __name__ == "__main__":
    main()
