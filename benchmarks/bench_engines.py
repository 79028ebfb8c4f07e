"""Throughput of the `local` engine (1 process x 2 threads) against `ddp` (2 processes x 1 thread).

Both runs train the same model on the same synthetic COCO set with the same flags; only the engine
and the thread layout differ. Each run writes its `metrics.jsonl`; throughput is taken from the
records' time stamps over the measured window (after `--warmup` steps):

    images/s = (last.step - warmup) * batch_size * processes / (last.time - record[warmup].time)

rather than an average of per-step rates: the window then includes data loading, metrics and the
gaps between steps, as a long run would, and a slow step weighs by its duration, not by 1/N.

Validation and evaluation are off: the data set has no val split (the trainer then skips both), and
epochs end only after the last measured step. This is a script, not a test:

    .venv/bin/python benchmarks/bench_engines.py --image-size 128 --batch-size 2 --steps 15
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import common  # a sibling script's module (this folder is first on sys.path)
from common import render_table as render_table_columns

from maskrcnn_dist.config import small_cpu_run, to_argv

ENGINES = ("local", "ddp")


@dataclass(frozen=True)
class BenchConfig:
    model: str
    image_size: int
    batch_size: int  # images per step per process
    steps: int  # measured steps
    warmup: int  # steps before the measured window
    workers: int
    seed: int
    timeout_s: float


@dataclass(frozen=True)
class EngineResult:
    engine: str
    processes: int
    threads_per_process: int
    measured_steps: int
    images: int
    seconds: float
    images_per_s: float
    # The trainer's own per-step figure, for comparison; the window figure above is the headline.
    median_step_images_per_s: float
    wall_s: float  # the whole run, start-up and warm-up included


def train_flags(cfg: BenchConfig, data_path: Path, output_dir: Path) -> dict[str, Any]:
    """The flags both engines share: the small CPU run (config.small_cpu_run) with this benchmark's model,
    size and schedule."""
    return small_cpu_run(cfg.image_size, model=cfg.model) | {
        "data-path": data_path,
        "output-dir": output_dir,
        "batch-size": cfg.batch_size,
        "workers": cfg.workers,
        "seed": cfg.seed,
        "max-steps": cfg.warmup + cfg.steps,
        # One epoch is at least as long as the run (see make_dataset), so no epoch end falls inside
        # the window; these keep it that way if the data set is ever larger.
        "epochs": 1000,
        "eval-every-epoch": False,
        "val-period": 0,
        "checkpoint-period": 0,
        "keep-checkpoints": 1,
        "print-freq": cfg.warmup + cfg.steps,
        # Fixed order (no aspect-ratio grouping).
        "aspect-ratio-group-factor": -1,
    }


def make_dataset(cfg: BenchConfig, root: Path, processes: int) -> Path:
    """A train split only (no val split: no validation, no COCO evaluation), with enough images that
    the widest run (`processes` ranks) does all its steps inside its first epoch."""
    from maskrcnn_dist.data import generate_synthetic_coco

    images = (cfg.warmup + cfg.steps) * cfg.batch_size * processes
    generate_synthetic_coco(
        root / "train",
        num_images=images,
        image_size=(int(cfg.image_size * 0.75), cfg.image_size),
        seed=cfg.seed,
    )
    return root


def measure(
    metrics_file: Path, cfg: BenchConfig, engine: str, processes: int, threads: int, wall_s: float
) -> EngineResult:
    """Throughput over the window after the warm-up, from the train records' time stamps."""
    from maskrcnn_dist.training.metrics import read_metrics

    records = sorted((r for r in read_metrics(metrics_file) if r["kind"] == "train"), key=lambda r: r["step"])
    # A resumed or repeated run would append to the file: keep the last record of each step.
    by_step = {r["step"]: r for r in records}
    first, last = by_step.get(cfg.warmup), by_step.get(cfg.warmup + cfg.steps)
    if first is None or last is None:
        raise RuntimeError(f"{metrics_file}: missing train records for steps {cfg.warmup} and {cfg.warmup + cfg.steps}")
    measured = last["step"] - first["step"]
    seconds = last["time"] - first["time"]
    images = measured * cfg.batch_size * processes
    window = [r["images_per_s"] for step, r in by_step.items() if first["step"] < step <= last["step"]]
    return EngineResult(
        engine=engine,
        processes=processes,
        threads_per_process=threads,
        measured_steps=measured,
        images=images,
        seconds=round(seconds, 3),
        images_per_s=round(images / max(seconds, 1e-9), 3),
        median_step_images_per_s=round(statistics.median(window), 3),
        wall_s=round(wall_s, 1),
    )


def run_local(cfg: BenchConfig, data_path: Path, output_dir: Path, threads: int = 2) -> EngineResult:
    """The local engine in this process, through the library."""
    from maskrcnn_dist.config import TrainConfig, apply_overrides
    from maskrcnn_dist.train import train

    values = {**train_flags(cfg, data_path, output_dir), "engine": "local", "threads": threads}
    train_cfg = apply_overrides(TrainConfig(), values, "benchmark")
    train_cfg.validate()
    started = time.monotonic()
    train(train_cfg)
    return measure(output_dir / "metrics.jsonl", cfg, "local", 1, threads, time.monotonic() - started)


def torchrun_command(processes: int, flags: dict[str, Any]) -> list[str]:
    """`maskrcnn-dist train` under torchrun with `processes` ranks on this host."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    return [*torchrun, "-m", "maskrcnn_dist.cli", "train", *to_argv(flags)]


def run_ddp(cfg: BenchConfig, data_path: Path, output_dir: Path, processes: int = 2, threads: int = 1) -> EngineResult:
    """The ddp engine under torchrun on this host, as `maskrcnn-dist train --engine ddp` runs it."""
    flags = {**train_flags(cfg, data_path, output_dir), "engine": "ddp", "threads": threads}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    common.run_group(torchrun_command(processes, flags), env, output_dir / "torchrun.log", cfg.timeout_s)
    return measure(output_dir / "metrics.jsonl", cfg, "ddp", processes, threads, time.monotonic() - started)


def render_table(cfg: BenchConfig, results: list[EngineResult]) -> str:
    header = ("engine", "procs x threads", "steps", "images", "seconds", "images/s", "median step images/s")
    rows = [
        (
            r.engine,
            f"{r.processes} x {r.threads_per_process}",
            str(r.measured_steps),
            str(r.images),
            f"{r.seconds:.2f}",
            f"{r.images_per_s:.2f}",
            f"{r.median_step_images_per_s:.2f}",
        )
        for r in results
    ]
    title = (
        f"{cfg.model}, {cfg.image_size} px, batch {cfg.batch_size} per process, "
        f"{cfg.steps} measured steps after {cfg.warmup} warm-up"
    )
    return title + "\n" + render_table_columns(header, rows, right_from=1)


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="maskrcnn_resnet18_fpn", choices=("maskrcnn_resnet18_fpn", "maskrcnn_resnet50_fpn")
    )
    parser.add_argument(
        "--image-size",
        type=int,
        default=128,
        help="min and max size of the model's resize, and the largest side of the synthetic images",
    )
    parser.add_argument("--batch-size", type=int, default=2, help="images per step per process")
    parser.add_argument("--steps", type=int, default=15, help="measured steps")
    parser.add_argument("--warmup", type=int, default=3, help="steps before the measured window (at least 1)")
    parser.add_argument(
        "--workers", type=int, default=0, help="DataLoader workers per process (0: load in the training process)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="local,ddp", help="comma separated subset of local,ddp")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the ddp run is ended")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="keep data and runs here (default: a temporary folder)"
    )
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON result to this file")
    args = parser.parse_args(argv)
    if args.warmup < 1:
        parser.error("--warmup must be >= 1: the window starts at the warm-up's last time stamp")
    if args.steps < 1 or args.batch_size < 1 or args.image_size < 32:
        parser.error("--steps and --batch-size must be >= 1, --image-size >= 32")
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINES):
        parser.error(f"--engines: a comma separated subset of {','.join(ENGINES)}")
    args.engines = engines
    cfg = BenchConfig(
        args.model, args.image_size, args.batch_size, args.steps, args.warmup, args.workers, args.seed, args.timeout
    )
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so run_ddp's cleanup ends the torchrun group.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        work = args.work_dir or Path(tmp)
        data = make_dataset(cfg, work / "data", processes=2)
        results = []
        for engine in args.engines:
            run = run_local if engine == "local" else run_ddp
            results.append(run(cfg, data, work / engine))
        report = {
            "config": asdict(cfg),
            "host": {"cpu_count": os.cpu_count()},
            "results": [asdict(r) for r in results],
        }
        by_engine = {r.engine: r for r in results}
        if len(by_engine) == 2:
            report["ddp_over_local"] = round(by_engine["ddp"].images_per_s / by_engine["local"].images_per_s, 3)
    common.emit(render_table(cfg, results), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
