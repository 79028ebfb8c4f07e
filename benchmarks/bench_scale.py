"""COCO-scale data: start to first step, a preemption's restart, and memory per process, for two checkouts
of the kit measured in one run (today's code beside the new one), each beside one plain json.load of the
annotation file measured just before it (the floor its goals are ratios to).

    PYTHONPATH=src:launcher .venv/bin/python benchmarks/bench_scale.py --images 10000 \\
        --work /scratch/bench --baseline /path/to/other-checkout/src [--engines local,ddp] [--keep]

benchmarks/before_after.py --before COMMIT --scale 20000 runs it against an older commit (the check to run
before a change to data/, the plan or the loader: docs/performance-data.md).

Writes a COCO 2017 layout (annotations/instances_train2017.json + train2017/) of N images (default COCO
train's 118,287) with COCO's annotation statistics: ~7.3 annotations per image (1% images without any),
polygons of ~25 points (1-3 per annotation), ~1% crowd regions as uncompressed RLE; images are one tiny
JPEG hard-linked N times (reading pixels costs nothing: this measures the data's bookkeeping, not
decoding). Then, for each code version (`--baseline`: another checkout's src folder, its launcher beside
it; `new`: this checkout) and engine (local: 1 process; ddp: 2 ranks through maskrcnn_dist.torchrun), with
2 DataLoader workers per process:

  floor     one json.load of the annotation file in a fresh process: its seconds and the PSS it adds
            (the parsed objects), just before each version's train phase.
  train     the small CPU model (64 px) at the trainer's --print-freq (its default, 20: the records a
            user's run writes): seconds from start to the first train record in metrics.jsonl
            (`--repeat N`: the median of N such first starts, each on a fresh output dir); SIGTERM
            once a record is there, then `--resume auto`: seconds from its start to its first train
            record. Peak PSS of each process while it runs; the data's share: the resumed run's
            processes' peak PSS together (the ranks and their loader workers: no parse, no check pool
            once cached) less that of the same runs on a 64-image set (the same processes, torch, the
            model and its checkpoint: all but the data).
  loading   the run's data path alone, in the train run's output dir (so the new code finds the cache
            that run wrote, as a restart does): load_datasets, then training's loader (build_step_loader:
            the plan's global batches, 8 images per rank, 2 workers) over `--fraction` (default half) of
            each rank's epoch, every sample built
            in a worker as in training but only the batch's size sent back (no tensors through
            shared memory: that is IPC, not the dataset). No data check here (its fork pool in this
            bare process hangs the loader's tensor passing); each worker decides a frame at first
            read instead. Peak PSS and USS of every process (/proc/PID/smaps_rollup), and each
            DataLoader worker's USS growth from its first sample to its last.

The same train phase on a 64-image set, per version and engine, is the floor of the data's share (and
its first step the process start and the model's build, data aside).
Prints JSON (`--json-out`: also to a file, rows as before_after.py reads them), a table, and each row
against the goals (issue 57): first step <= 1.2 x json.load + 5 s, resumed step <= 0.2 x json.load + 15 s,
the data's share of PSS <= 0.35 x json.load's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(HERE / "src"), str(HERE / "launcher")]  # this tree's trainer and launcher

from maskrcnn_dist.torchrun import parent_pid  # noqa: E402

COCO_TRAIN_IMAGES = 118_287
SIZE = (64, 48)  # annotated = stored size of every (tiny) image
MiB = 1 << 20
_LINKS_PER_FILE = 50_000
# The goals, against one json.load of the annotation file in the same run (issue 57): (factor, seconds).
FIRST_STEP_GOAL = (1.2, 5.0)
RESUMED_STEP_GOAL = (0.2, 15.0)
DATA_SHARE_GOAL = 0.35  # of the PSS json.load's parsed objects take


# --- the set -------------------------------------------------------------------------------------------


def write_set(root: Path, count: int, seed: int = 0) -> Path:
    """A COCO 2017 layout of `count` images with COCO-like annotations (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    images_dir = root / "train2017"
    images_dir.mkdir(parents=True)
    pixels = Image.fromarray(rng.integers(0, 255, (SIZE[1], SIZE[0], 3), dtype=np.uint8))
    pixels.save(images_dir / ".template.jpg", quality=80)
    template = images_dir / ".template.jpg"
    w, h = SIZE
    images, annotations = [], []
    ann_id = 0
    per_image = rng.poisson(7.3, count)
    per_image[rng.uniform(size=count) < 0.01] = 0
    for image_id in range(1, count + 1):
        name = f"{image_id:012d}.jpg"
        if image_id % _LINKS_PER_FILE == 1:  # ext4 allows 65,000 links to a file: the next group gets its own
            template = images_dir / name
            shutil.copyfile(images_dir / ".template.jpg", template)
        else:
            os.link(template, images_dir / name)
        images.append({"id": image_id, "file_name": name, "width": w, "height": h, "license": 1})
        for _ in range(per_image[image_id - 1]):
            ann_id += 1
            cx, cy = rng.uniform(4, w - 4), rng.uniform(4, h - 4)
            r = rng.uniform(1.5, 12)
            if rng.uniform() < 0.01:
                segm: Any = {"size": [h, w], "counts": _counts(rng, w * h)}
                crowd = 1
            else:
                segm = [_polygon(rng, cx, cy, r, w, h) for _ in range(1 + int(rng.uniform() < 0.15) * 2)]
                crowd = 0
            x0, y0 = max(cx - r, 0.0), max(cy - r, 0.0)
            box = [round(x0, 2), round(y0, 2), round(min(cx + r, w) - x0, 2), round(min(cy + r, h) - y0, 2)]
            annotations.append(
                {
                    "id": ann_id,
                    "image_id": image_id,
                    "category_id": int(rng.integers(1, 81)),
                    "bbox": box,
                    "segmentation": segm,
                    "area": round(float(np.pi * r * r), 4),
                    "iscrowd": crowd,
                }
            )
    (images_dir / ".template.jpg").unlink()
    categories = [{"id": c, "name": f"class{c}", "supercategory": "thing"} for c in range(1, 81)]
    (root / "annotations").mkdir()
    path = root / "annotations" / "instances_train2017.json"
    with open(path, "w") as f:
        json.dump(
            {"info": {}, "licenses": [], "images": images, "annotations": annotations, "categories": categories}, f
        )
    return path


def _polygon(rng: np.random.Generator, cx: float, cy: float, r: float, w: int, h: int) -> list[float]:
    points = max(3, int(rng.normal(25, 8)))
    angles = np.sort(rng.uniform(0, 2 * np.pi, points))
    radius = r * rng.uniform(0.5, 1.0, points)
    xs = np.clip(cx + radius * np.cos(angles), 0, w)
    ys = np.clip(cy + radius * np.sin(angles), 0, h)
    return [round(float(v), 2) for v in np.stack([xs, ys], 1).ravel()]


def _counts(rng: np.random.Generator, total: int) -> list[int]:
    runs, left = [], total
    while left > 0:
        run = min(int(rng.integers(1, 60)), left)
        runs.append(run)
        left -= run
    return runs if len(runs) % 2 else [*runs, 0]


# --- memory ----------------------------------------------------------------------------------------


def rollup(pid: int) -> dict[str, int] | None:
    """Pss, Rss and USS (private clean + dirty) of a process, in bytes; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[-1] == "kB":
            values[name] = int(parts[0]) * 1024
    return {
        "pss": values.get("Pss", 0),
        "rss": values.get("Rss", 0),
        "uss": values.get("Private_Clean", 0) + values.get("Private_Dirty", 0),
    }


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


@dataclass
class Sampler:
    """Polls the memory of a process tree every `every` s: per process its role, peak PSS/USS, and the
    USS of its first and last samples (a worker's growth)."""

    root: int
    every: float = 0.5
    seen: dict[int, dict[str, Any]] = field(default_factory=dict)
    total_pss_peak: int = 0

    def start(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for pid, depth in self._tree():
                role = self.seen[pid]["role"] if pid in self.seen else _role(pid, depth)
                mem = rollup(pid) if role != "other" else None
                if mem is None:
                    continue
                total += mem["pss"]
                rec = self.seen.setdefault(
                    pid, {"role": role, "first_uss": mem["uss"], "samples": 0, "parent": parent_pid(pid)}
                )
                rec["samples"] += 1
                rec["last_uss"] = mem["uss"]
                rec["peak_pss"] = max(rec.get("peak_pss", 0), mem["pss"])
                rec["peak_uss"] = max(rec.get("peak_uss", 0), mem["uss"])
            self.total_pss_peak = max(self.total_pss_peak, total)
            self._stop.wait(self.every)

    def _tree(self) -> list[tuple[int, int]]:
        out, todo = [], [(self.root, 0)]
        while todo:
            pid, depth = todo.pop()
            out.append((pid, depth))
            todo += [(c, depth + 1) for c in children(pid)]
        return out

    def summary(self, loader_workers: set[int] | None = None) -> dict[str, Any]:
        """Peaks per role; `loader_workers`: the DataLoader workers' pids (not the data check's pool)."""
        ranks = [r for r in self.seen.values() if r["role"] == "rank"]
        workers = [
            r
            for pid, r in self.seen.items()
            if r["role"] == "worker" and r["samples"] >= 3 and (loader_workers is None or pid in loader_workers)
        ]
        growth = [r["last_uss"] - r["first_uss"] for r in workers]
        # A rank with its DataLoader workers: the rank's peak PSS plus each worker's (an upper bound:
        # the peaks need not coincide).
        groups = [
            rank["peak_pss"] + sum(w["peak_pss"] for w in workers if w["parent"] == pid)
            for pid, rank in self.seen.items()
            if rank["role"] == "rank"
        ]
        return {
            "rank_with_workers_pss_mib": max(groups, default=0) / MiB,
            "ranks": len(ranks),
            "workers": len(workers),
            "rank_peak_pss_mib": max((r["peak_pss"] for r in ranks), default=0) / MiB,
            "rank_peak_uss_mib": max((r["peak_uss"] for r in ranks), default=0) / MiB,
            "worker_peak_pss_mib": max((r["peak_pss"] for r in workers), default=0) / MiB,
            "worker_peak_uss_mib": max((r["peak_uss"] for r in workers), default=0) / MiB,
            "worker_uss_growth_mib": max(growth, default=0) / MiB,
            "total_pss_peak_mib": self.total_pss_peak / MiB,
        }


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _is_rank(cmd: bytes) -> bool:
    """A trainer process (or a loading phase's child), not torchrun, which names the trainer's module."""
    return (b"maskrcnn_dist.cli" in cmd or b"--load-phase" in cmd) and b"maskrcnn_dist.torchrun" not in cmd


def _role(pid: int, depth: int) -> str:
    """rank, worker (a fork of a rank: DataLoader workers, and the data check's pool) or other."""
    if not _is_rank(_cmdline(pid)):
        return "other"
    parent = parent_pid(pid)
    return "worker" if parent and _is_rank(_cmdline(parent)) else "rank"


# --- the floor: one json.load ------------------------------------------------------------------------

_JSON_LOAD = """
import json, sys, time
def pss():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
before = pss()
started = time.monotonic()
with open(sys.argv[1]) as f:
    parsed = json.load(f)
seconds = time.monotonic() - started
print(json.dumps({"json_load_s": seconds, "json_load_mib": (pss() - before) / 2**20}))
"""


def json_load_floor(annotations: Path) -> dict[str, float]:
    """Seconds of one plain json.load of `annotations` in a fresh process, and the PSS its parsed objects
    add (MiB): what any reader of the file pays, the floor the goals are ratios to."""
    done = subprocess.run([sys.executable, "-c", _JSON_LOAD, str(annotations)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"json.load of {annotations} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def against_goals(row: dict[str, Any], floor_pss_mib: float | None) -> dict[str, Any]:
    """A row's figures as ratios to its json.load, and whether each goal is met. `floor_pss_mib`: the
    resumed 64-image run's processes' peak PSS together (None: not measured)."""
    load_s, load_mib = row["json_load_s"], row["json_load_mib"]
    out: dict[str, Any] = {
        "first_ratio": row["first_step_s"] / load_s,
        "resumed_ratio": row["resumed_step_s"] / load_s,
        "first_goal_s": FIRST_STEP_GOAL[0] * load_s + FIRST_STEP_GOAL[1],
        "resumed_goal_s": RESUMED_STEP_GOAL[0] * load_s + RESUMED_STEP_GOAL[1],
    }
    out["first_met"] = row["first_step_s"] <= out["first_goal_s"]
    out["resumed_met"] = row["resumed_step_s"] <= out["resumed_goal_s"]
    if floor_pss_mib is not None:
        share = row["resumed_memory"]["total_pss_peak_mib"] - floor_pss_mib
        out |= {
            "data_share_mib": share,
            "share_ratio": share / load_mib,
            "share_met": share <= DATA_SHARE_GOAL * load_mib,
        }
    return out


# --- runs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    name: str
    src: Path

    def env(self) -> dict[str, str]:
        path = f"{self.src}:{self.src.parent / 'launcher'}"
        return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def train_argv(engine: str, data: Path, out: Path, port: int, print_freq: int = 20) -> list[str]:
    from maskrcnn_dist.config import small_stop_run, to_argv

    batch = 2 if engine == "local" else 1
    flags = {"batch_size": batch, "workers": 2, "engine": engine, "rpc_timeout": 600, "print_freq": print_freq}
    args = to_argv(small_stop_run(data, out, **flags))
    python = sys.executable
    if engine == "local":
        return [python, "-m", "maskrcnn_dist.cli", "train", *args]
    rendezvous = ["--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    return [python, "-m", "maskrcnn_dist.torchrun", *rendezvous, "-m", "maskrcnn_dist.cli", "train", *args]


def first_step_after(metrics: Path, seen: int) -> int:
    """The largest train step recorded, or `seen` when none past it yet."""
    steps = [seen]
    if metrics.is_file():
        for line in metrics.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "train":
                steps.append(int(record["step"]))
    return max(steps)


def run_until(argv: list[str], version: Version, log: Path, metrics: Path, past: int, timeout: float) -> dict[str, Any]:
    """Start a run; return the seconds to its first train step past `past`, its peak memory and the step;
    it is left running (stopped by the caller)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=version.env(), start_new_session=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    started = time.monotonic()
    while (step := first_step_after(metrics, past)) <= past:
        if proc.poll() is not None or time.monotonic() - started > timeout:
            sampler.stop()
            _kill(proc)
            raise RuntimeError(f"{version.name}: no step past {past} ({log}: {log.read_text()[-2000:]})")
        time.sleep(0.05)
    seconds = time.monotonic() - started
    sampler.stop()
    return {"proc": proc, "seconds": seconds, "step": step, "memory": sampler.summary()}


def _tree(pid: int) -> list[int]:
    """Every process under `pid`, depth first."""
    return [below for kid in children(pid) for below in (kid, *_tree(kid))]


def _kill(proc: subprocess.Popen, known: list[int] = ()) -> None:  # type: ignore[assignment]
    """SIGKILL a run and everything under it (and `known`, found under it earlier): torchrun starts
    its ranks in sessions of their own, so the run's process group does not reach them (nor their
    DataLoader workers)."""
    for pid in dict.fromkeys([proc.pid, *_tree(proc.pid), *known, *(c for k in known for c in _tree(k))]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _stop(proc: subprocess.Popen, timeout: float = 300) -> None:
    """SIGTERM to the run's group (what a pod's dumb-init does) and wait; whatever is left is killed."""
    under = _tree(proc.pid)  # before the signal: once torchrun exits, its ranks' parent is init
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    _kill(proc, under)


def train_phase(
    version: Version, engine: str, data: Path, work: Path, timeout: float, repeat: int = 1, print_freq: int = 20
) -> dict[str, Any]:
    """The first start (`repeat` times, each on a fresh output dir: the median counts), then SIGTERM
    once its first record is there and `--resume auto` on the last one's output dir."""
    firsts = [
        first_start(version, engine, data, work / f"{version.name}-{engine}-first-{k}", timeout, print_freq)["seconds"]
        for k in range(repeat - 1)
    ]
    out = work / f"{version.name}-{engine}-train"
    argv = train_argv(engine, data, out, _port(), print_freq)
    first = run_until(argv, version, work / f"{out.name}.log", out / "metrics.jsonl", 0, timeout)
    firsts.append(first["seconds"])
    proc = first.pop("proc")
    _stop(proc)
    trained = first_step_after(out / "metrics.jsonl", 0)
    resumed = run_until(
        [*argv, "--resume", "auto"], version, work / f"{out.name}-resumed.log", out / "metrics.jsonl", trained, timeout
    )
    _kill(resumed.pop("proc"))
    return {
        "first_step_s": statistics.median(firsts),
        "first_steps_s": firsts,
        "resumed_step_s": resumed["seconds"],
        "train_memory": first["memory"],
        "resumed_memory": resumed["memory"],
    }


def first_start(
    version: Version, engine: str, data: Path, out: Path, timeout: float, print_freq: int = 20
) -> dict[str, Any]:
    """Seconds from a start on the fresh output dir `out` to its first step, and its peak memory (the folder
    is removed after)."""
    shutil.rmtree(out, ignore_errors=True)
    argv = train_argv(engine, data, out, _port(), print_freq)
    run = run_until(argv, version, out.with_suffix(".log"), out / "metrics.jsonl", 0, timeout)
    _kill(run.pop("proc"))
    shutil.rmtree(out, ignore_errors=True)
    return run


def load_phase(
    version: Version, engine: str, data: Path, work: Path, fraction: float, timeout: float
) -> dict[str, Any]:
    """Every rank's data path alone, iterating `fraction` of its epoch's batches with 2 workers."""
    out = work / f"{version.name}-{engine}-train"  # its output dir: a cache the train phase wrote is found
    world = 1 if engine == "local" else 2
    procs, logs = [], []
    sampler = Sampler(os.getpid())
    sampler.start()
    started = time.monotonic()
    for rank in range(world):
        log = work / f"{version.name}-{engine}-load-{rank}.log"
        logs.append(log)
        argv = [sys.executable, __file__, "--load-phase", str(data), str(out), str(rank), str(world), str(fraction)]
        with open(log, "w") as f:
            procs.append(subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=version.env()))
    codes = [p.wait(timeout=timeout) for p in procs]
    seconds = time.monotonic() - started
    sampler.stop()
    if any(codes):
        raise RuntimeError(f"{version.name} {engine} loading failed: {[log.read_text()[-2000:] for log in logs]}")
    reports = [json.loads(log.read_text().strip().splitlines()[-1]) for log in logs]
    workers = {pid for report in reports for pid in report["workers"]}
    return {"seconds": seconds, "ranks": reports, "memory": sampler.summary(workers)}


def _load_child(data: Path, out: Path, rank: int, world: int, fraction: float) -> None:
    """In a child, with the version's PYTHONPATH: what training does with the data, without the model."""
    import logging

    from maskrcnn_dist.config import TrainConfig
    from maskrcnn_dist.data import BatchLayout, build_step_loader, load_datasets

    logging.basicConfig(level=logging.WARNING)
    cfg = TrainConfig()
    cfg.data.data_path = data
    cfg.output_dir = out
    cfg.data.workers = 2
    cfg.data.aspect_ratio_group_factor = -1
    started = time.monotonic()
    datasets = load_datasets(cfg)
    loaded = time.monotonic() - started
    # No data check here: its fork pool, run in this bare process (no trainer set-up), leaves the loader's
    # workers unable to pass tensors back (multiprocessing's resource sharer hangs). Each worker decides an
    # image's frame at its first read instead: one small dict entry per image it loads.
    checked = time.monotonic() - started
    # Each worker builds every sample as training would; what it hands back is only the batch's size: the
    # tensors' trip through shared memory (a file descriptor each) would make half an epoch at COCO's
    # scale take an hour on 2 cores, and would measure IPC, not the dataset.
    train_set = datasets[0]
    if not hasattr(train_set, "set_epoch"):  # the flip is a transform (data/transforms/flip.py), not the dataset's
        from maskrcnn_dist.data.transforms.flip import Flipped

        train_set = Flipped(train_set, cfg.seed, uint8=True)  # as data.train_loaders wraps it for hflip
    steps = build_step_loader(
        train_set, BatchLayout(world, 8), epoch=0, seed=0, share=(rank, world), num_workers=2, collate_fn=_batch_size
    )
    batches = int(len(steps) * fraction)
    iterator = iter(steps.loader)  # its micro-batches as the workers hand them over: here only their sizes
    workers = [w.pid for w in iterator._workers]  # (private, but the benchmark must tell them from the check's pool)
    for done, _ in enumerate(iterator, start=1):
        if done >= batches:
            break
    report = {
        "rank": rank,
        "load_s": loaded,
        "check_s": checked - loaded,
        "batches": batches,
        "iterate_s": time.monotonic() - started - checked,
        "workers": workers,
    }
    print(json.dumps(report))


def _batch_size(batch: list) -> int:
    return len(batch)


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def floor_phase(version: Version, engine: str, work: Path, timeout: float, print_freq: int = 20) -> dict[str, Any]:
    """The train phase on a 64-image set: the process start and the model's build, and the memory of the
    processes, torch, the model and its checkpoint with (almost) no data."""
    data = work / "tiny-set"
    if not data.exists():
        write_set(data, 64, seed=1)
    return train_phase(Version(f"{version.name}-floor", version.src), engine, data, work, timeout, 1, print_freq)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--load-phase":
        _, _, data, out, rank, world, fraction = sys.argv
        _load_child(Path(data), Path(out), int(rank), int(world), float(fraction))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=COCO_TRAIN_IMAGES)
    parser.add_argument("--work", type=Path, help="a folder for the set and the runs (default: a temporary one)")
    parser.add_argument("--baseline", type=Path, help="the src folder of the checkout to compare with")
    parser.add_argument(
        "--code", type=Path, default=HERE / "src", help="the src folder measured as new (default: this checkout's)"
    )
    parser.add_argument("--engines", default="local,ddp")
    parser.add_argument("--phases", default="train,load", help="train (first and resumed step), load (memory)")
    parser.add_argument("--print-freq", type=int, default=20, help="the trainer's (default: its own default)")
    parser.add_argument("--fraction", type=float, default=0.5, help="of each rank's epoch the loading phase reads")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--keep", action="store_true", help="keep the runs and their logs in the work folder")
    parser.add_argument("--repeat", type=int, default=1, help="first starts per version and engine (the median counts)")
    parser.add_argument("--json-out", type=Path, help="also write the report here")
    opts = parser.parse_args()
    phases = set(opts.phases.split(","))
    work = opts.work or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / f"coco-{opts.images}"
    started = time.monotonic()
    if not (data / "annotations" / "instances_train2017.json").is_file():
        # In a child: the generated set's millions of objects would stay in this process's heap.
        import multiprocessing

        writer = multiprocessing.get_context("fork").Process(target=write_set, args=(data, opts.images))
        writer.start()
        writer.join()
        if writer.exitcode:
            raise RuntimeError(f"writing the set at {data} failed")
    ann = data / "annotations" / "instances_train2017.json"
    print(
        f"set: {opts.images} images, {ann.stat().st_size / MiB:.0f} MiB of JSON ({time.monotonic() - started:.0f} s)",
        file=sys.stderr,
    )
    versions = [Version("new", opts.code.resolve())]
    if opts.baseline:
        versions.insert(0, Version("today", opts.baseline.resolve()))
    rows = []
    engines = opts.engines.split(",")
    # Interleaved: each engine's versions back to back, each beside its own json.load, so a busy machine
    # weighs on both alike.
    for engine in engines:
        for version in versions:
            for folder in work.glob(f"{version.name}-{engine}-*"):
                if folder.is_dir():
                    shutil.rmtree(folder)
            row: dict[str, Any] = {"name": f"{version.name} {engine}", "version": version.name, "engine": engine}
            row |= {"images": opts.images, "load_average": os.getloadavg()[0], **json_load_floor(ann)}
            if "train" in phases:
                row.update(train_phase(version, engine, data, work, opts.timeout, opts.repeat, opts.print_freq))
            if "load" in phases:
                row["loading"] = load_phase(version, engine, data, work, opts.fraction, opts.timeout)
            row["cache_mib"] = sum(p.stat().st_size for p in work.glob(f"{version.name}-{engine}-*/cache/*")) / MiB
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    floors = {}
    if "train" in phases:
        for engine in engines:
            for version in versions:
                floors[f"{version.name} {engine}"] = floor_phase(version, engine, work, opts.timeout, opts.print_freq)
    for row in rows:
        if "first_step_s" in row:
            row.update(against_goals(row, floors[row["name"]]["resumed_memory"]["total_pss_peak_mib"]))
    report = {"rows": rows, "floor": floors, "print_freq": opts.print_freq}
    print(json.dumps(report, indent=1))
    if opts.json_out:
        opts.json_out.write_text(json.dumps(report, indent=1) + "\n")
    print_table(rows, floors)
    if not opts.keep:  # the runs go; a set in a --work folder stays for the next run
        for path in work.iterdir():
            if path != data and path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            elif path.suffix == ".log":
                path.unlink()
        if not opts.work:
            shutil.rmtree(work, ignore_errors=True)


def print_table(rows: list[dict[str, Any]], floors: dict[str, dict[str, Any]]) -> None:
    print("version engine  json.load  first step  resumed step  data's PSS  (s, MiB; x: of json.load's)  load avg")
    for r in rows:
        if "first_step_s" not in r:
            continue
        print(
            f"{r['version']:<7} {r['engine']:<6} {r['json_load_s']:>8.1f}  {r['first_step_s']:>6.1f} "
            f"({r['first_ratio']:.2f}x)  {r['resumed_step_s']:>6.1f} ({r['resumed_ratio']:.2f}x)  "
            f"{r['data_share_mib']:>6.0f} ({r['share_ratio']:.2f}x)  {r['load_average']:.1f}"
        )
        goals = [("first step", "first"), ("resumed step", "resumed")]
        met = [
            f"{what} {'met' if r[key + '_met'] else 'MISSED'} (<= {r[key + '_goal_s']:.1f} s)" for what, key in goals
        ]
        met.append(
            f"data's PSS {'met' if r['share_met'] else 'MISSED'} (<= {DATA_SHARE_GOAL} x {r['json_load_mib']:.0f} MiB)"
        )
        print("    goals: " + "; ".join(met))
    loading = [r for r in rows if "loading" in r]
    if loading:
        print(
            "version engine  train peak PSS/rank  load: rank PSS  rank USS  worker PSS  worker USS  worker USS growth  "
            "rank+workers PSS  all PSS   (MiB)"
        )
    for r in loading:
        m, lm = r.get("train_memory", {}), r["loading"]["memory"]
        print(
            f"{r['version']:<7} {r['engine']:<6} {m.get('rank_peak_pss_mib', 0):>19.0f}  "
            f"{lm['rank_peak_pss_mib']:>14.0f}  {lm['rank_peak_uss_mib']:>8.0f}  "
            f"{lm['worker_peak_pss_mib']:>10.0f}  {lm['worker_peak_uss_mib']:>10.0f}  "
            f"{lm['worker_uss_growth_mib']:>17.0f}  {lm['rank_with_workers_pss_mib']:>16.0f}  "
            f"{lm['total_pss_peak_mib']:>7.0f}"
        )
    if floors:
        print(
            "first step on a 64-image set (process start + model build): "
            + ", ".join(
                f"{k} {v['first_step_s']:.1f} s, resumed PSS {v['resumed_memory']['total_pss_peak_mib']:.0f} MiB"
                for k, v in floors.items()
            )
        )


if __name__ == "__main__":
    main()
