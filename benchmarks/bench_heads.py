"""Host waits and seconds per training step of the batched heads against torchvision's, in one run.

    .venv/bin/python benchmarks/bench_heads.py [--batches 2,8] [--size 128] [--rounds 3] [--steps 2]
        [--variants torchvision,batched,batched_padded] [--json-out FILE]

Every variant is the kit's local engine (`TorchEngine.train_step`) on R18-FPN at `--size` px, built from
the same seed and fed the same images of the kit's synthetic set (shapes with masks); only `--heads` and
the batched heads' row layout differ:
- `torchvision`: `--heads torchvision`, torchvision's RPN and RoI heads, image by image;
- `batched`: `--heads batched` (the default), rows compact: one read a step sizes the heads' rows;
- `batched_padded`: the same with fixed-size rows (no read, the heads compute padding rows too).
Waits are counted on one untimed step of each (modeling/waits.py: reads into Python and operators with
data-dependent shapes). A round runs `--steps` steps of every variant in turn, the order alternating
between rounds, so drift of a shared machine falls on all alike; a variant's figure is the median
seconds per step over its rounds, wall and CPU (the process's CPU time: on a shared machine the wall time
also holds other processes' turns; with `--threads 1` the CPU time is the step's own work).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script's module, not a package)

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run  # noqa: E402
from maskrcnn_dist.data import load_datasets, write_train_val  # noqa: E402
from maskrcnn_dist.engines.torch_engine import TorchEngine  # noqa: E402
from maskrcnn_dist.modeling.waits import HostWaits  # noqa: E402

VARIANTS = {
    "torchvision": ("torchvision", None),
    "batched": ("batched", "compact"),
    "batched_padded": ("batched", "padded"),
}


def engine_for(variant: str, data: Path, out: Path, size: int, batch: int) -> tuple[TorchEngine, list, list]:
    heads, rows = VARIANTS[variant]
    values = small_cpu_run(size, data_path=data, output_dir=out / variant, batch_size=batch, workers=0, heads=heads)
    values.update({"warmup-iters": 10, "aspect-ratio-group-factor": -1, "epochs": 1})
    cfg = apply_overrides(TrainConfig(), values, "bench_heads")
    cfg.validate()
    train_set, _ = load_datasets(cfg)
    images, targets = (list(x) for x in zip(*(train_set[i] for i in range(batch))))
    torch.manual_seed(0)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=1000)
    if rows is not None:
        engine.model.roi_heads.rows = rows
    return engine, images, targets


def measure(batch: int, args: argparse.Namespace, data: Path, out: Path) -> list[dict[str, Any]]:
    engines = {v: engine_for(v, data, out, args.size, batch) for v in args.variants}
    rows = {}
    for variant, (engine, images, targets) in engines.items():
        engine.train_step(0, images, targets)  # sets up the poolers' scales and the NMS's settling
        with HostWaits() as waits:
            engine.train_step(1, images, targets)
        rows[variant] = {
            "variant": variant,
            "batch": batch,
            "waits": waits.total,
            "by_name": dict(waits.counts),
            "seconds": [],
            "cpu_seconds": [],
        }
    step = 2
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for variant in order:
            engine, images, targets = engines[variant]
            started, cpu_started = time.perf_counter(), time.process_time()
            for i in range(args.steps):
                engine.train_step(step + i, images, targets)
            rows[variant]["seconds"].append((time.perf_counter() - started) / args.steps)
            rows[variant]["cpu_seconds"].append((time.process_time() - cpu_started) / args.steps)
        step += args.steps
    for row in rows.values():
        row["s_per_step"] = round(statistics.median(row["seconds"]), 3)
        row["cpu_s_per_step"] = round(statistics.median(row["cpu_seconds"]), 3)
        row["seconds"] = [round(s, 3) for s in row["seconds"]]
        row["cpu_seconds"] = [round(s, 3) for s in row["cpu_seconds"]]
    return list(rows.values())


def render(results: list[dict[str, Any]], host: dict[str, Any]) -> str:
    header = ["batch", "variant", "waits/step", "s/step", "CPU s/step", "vs torchvision (CPU s)", "waits by name"]
    base = {r["batch"]: r["cpu_s_per_step"] for r in results if r["variant"] == "torchvision"}
    body = [
        [
            r["batch"],
            r["variant"],
            r["waits"],
            r["s_per_step"],
            r["cpu_s_per_step"],
            f"{base[r['batch']] / r['cpu_s_per_step']:.2f}x" if r["batch"] in base else "",
            ", ".join(f"{k} {v}" for k, v in sorted(r["by_name"].items())),
        ]
        for r in results
    ]
    return f"{host['cpu']['model']}; load average {host['load']}\n" + common.render_markdown(header, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="2,8")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in args.variants if v not in VARIANTS]:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # as the trainer's process setup does
    batches = [int(b) for b in args.batches.split(",") if b]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench_heads_") as tmp:
        data = Path(tmp) / "data"
        write_train_val(
            data, num_train=max(batches), num_val=2, seed=3, image_size=(args.size, args.size), max_objects=6
        )
        load_before = os.getloadavg()
        for batch in batches:
            results += measure(batch, args, data, Path(tmp))
            print(f"batch {batch} done", file=sys.stderr, flush=True)
        load = [round((a + b) / 2, 2) for a, b in zip(load_before, os.getloadavg())]
    host = {"torch": torch.__version__, "cpu": common.cpu_isa(), "threads": args.threads, "load": load}
    report = {"host": host, "size": args.size, "rounds": args.rounds, "steps": args.steps, "results": results}
    common.emit(render(results, host), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
