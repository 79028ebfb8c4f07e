"""Single process vs the pipeline engine (M = 1, 2, 4 micro-batches) on CPU, one thread per process.

    python benchmarks/bench_pipeline.py [--steps 4] [--batch 4] [--size 128] [--json-out out.json]

Starts two stage workers on localhost (stage 1 = transform + backbone, stage 2 = RPN + RoI heads)
and drives them from this process (the master). Per configuration it prints images/s, each stage's
busy time per step (process CPU time: forward, backward and optimizer step), the bubble fraction
(the share of the step a stage is idle, averaged over stages), bytes per link per step, and the
ideal throughput the measured stage times allow (batch / slowest stage's busy time: a perfectly
filled pipeline) with the measured/ideal ratio. Numbers depend on what else the cores are doing.

Messages: every pipeline configuration runs twice, interleaved, on the same workers: `hosts`
(today's engine: stage hosts in each worker's registry, called by name) and `rref hosts` (the old
shape, pipeline_legacy.py: each host an RRef's value, called through its proxies). The RPC messages
of their timed steps, every kind and every sender, are counted from TensorPipe's log
(rpc_messages.py) and printed per step.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from maskrcnn_launcher.peers import free_port

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script, not a package)
import rpc_messages  # noqa: E402

NUM_CLASSES = 3


def config(size: int, micro_batches: int, bf16: bool) -> TrainConfig:
    flags = small_cpu_run(
        size,
        engine="pipeline",
        threads=1,
        seed=0,
        lr=0.005,
        warmup_iters=0,
        lr_steps="1000",
        clip_grad_norm=5.0,
        rpc_timeout=120.0,
        micro_batches=micro_batches,
        bf16_transport=bf16,
    )
    return apply_overrides(TrainConfig(), flags, "bench_pipeline")


def make_batch(num_images: int, size: int) -> tuple[list[torch.Tensor], list[dict]]:
    """Random images, each with two filled rectangles (boxes, labels, masks)."""
    gen = torch.Generator().manual_seed(0)
    images, targets = [], []
    for _ in range(num_images):
        image = torch.rand(3, size, size, generator=gen) * 0.2
        boxes, masks = [], []
        for j in range(2):
            x0, y0 = (int(v) for v in torch.randint(0, size // 2, (2,), generator=gen))
            x1, y1 = x0 + size // 5 + 4 * j, y0 + size // 4
            mask = torch.zeros(size, size, dtype=torch.uint8)
            mask[y0:y1, x0:x1] = 1
            image[:, y0:y1, x0:x1] += 0.7
            boxes.append([x0, y0, x1, y1])
            masks.append(mask)
        images.append(image.clamp(0, 1))
        targets.append(
            {
                "boxes": torch.tensor(boxes, dtype=torch.float32),
                "labels": torch.tensor([1, 2]),
                "masks": torch.stack(masks),
            }
        )
    return images, targets


def localhost_plan(port: int, rank: int):
    """The launcher's own plan of the default three-machine CPU topology, with every pod on 127.0.0.1."""
    from maskrcnn_launcher.plan import derive_job
    from maskrcnn_launcher.topology import load_topology

    return derive_job(load_topology("three-machines"), "127.0.0.1", port).pods[rank]


def summarize(name: str, batch: int, step_s: list[float], metrics: list[dict[str, float]]) -> dict:
    mean = {k: sum(m[k] for m in metrics) / len(metrics) for k in metrics[0]} if metrics else {}
    busy = [mean[k] for k in sorted(mean) if k.startswith("stage") and k.endswith("/busy_s")]
    images_per_s = batch * len(step_s) / sum(step_s)
    ideal = batch / max(busy) if busy else images_per_s
    return {
        "config": name,
        "images_per_s": images_per_s,
        "step_s": sum(step_s) / len(step_s),
        "stage_busy_s": busy,
        "bubble_fraction": mean.get("pipeline/bubble_fraction", 0.0),
        "bytes_per_link": {k.removeprefix("link/"): v for k, v in mean.items() if k.startswith("link/")},
        "ideal_images_per_s": ideal,
        "ratio_to_ideal": images_per_s / ideal,
    }


def timed_steps(engine, batch, steps: int, warmup: int) -> tuple[list[float], list[dict[str, float]], tuple]:
    """Step times and metrics of the `steps` steps after `warmup`, and their window (time.time())."""
    times, metrics, window = [], [], [0.0, 0.0]
    for step in range(warmup + steps):
        if step == warmup:
            window[0] = time.time()
        started = time.perf_counter()
        engine.train_step(step, *batch)
        if step >= warmup:
            times.append(time.perf_counter() - started)
            metrics.append(engine.extra_metrics())
    window[1] = time.time()
    return times, metrics, tuple(window)


def run_master(args: argparse.Namespace) -> list[dict]:
    from pipeline_legacy import LegacyEngine

    from maskrcnn_dist.engines.pipeline import PipelineEngine, master_session
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    batch = make_batch(args.batch, args.size)
    results = []
    local = TorchEngine(replace(config(args.size, 1, False), engine="local"), NUM_CLASSES, iters_per_epoch=100)
    times, _, _ = timed_steps(local, batch, args.steps, args.warmup)
    results.append(summarize("single process", args.batch, times, []))
    del local
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    env = {**os.environ, **rpc_messages.VERBOSE}
    workers = []
    for rank in (1, 2):
        command = [sys.executable, __file__, "--worker", str(rank), "--port", str(port), "--size", str(args.size)]
        with open(logs / f"worker{rank}.log", "w") as log:
            workers.append(subprocess.Popen(command, env=env, stderr=log))
    os.environ.update(rpc_messages.VERBOSE)  # read when RPC starts
    try:
        plan = localhost_plan(port, 0)
        with (
            rpc_messages.stderr_to(logs / "master.log"),
            master_session(config(args.size, max(args.micro), False), plan),
        ):
            for m in args.micro:
                for bf16 in [False, True] if args.bf16 else [False]:
                    for path, engine_type in (("hosts", PipelineEngine), ("rref hosts", LegacyEngine)):
                        cfg = config(args.size, m, bf16)
                        engine = engine_type(cfg, plan.stages, NUM_CLASSES, iters_per_epoch=100)
                        times, metrics, window = timed_steps(engine, batch, args.steps, args.warmup)
                        engine.close()
                        name = f"pipeline M={m}" + (" bf16" if bf16 else "") + f", {path}"
                        results.append({**summarize(name, args.batch, times, metrics), "window": window})
    finally:
        for proc in workers:
            proc.wait(timeout=60)
    for r in results:
        if "window" in r:
            counted = rpc_messages.by_kind(rpc_messages.writes(logs.glob("*.log"), *r.pop("window")))
            r["messages_per_step"] = {k: v / args.steps for k, v in counted.items()}
    return results


def render_table(results: list[dict]) -> str:
    header = (
        f"{'config':<28}{'img/s':>8}{'step s':>8}{'busy s (per stage)':>22}{'bubble':>8}"
        f"{'ideal img/s':>12}{'ratio':>7}{'msgs/step':>11}  bytes/step (w1->w2 fwd, bwd)"
    )
    lines = [header]
    for r in results:
        busy = " / ".join(f"{b:.2f}" for b in r["stage_busy_s"]) or "-"
        links = r["bytes_per_link"]
        traffic = (
            (
                f"{links.get('worker1->worker2/bytes', 0) / 1e6:.2f} MB, "
                f"{links.get('worker2->worker1/grad_bytes', 0) / 1e6:.2f} MB"
            )
            if links
            else "-"
        )
        messages = f"{r['messages_per_step']['messages']:.1f}" if "messages_per_step" in r else "-"
        lines.append(
            f"{r['config']:<28}{r['images_per_s']:>8.2f}{r['step_s']:>8.2f}{busy:>22}"
            f"{r['bubble_fraction']:>8.2f}{r['ideal_images_per_s']:>12.2f}{r['ratio_to_ideal']:>7.2f}"
            f"{messages:>11}  {traffic}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--bf16", action="store_true", help="also measure bf16 feature transport")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        from maskrcnn_dist.engines.pipeline import serve

        serve(config(args.size, max(args.micro), False), localhost_plan(args.port, args.worker))
        return
    results = run_master(args)
    common.emit(render_table(results), {"runs": results}, args.json_out)


if __name__ == "__main__":
    main()
