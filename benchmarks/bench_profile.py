"""The profiler's prediction against a real run: `maskrcnn-dist profile`'s cost model vs `maskrcnn-launch local`.

    .venv/bin/python benchmarks/bench_profile.py [--size 128] [--batch 4] [--micro-batches 2]
        [--steps 4] [--iterations 3] [--splits default,three] [--json-out FILE]

For each split: the default three-machine CPU topology (master + 2 workers: transform+backbone |
rpn+roi_heads), and a three-stage split (master + 3 workers: transform+backbone | rpn | roi_heads).
It profiles the modules once in this process (1 thread, as each pipeline process runs) on the first
--iterations micro-batches of the training set it then trains on (`profile --data-path`), predicts the
split's images/s with every pod on this host (`--shared-host`: the stage processes share its cores),
then trains that topology with `maskrcnn-launch local` for warm-up + --steps steps on a synthetic set
and measures images/s over the steps after the warm-up step, from the trainer's own metrics. It prints
measured, predicted, their ratio, and each term of the model, with the load average before and after
(the cores may be shared with other work: figures move with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import yaml

from maskrcnn_dist.config import TrainConfig, apply_overrides, to_argv
from maskrcnn_dist.modeling.perf import setup_process
from maskrcnn_dist.profile.candidates import Candidate
from maskrcnn_dist.profile.command import real_batches
from maskrcnn_dist.profile.cost_model import Setting, predict
from maskrcnn_dist.profile.measure import measure

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engines  # noqa: E402  (a sibling script, not a package)
import common  # noqa: E402

SPLITS = {
    "default": (("transform", "backbone"), ("rpn", "roi_heads")),
    "three": (("transform", "backbone"), ("rpn",), ("roi_heads",)),
}


def topology_file(path: Path, stages: tuple[tuple[str, ...], ...], image_size: tuple[int, int], instances: int) -> Path:
    """The packaged three-machines topology with `stages` on one worker each."""
    names = [f"stage{i}" for i in range(1, len(stages) + 1)]
    doc = {
        "engine": "pipeline",
        "master": {"devices": 0},
        "workers": [{"devices": 0, "stage": n, "replicas": 1} for n in names],
        "stages": [{"name": n, "modules": list(m)} for n, m in zip(names, stages, strict=True)],
        "estimate": {"image_size": list(image_size), "instances_per_image": instances},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def stage_busy(metrics_file: Path, stages: int) -> list[float]:
    """Each stage's CPU seconds per step (the pipeline engine's stageN/busy_s), mean over the steps
    after the warm-up step."""
    from maskrcnn_dist.training.metrics import read_metrics

    records = [r for r in read_metrics(metrics_file) if r["kind"] == "train" and r["step"] > 1]
    return [round(sum(r[f"stage{i}/busy_s"] for r in records) / max(1, len(records)), 3) for i in range(1, stages + 1)]


def link_bytes(metrics_file: Path, key: str) -> int:
    """The engine's own byte count for one link, mean per step after the warm-up step."""
    from maskrcnn_dist.training.metrics import read_metrics

    values = [r[key] for r in read_metrics(metrics_file) if r["kind"] == "train" and r["step"] > 1]
    return round(sum(values) / max(1, len(values)))


def mean_instances(annotation_file: Path) -> float:
    data = json.loads(annotation_file.read_text())
    return len(data["annotations"]) / max(1, len(data["images"]))


class RunnableSampler:
    """Mean of /proc/stat's procs_running (runnable threads host-wide, ours included) while running:
    how many threads actually competed for the cores, sampled every `period_s`."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s, self.samples = period_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            with open("/proc/stat") as f:
                line = next((ln for ln in f if ln.startswith("procs_running")), "procs_running 0")
            self.samples.append(int(line.split()[1]) - 1)  # less the sampling thread itself

    def __enter__(self) -> RunnableSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else 0.0


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="measured steps (after one warm-up step)")
    parser.add_argument("--iterations", type=int, default=3, help="profile passes per module")
    parser.add_argument("--splits", default="default,three")
    parser.add_argument("--link-gbps", type=float, default=25.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)

    bench = bench_engines.BenchConfig(
        model="maskrcnn_resnet18_fpn",
        image_size=args.size,
        batch_size=args.batch,
        steps=args.steps,
        warmup=1,
        workers=0,
        seed=0,
        timeout_s=args.timeout,
    )
    root = Path(tempfile.mkdtemp(prefix="bench_profile_"))
    data = bench_engines.make_dataset(bench, root / "data", processes=2)  # no epoch end in the window
    instances = mean_instances(data / "train" / "annotations.json")
    # make_dataset's images have random sides up to (0.75 size, size); the transform resizes them to a
    # short side of `size` within `size`, and the batch pads to size x size (checked below: the bytes
    # over the first cut, profile vs engine). Profiling 0.75 size x size under-counted them by 1.33x.
    image_size = (args.size, args.size)
    flags = {
        **bench_engines.train_flags(bench, data, root / "unused"),
        "threads": 1,
        "micro-batches": args.micro_batches,
        "rpc-timeout": 300,
    }

    cfg = apply_overrides(TrainConfig(), flags, "bench_profile")
    setup_process(cfg)
    load_before = load_average()
    started = time.monotonic()
    # The profile runs on the training set's own first micro-batches (`profile --data-path`): the RoI
    # heads' cost depends on the instances, which synthetic rectangles under-stated by about 2x.
    batches, num_classes, what = real_batches(cfg, args.iterations)
    meas = measure(cfg, image_size, round(instances), args.iterations, torch.device("cpu"), batches, num_classes, what)
    profile_s = time.monotonic() - started
    setting = Setting(
        batch=args.batch,
        micro_batches=args.micro_batches,
        link_gbps=args.link_gbps,
        device_memory_bytes=1 << 40,
        shared_cores=os.cpu_count() or 1,
    )
    print(
        f"profile: {meas.device}, {profile_s:.1f} s, load average {load_before}; data: {instances:.2f} instances/image"
    )
    for m in meas.modules:
        print(f"  {m.name:<10} fwd {m.forward_s:.3f} s  bwd {m.backward_s:.3f} s  opt {m.optimizer_s:.3f} s")

    results = []
    for name in args.splits.split(","):
        stages = SPLITS[name]
        pred = predict(meas, Candidate("pipeline", stages, (1,) * len(stages)), setting)
        topo = topology_file(root / f"{name}.yaml", stages, image_size, round(instances))
        out = root / f"run-{name}"
        run_flags = {**flags, "output-dir": out}
        command = [
            sys.executable,
            "-m",
            "maskrcnn_launcher",
            "local",
            "--topology",
            str(topo),
            "--",
            *to_argv(run_flags),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        load_start = load_average()
        wall = time.monotonic()
        with RunnableSampler() as runnable:
            common.run_group(command, env, out / "local.log", args.timeout)
        measured = bench_engines.measure(out / "metrics.jsonl", replace(bench), name, 1, 1, time.monotonic() - wall)
        # The same model with the other work this host ran meanwhile: runnable threads beyond our stages.
        background = max(0.0, runnable.mean - len(stages))
        loaded = predict(
            meas, Candidate("pipeline", stages, (1,) * len(stages)), replace(setting, background_load=background)
        )
        row = {
            "split": " | ".join("+".join(s) for s in stages),
            "processes": 1 + len(stages),
            "measured_images_per_s": measured.images_per_s,
            "predicted_images_per_s": round(pred.images_per_s, 3),
            "ratio_measured_over_predicted": round(measured.images_per_s / pred.images_per_s, 3),
            "mean_runnable_threads": round(runnable.mean, 2),
            "predicted_at_measured_load_images_per_s": round(loaded.images_per_s, 3),
            "ratio_at_measured_load": round(measured.images_per_s / loaded.images_per_s, 3),
            "predicted_step_s": round(pred.step_s, 3),
            "measured_step_s": round(measured.seconds / measured.measured_steps, 3),
            "predicted_compute_s": round(pred.compute_s, 3),
            "predicted_link_s": round(pred.link_s, 4),
            "predicted_stage_s": [round(s, 3) for s in pred.stage_s],
            "measured_stage_busy_s": stage_busy(out / "metrics.jsonl", len(stages)),
            # Bytes per step over the first cut between stages: the engine's own count vs the profile's.
            "measured_cut1_bytes": link_bytes(out / "metrics.jsonl", "link/worker1->worker2/bytes"),
            "profiled_cut1_bytes": args.micro_batches * meas.cut_after(stages[0][-1]).forward_bytes,
            "load_average_start": load_start,
            "load_average_end": load_average(),
        }
        results.append(row)
        print(
            f"{row['split']}: measured {row['measured_images_per_s']:.3f} images/s, predicted "
            f"{row['predicted_images_per_s']:.3f}, ratio {row['ratio_measured_over_predicted']:.2f} "
            f"(step measured {row['measured_step_s']:.3f} s vs predicted {row['predicted_step_s']:.3f} s = compute "
            f"{row['predicted_compute_s']:.3f} + link {row['predicted_link_s']:.4f}; stages/micro-batch "
            f"{row['predicted_stage_s']}, measured stage CPU s/step {row['measured_stage_busy_s']}; load "
            f"{row['load_average_start']} -> {row['load_average_end']}, mean runnable threads "
            f"{row['mean_runnable_threads']}: predicted at that load "
            f"{row['predicted_at_measured_load_images_per_s']:.3f} images/s, ratio {row['ratio_at_measured_load']:.2f})"
        )
    report = {"cpu": meas.device, "modules": [asdict(m) for m in meas.modules], "runs": results}
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
