"""Training images/s of every engine in fp32 and under --amp, and the data loader's images/s alone.

    .venv/bin/python benchmarks/bench_throughput.py [--configs small,r50] [--engines local,ddp,pipeline]
        [--precisions fp32,amp] [--repeats 1] [--json-out FILE]

Configurations (`CONFIGS`): `r50` is Mask R-CNN R50-FPN at torchvision's default size (short side
800 px, long side at most 1333) with batch 2; `small` is the test suite's small model
(ResNet-18 FPN) at 128 px, batch 2. Engines, as users run them:
- local: `maskrcnn-dist train --engine local --threads 2` (one process, both cores);
- ddp: torchrun, 2 processes x 1 thread, batch 2 per process;
- pipeline: `maskrcnn-launch local` (master + 2 stage workers on loopback, 1 thread each) with
  M = 4 micro-batches; its batch is max(batch, M), so that each micro-batch holds an image.
Every run is a fresh process tree on the same synthetic data set with the same seed and flags
(channels_last on: the default). images/s is taken from the trainer's own metrics over the steps
after the warm-up (bench_engines.measure: data loading and logging included, as in a long run).

The data loader is measured alone on the same data: images/s with 0, 1 and 2 workers (the first
batch, which includes starting the workers, is reported apart), and per image the cost of decoding
the JPEG and of building the target (the masks' RLE decoding, mostly).

Runs of one configuration are ordered fp32, amp per engine; with --repeats N the sequence is run
N times, reversing the order on every other pass, and the median is reported. On a shared machine
compare ratios from one invocation, not figures across invocations.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from maskrcnn_launcher.peers import free_port

from maskrcnn_dist.config import to_argv

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engines  # noqa: E402  (a sibling script, not a package)
import common  # noqa: E402

ENGINES = ("local", "ddp", "pipeline")
PRECISIONS = ("fp32", "amp")
MICRO_BATCHES = 4
# (processes, intra-op threads per process) of each engine's run.
LAYOUT = {"local": (1, 2), "ddp": (2, 1), "pipeline": (3, 1)}
CONFIGS = {
    "small": bench_engines.BenchConfig(
        model="maskrcnn_resnet18_fpn",
        image_size=128,
        batch_size=2,
        steps=8,
        warmup=3,
        workers=1,
        seed=0,
        timeout_s=1800.0,
    ),
    # ~5-10 s per fp32 step on 2 cores: few steps.
    "r50": bench_engines.BenchConfig(
        model="maskrcnn_resnet50_fpn",
        image_size=800,
        batch_size=2,
        steps=4,
        warmup=2,
        workers=1,
        seed=0,
        timeout_s=3600.0,
    ),
}
# torchvision's default resize: short side 800, long side at most 1333 (synthetic images are 4:3).
MAX_SIZE = {"small": 128, "r50": 1333}


@dataclass(frozen=True)
class Row:
    config: str
    engine: str
    precision: str
    batch_size: int
    processes: int
    threads_per_process: int
    images_per_s: float
    median_step_images_per_s: float
    seconds: float
    wall_s: float
    note: str = ""


def run_engine(
    name: str, cfg: bench_engines.BenchConfig, engine: str, amp: bool, data: Path, out: Path
) -> bench_engines.EngineResult:
    """One training run of `engine` as a fresh process tree; throughput from its metrics file."""
    if engine == "pipeline":
        cfg = replace(cfg, batch_size=max(cfg.batch_size, MICRO_BATCHES))
    processes, threads = LAYOUT[engine]
    flags: dict[str, Any] = {
        **bench_engines.train_flags(cfg, data, out),
        "max-size": MAX_SIZE[name],
        "amp": amp,
        "flush-denormal": True,
        "threads": threads,
    }
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    if engine == "local":
        command = [sys.executable, "-m", "maskrcnn_dist.cli", "train", *to_argv(flags)]
    elif engine == "ddp":
        command = bench_engines.torchrun_command(processes, {**flags, "engine": "ddp"})
    else:
        port = str(free_port())
        command = [sys.executable, "-m", "maskrcnn_launcher", "local", "--master-port", port, "--grace", "5"]
        command += ["--", *to_argv({**flags, "micro-batches": MICRO_BATCHES})]
        processes = 1  # only the master reads data: images per step = its batch
    started = time.monotonic()
    common.run_group(command, env, out / "run.log", cfg.timeout_s)
    return bench_engines.measure(out / "metrics.jsonl", cfg, engine, processes, threads, time.monotonic() - started)


# -- the data loader alone -----------------------------------------------------------------------


@dataclass(frozen=True)
class OneProcess:
    """What data.train_loaders asks of the engine it feeds: here one process, no GPU."""

    data_rank: int = 0
    data_world_size: int = 1
    pin_memory: bool = False


ONE_PROCESS = OneProcess()


def bench_loader(cfg: bench_engines.BenchConfig, data: Path, workers: tuple[int, ...]) -> dict[str, Any]:
    """Images/s of the training loader alone (no model): the one a local run of `cfg` builds
    (data.train_loaders: the plan's steps, --data-augmentation, collate), and the per-image cost of its parts."""
    from maskrcnn_dist.config import build_config
    from maskrcnn_dist.data import load_datasets, train_loaders

    flags = bench_engines.train_flags(cfg, data, data / "unused")
    dataset, _ = load_datasets(build_config(None, flags))  # through the front door, checked, as a run does
    result: dict[str, Any] = {"images": len(dataset), "loaders": []}
    for count in workers:
        loader = train_loaders(build_config(None, {**flags, "workers": count}), dataset, ONE_PROCESS)(0, 0)
        started = time.perf_counter()
        first_s, images = None, 0
        for step in loader:
            images += step.images
            if first_s is None:
                first_s, steady_from, steady_images = time.perf_counter() - started, time.perf_counter(), images
        total = time.perf_counter() - started
        steady = (images - steady_images) / max(time.perf_counter() - steady_from, 1e-9)
        result["loaders"].append(
            {
                "workers": count,
                "first_batch_s": round(first_s or 0.0, 4),
                "images_per_s": round(images / total, 1),
                "steady_images_per_s": round(steady, 1),
            }
        )
    # Per-image parts, in this process: JPEG decode + float conversion, and the target (RLE -> masks).
    image_s, target_s, instances = [], [], 0
    rows = [int(row) for row in dataset._rows]  # noqa: SLF001 (a benchmark may look inside)
    for row in rows:
        t0 = time.perf_counter()
        dataset._read(row)  # noqa: SLF001
        t1 = time.perf_counter()
        target = dataset._target(row)  # noqa: SLF001
        image_s.append(t1 - t0)
        target_s.append(time.perf_counter() - t1)
        instances += len(target["labels"])
    result["per_image_ms"] = {
        "image_decode": round(1000 * statistics.mean(image_s), 3),
        "target_with_mask_decode": round(1000 * statistics.mean(target_s), 3),
        "instances_per_image": round(instances / len(rows), 2),
    }
    return result


# -- the host: what --amp can gain here ----------------------------------------------------------------


def conv_probe(repeats: int = 3) -> dict[str, float]:
    """Forward + backward of the 3x3 convolution that dominates an R50-FPN step at 800 px (256 -> 256
    channels on the stride-4 FPN map of a batch of two 800 x 1088 images), channels_last, in fp32 and
    under bf16 autocast, on 2 threads. The bf16/fp32 ratio bounds what --amp can gain on the
    convolutions (about 80% of a step) of this machine."""
    torch.set_num_threads(2)
    conv = torch.nn.Conv2d(256, 256, 3, padding=1).to(memory_format=torch.channels_last)
    features = torch.randn(2, 256, 200, 272).contiguous(memory_format=torch.channels_last).requires_grad_()
    flops = 3 * 2 * 256 * 256 * 9 * 2 * 200 * 272  # forward, grad of input, grad of weight
    seconds = {}
    for precision in ("fp32", "bf16"):

        def forward_backward(bf16: bool = precision == "bf16") -> None:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = conv(features)
            out.backward(torch.ones_like(out))

        seconds[precision] = common.seconds_per_call(forward_backward, repeats, warmup=1, statistic=min)
    return {
        "fp32_gflops": round(flops / seconds["fp32"] / 1e9, 1),
        "bf16_gflops": round(flops / seconds["bf16"] / 1e9, 1),
        "bf16_over_fp32": round(seconds["fp32"] / seconds["bf16"], 2),
    }


# -- report ------------------------------------------------------------------------------------------


def speedups(rows: list[Row]) -> dict[str, float]:
    """amp / fp32 images/s for each (config, engine) with both measured."""
    by_key = {(r.config, r.engine, r.precision): r.images_per_s for r in rows if r.images_per_s}
    return {
        f"{config}/{engine}": round(by_key[(config, engine, "amp")] / by_key[(config, engine, "fp32")], 3)
        for config, engine, precision in by_key
        if precision == "fp32" and (config, engine, "amp") in by_key
    }


def render(rows: list[Row], loaders: dict[str, Any], gains: dict[str, float], host: dict[str, Any]) -> str:
    header = ("config", "engine", "precision", "batch", "procs x threads", "images/s", "median step img/s", "note")
    body = [
        (
            r.config,
            r.engine,
            r.precision,
            str(r.batch_size),
            f"{r.processes} x {r.threads_per_process}",
            f"{r.images_per_s:.3f}",
            f"{r.median_step_images_per_s:.3f}",
            r.note,
        )
        for r in rows
    ]
    lines = [common.render_table(header, body)]
    lines += ["", "amp / fp32: " + (", ".join(f"{k} {v:.2f}x" for k, v in gains.items()) or "-")]
    probe = host["conv_probe"]
    lines += [
        f"host: {host['cpu']['model']}, AMX {'yes' if host['cpu']['amx_bf16'] else 'no'}, AVX-512 BF16 "
        f"{'yes' if host['cpu']['avx512_bf16'] else 'no'}; 3x3 conv fwd+bwd {probe['fp32_gflops']:.0f} GFLOP/s fp32, "
        f"{probe['bf16_gflops']:.0f} bf16 ({probe['bf16_over_fp32']:.2f}x: the ceiling of --amp on the convolutions)",
        "",
    ]
    for name, loader in loaders.items():
        parts = loader["per_image_ms"]
        lines.append(
            f"data loader ({name}, {loader['images']} images): "
            + ", ".join(f"{x['workers']} workers {x['images_per_s']:.1f} img/s" for x in loader["loaders"])
            + f"; per image: decode {parts['image_decode']:.2f} ms, target+masks "
            f"{parts['target_with_mask_decode']:.2f} ms ({parts['instances_per_image']} instances)"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="small,r50", help=f"comma separated subset of {','.join(CONFIGS)}")
    parser.add_argument("--engines", default=",".join(ENGINES), help=f"comma separated subset of {','.join(ENGINES)}")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help="fp32,amp or one of them")
    parser.add_argument("--steps", type=int, default=None, help="measured steps (default: per configuration)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: per configuration)")
    parser.add_argument("--repeats", type=int, default=1, help="run the whole sequence N times (median)")
    parser.add_argument("--loader-workers", default="0,1,2", help="worker counts for the loader-only figures")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep data and runs here")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)

    def subset(value: str, known: tuple[str, ...], flag: str) -> list[str]:
        items = [v for v in value.split(",") if v]
        if not items or set(items) - set(known):
            parser.error(f"{flag}: a comma separated subset of {','.join(known)}")
        return items

    args.configs = subset(args.configs, tuple(CONFIGS), "--configs")
    args.engines = subset(args.engines, ENGINES, "--engines")
    args.precisions = subset(args.precisions, PRECISIONS, "--precisions")
    args.loader_workers = tuple(int(w) for w in args.loader_workers.split(",") if w)
    if args.repeats < 1 or (args.warmup is not None and args.warmup < 1):
        parser.error("--repeats and --warmup must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: end run groups
    torch.set_flush_denormal(True)
    host = {"cpu_count": os.cpu_count(), "torch": torch.__version__, "cpu": common.cpu_isa()}
    host["conv_probe"] = conv_probe()
    print(f"host: {host}", file=sys.stderr, flush=True)
    rows: list[Row] = []
    loaders: dict[str, Any] = {}
    used: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        work = args.work_dir or Path(tmp)
        for name in args.configs:
            cfg = CONFIGS[name]
            cfg = replace(cfg, steps=args.steps or cfg.steps, warmup=args.warmup or cfg.warmup)
            used[name] = {**asdict(cfg), "max_size": MAX_SIZE[name], "micro_batches": MICRO_BATCHES}
            # Enough images that ddp (2 x batch) and the pipeline (batch >= M) stay inside epoch 0.
            data = bench_engines.make_dataset(
                replace(cfg, batch_size=max(cfg.batch_size, MICRO_BATCHES)), work / name / "data", processes=2
            )
            loaders[name] = bench_loader(cfg, data, args.loader_workers)
            print(f"{name}: loader {loaders[name]}", file=sys.stderr, flush=True)
            plan = [(e, p) for e in args.engines for p in args.precisions]
            results: dict[tuple[str, str], list[bench_engines.EngineResult]] = {}
            for repeat in range(args.repeats):
                for engine, precision in plan if repeat % 2 == 0 else plan[::-1]:
                    out = work / name / f"{engine}-{precision}-{repeat}"
                    result = run_engine(name, cfg, engine, precision == "amp", data, out)
                    print(f"{name} {engine} {precision}: {result}", file=sys.stderr, flush=True)
                    results.setdefault((engine, precision), []).append(result)
            for engine, precision in plan:
                runs = results[(engine, precision)]
                batch = max(cfg.batch_size, MICRO_BATCHES) if engine == "pipeline" else cfg.batch_size
                rows.append(
                    Row(
                        name,
                        engine,
                        precision,
                        batch,
                        *LAYOUT[engine],
                        round(statistics.median(r.images_per_s for r in runs), 3),
                        round(statistics.median(r.median_step_images_per_s for r in runs), 3),
                        round(statistics.median(r.seconds for r in runs), 2),
                        round(statistics.median(r.wall_s for r in runs), 1),
                        f"{len(runs)} runs" if len(runs) > 1 else "",
                    )
                )
    gains = speedups(rows)
    report = {
        "configs": used,
        "host": host,
        "rows": [asdict(r) for r in rows],
        "amp_over_fp32": gains,
        "data_loader": loaders,
    }
    common.emit(render(rows, loaders, gains, host), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
