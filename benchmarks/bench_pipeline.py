"""Single process vs the pipeline engine (M = 1, 2, 4 micro-batches) on CPU, one thread per process.

    python benchmarks/bench_pipeline.py [--steps 4] [--batch 4] [--size 128] [--json-out out.json]
    python benchmarks/bench_pipeline.py --memory [--micro 8 --batch 8 --rounds 2]
    python benchmarks/before_after.py --before OLD/src --after src --key config \\
        --value images_per_s,messages -- benchmarks/bench_pipeline.py

Starts two stage workers on localhost (stage 1 = transform + backbone, stage 2 = RPN + RoI heads)
and drives them from this process (the master). Per configuration it prints images/s, each stage's
busy time per step (process CPU time: forward, backward and optimizer step), the bubble fraction
(the share of the step a stage is idle, averaged over stages), bytes per link per step, the ideal
throughput the measured stage times allow (batch / slowest stage's busy time: a perfectly filled
pipeline) with the measured/ideal ratio, and the RPC messages of the timed steps per step, every kind
and every sender, counted from TensorPipe's log (rpc_messages.py). Where the engine has schedules,
each M runs under every one; "pipeline M=k" is the default's row, the one to compare across versions
(before_after.py runs this script once per version; the old version's engine has no schedule).

`--memory`: activation memory per stage under each schedule at M micro-batches (default 8): for each
schedule, in rounds that alternate the order, a fresh master and fresh stage workers. Each worker counts
the bytes autograd saves in its forwards, summed over the micro-batches it holds until their backwards
(`count_activations`): the peak is the stage's activation memory. Beside it, from /proc: after a warm-up
step each worker's peak RSS is reset (clear_refs), and its peak (VmHWM) above the RSS at the reset, and
PSS (smaps_rollup) at the end; and the most micro-batches each stage held at once (the engine's count).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from maskrcnn_launcher.peers import free_port

from maskrcnn_dist.config import BY_FLAG, TrainConfig, apply_overrides, small_cpu_run

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script, not a package)
import rpc_messages  # noqa: E402

NUM_CLASSES = 3
#: The engine's schedules, where it has them (this version's config table says), the default first.
SCHEDULES = [BY_FLAG["pipeline-schedule"].get(TrainConfig())] if "pipeline-schedule" in BY_FLAG else [None]
if SCHEDULES != [None]:
    SCHEDULES += [s for s in BY_FLAG["pipeline-schedule"].choices if s not in SCHEDULES]


def config(size: int, micro_batches: int, bf16: bool, schedule: str | None = None) -> TrainConfig:
    flags = small_cpu_run(
        size,
        engine="pipeline",
        threads=1,
        seed=0,
        lr=0.005,
        warmup_iters=0,
        lr_steps="1000",
        clip_grad_norm=5.0,
        rpc_timeout=300.0,
        micro_batches=micro_batches,
        bf16_transport=bf16,
        **({"pipeline_schedule": schedule} if schedule else {}),
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
        "peak_in_flight": [mean[k] for k in sorted(mean) if k.endswith("/peak_in_flight")],
        "ideal_images_per_s": ideal,
        "ratio_to_ideal": images_per_s / ideal,
    }


def timed_steps(engine, batch, steps: int, warmup: int, at_start=None) -> tuple[list[float], list[dict], tuple]:
    """Step times and metrics of the `steps` steps after `warmup`, and their window (time.time());
    `at_start()` runs once the warm-up is done."""
    times, metrics, window = [], [], [0.0, 0.0]
    for step in range(warmup + steps):
        if step == warmup:
            if at_start is not None:
                at_start()
            window[0] = time.time()
        started = time.perf_counter()
        engine.train_step(step, *batch)
        if step >= warmup:
            times.append(time.perf_counter() - started)
            metrics.append(engine.extra_metrics())
    window[1] = time.time()
    return times, metrics, tuple(window)


def start_workers(
    args: argparse.Namespace, port: int, logs: Path, env: dict[str, str], count: bool = False
) -> list[subprocess.Popen]:
    """Stage workers 1 and 2; `count`: each counts its activations into LOGS/activations<rank>.json."""
    workers = []
    for rank in (1, 2):
        command = [sys.executable, __file__, "--worker", str(rank), "--port", str(port), "--size", str(args.size)]
        command += ["--micro", str(max(args.micro))]
        command += ["--activations", str(logs / f"activations{rank}.json")] if count else []
        with open(logs / f"worker{rank}.log", "a") as log:
            workers.append(subprocess.Popen(command, env=env, stderr=log))
    return workers


def run_master(args: argparse.Namespace) -> list[dict]:
    from maskrcnn_dist.engines.pipeline import PipelineEngine, master_session
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    batch = make_batch(args.batch, args.size)
    results = []
    local = TorchEngine(replace(config(args.size, 1, False), engine="local"), NUM_CLASSES, iters_per_epoch=100)
    times, _, _ = timed_steps(local, batch, args.steps, args.warmup)
    results.append(summarize("single process", args.batch, times, []))
    del local
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    workers = start_workers(args, port, logs, {**os.environ, **rpc_messages.VERBOSE})
    os.environ.update(rpc_messages.VERBOSE)  # read when RPC starts
    try:
        plan = localhost_plan(port, 0)
        with (
            rpc_messages.stderr_to(logs / "master.log"),
            master_session(config(args.size, max(args.micro), False), plan),
        ):
            for m in args.micro:
                for bf16 in [False, True] if args.bf16 else [False]:
                    for schedule in SCHEDULES:
                        engine = PipelineEngine(config(args.size, m, bf16, schedule), plan.stages, NUM_CLASSES, 100)
                        times, metrics, window = timed_steps(engine, batch, args.steps, args.warmup)
                        engine.close()
                        name = f"pipeline M={m}" + (" bf16" if bf16 else "")
                        name += f" {schedule}" if schedule not in (None, SCHEDULES[0]) else ""
                        results.append({**summarize(name, args.batch, times, metrics), "window": window})
    finally:
        for proc in workers:
            proc.wait(timeout=120)
    for r in results:
        if "window" in r:
            counted = rpc_messages.by_kind(rpc_messages.writes(logs.glob("*.log"), *r.pop("window")))
            r["messages_per_step"] = {k: v / args.steps for k, v in counted.items()}
            r["messages"] = r["messages_per_step"]["messages"]
    return results


# -- memory ----------------------------------------------------------------------------------------------


def proc_kib(pid: int, field: str, name: str = "status") -> int:
    """A `field:` line of /proc/PID/status (or smaps_rollup), in KiB."""
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(f"/proc/{pid}/{name} has no {field}")


def count_activations(report: Path) -> None:
    """In a stage worker: the bytes autograd saves for backward in each training forward (each storage
    once, the stage's own weights and buffers left out), summed over the micro-batches held between
    their forward and their backward; the peak of that sum goes to `report` when the worker ends. The
    stage's activation memory as its schedule holds it (the process's RSS says little: each RPC thread
    frees into its own malloc arena)."""
    import atexit
    import threading

    from maskrcnn_dist.engines.pipeline.host import StageHost

    forward, backward = StageHost._forward, StageHost._backward
    held: dict[tuple[int, int], int] = {}
    peak = [0]
    lock = threading.Lock()

    def counted_forward(self, r, round_, ticket, incoming):
        module = self.replicas[r].stage
        weights = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward(self, r, round_, ticket, incoming)
        if ticket.train:
            with lock:
                held[(round_.id, ticket.micro)] = sum(saved.values())
                peak[0] = max(peak[0], sum(held.values()))
        return out

    def counted_backward(self, r, round_, ticket, grads):
        backward(self, r, round_, ticket, grads)
        with lock:
            held.pop((round_.id, ticket.micro), None)

    StageHost._forward, StageHost._backward = counted_forward, counted_backward
    atexit.register(lambda: report.write_text(json.dumps({"peak_saved_bytes": peak[0]})))


def memory_run(args: argparse.Namespace, schedule: str) -> dict:
    """Fresh stage workers, the schedule's steps at M = max(--micro); each worker's memory of the steps."""
    from maskrcnn_dist.engines.pipeline import PipelineEngine, master_session

    m = max(args.micro)
    port, logs = free_port(), Path(tempfile.mkdtemp(prefix="bench-pipeline-memory-"))
    workers = start_workers(args, port, logs, dict(os.environ), count=True)
    pids = [w.pid for w in workers]
    baseline: list[int] = []

    def reset_peaks() -> None:
        for pid in pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            baseline.append(proc_kib(pid, "VmRSS"))

    try:
        plan = localhost_plan(port, 0)
        with master_session(config(args.size, m, False), plan):
            engine = PipelineEngine(config(args.size, m, False, schedule), plan.stages, NUM_CLASSES, 100)
            times, metrics, _ = timed_steps(engine, make_batch(args.batch, args.size), args.steps, 1, reset_peaks)
            peaks = [proc_kib(pid, "VmHWM") for pid in pids]
            pss = [proc_kib(pid, "Pss", "smaps_rollup") for pid in pids]
            engine.close()
    finally:
        for proc in workers:
            proc.wait(timeout=120)
    row = summarize(f"M={m} {schedule}", args.batch, times, metrics)
    saved = [json.loads((logs / f"activations{rank}.json").read_text())["peak_saved_bytes"] for rank in (1, 2)]
    return {
        **row,
        "activations_mib": [round(b / 2**20, 1) for b in saved],
        "steps_mib": [round((p - b) / 1024, 1) for p, b in zip(peaks, baseline)],
        "peak_rss_mib": [round(p / 1024, 1) for p in peaks],
        "pss_mib": [round(p / 1024, 1) for p in pss],
    }


def run_memory(args: argparse.Namespace) -> list[dict]:
    if SCHEDULES == [None]:
        raise SystemExit("--memory compares schedules: this version's engine has none")
    runs: dict[str, list[dict]] = {s: [] for s in SCHEDULES}
    options = ["--steps", str(args.steps), "--batch", str(args.batch), "--size", str(args.size)]
    options += ["--micro", *map(str, args.micro)]
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for schedule in SCHEDULES if round_index % 2 == 0 else reversed(SCHEDULES):
                # A master of its own per run: torch's RPC does not start twice in one process.
                report = Path(tmp) / f"{schedule}-{round_index}.json"
                command = [sys.executable, __file__, "--memory-run", schedule, *options, "--json-out", str(report)]
                subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
                runs[schedule].append(json.loads(report.read_text())["results"][0])
                print(f"round {round_index + 1}: {schedule} done", file=sys.stderr, flush=True)
    results = []
    for rows in runs.values():
        merged = {**rows[-1], "rounds": len(rows), "images_per_s": statistics.median(r["images_per_s"] for r in rows)}
        for key in ("activations_mib", "steps_mib", "peak_rss_mib", "pss_mib"):
            merged[key] = [statistics.median(r[key][i] for r in rows) for i in range(2)]
        results.append(merged)
    return results


def render_table(results: list[dict]) -> str:
    header = (
        f"{'config':<28}{'img/s':>8}{'step s':>8}{'busy s (per stage)':>22}{'bubble':>8}"
        f"{'ideal img/s':>12}{'ratio':>7}{'msgs/step':>11}{'in flight':>11}  bytes/step (w1->w2 fwd, bwd)"
    )
    lines = [header]
    for r in results:
        busy = " / ".join(f"{b:.2f}" for b in r["stage_busy_s"]) or "-"
        links = r["bytes_per_link"]
        traffic = (
            f"{links.get('worker1->worker2/bytes', 0) / 1e6:.2f} MB, "
            f"{links.get('worker2->worker1/grad_bytes', 0) / 1e6:.2f} MB"
            if links
            else "-"
        )
        messages = f"{r['messages']:.1f}" if "messages" in r else "-"
        held = " / ".join(f"{h:g}" for h in r.get("peak_in_flight", [])) or "-"
        lines.append(
            f"{r['config']:<28}{r['images_per_s']:>8.2f}{r['step_s']:>8.2f}{busy:>22}"
            f"{r['bubble_fraction']:>8.2f}{r['ideal_images_per_s']:>12.2f}{r['ratio_to_ideal']:>7.2f}"
            f"{messages:>11}{held:>11}  {traffic}"
        )
        if "steps_mib" in r:
            lines.append(
                f"{'':<28}per stage: activations held at peak {r['activations_mib']} MiB; peak RSS above the "
                f"reset {r['steps_mib']} MiB; peak RSS {r['peak_rss_mib']} MiB; PSS {r['pss_mib']} MiB"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=None, help="images per step (default 4; --memory: 8)")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--micro", type=int, nargs="+", default=None, help="M values (default 1 2 4; --memory: 8)")
    parser.add_argument("--bf16", action="store_true", help="also measure bf16 feature transport")
    parser.add_argument("--memory", action="store_true", help="activation memory per stage, per schedule")
    parser.add_argument("--rounds", type=int, default=2, help="--memory: rounds of every schedule")
    parser.add_argument("--memory-run", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--worker", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--activations", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    memory = args.memory or args.memory_run is not None
    args.micro = args.micro or ([8] if memory else [1, 2, 4])
    args.batch = args.batch or (8 if memory else 4)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    if args.worker:
        from maskrcnn_dist.engines.pipeline import serve

        if args.activations is not None:
            count_activations(args.activations)
        serve(config(args.size, max(args.micro), False), localhost_plan(args.port, args.worker))
        return
    if args.memory_run is not None:
        results = [memory_run(args, args.memory_run)]
    else:
        results = run_memory(args) if args.memory else run_master(args)
    host = {"cpu": common.cpu_isa(), "load_average": os.getloadavg()}
    common.emit(render_table(results), {"results": results, "host": host}, args.json_out)


if __name__ == "__main__":
    main()
