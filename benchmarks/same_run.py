"""Is a change bit-identical? Train one short fixed-seed run with two installs of maskrcnn-dist and
compare what they wrote: every metrics.jsonl record (timings left out), every checkpoint tensor and
value, and the evaluation of the best checkpoint.

    python benchmarks/same_run.py --before ../main/.venv/bin/maskrcnn-dist --after .venv/bin/maskrcnn-dist \
        [--launch local|ddp|elastic]

The run: a synthetic set, the small model at 64 px on one CPU thread, validation and checkpoints every
few steps and COCO AP at every epoch end (a best.pt), stopped by --max-steps and resumed with
--resume auto; then `eval --resume best`. Three runs are compared with `before`'s: `after`'s own, and
`mixed`, which resumes `before`'s first half with `after` (a checkpoint written by the old code must
go on exactly as the old code would).

`--launch` says how each run's trainer starts (`before` and `after` are the trainer's command either way):
  local    the command itself (the default);
  ddp      2 CPU ranks under this tree's torchrun wrapper (`--no-python` runs the command);
  elastic  `maskrcnn-launch local` over 3 pods (--elastic, one CPU rank each; MASKRCNN_TRAINER_CMD is the
           command), worker 2's trainer SIGKILLed once the master has recorded step KILL_AFTER: the
           survivors redo step KILL_AFTER + 1 on 2 ranks. One whole run each (no halves, no `mixed`), its
           sample record compared too.
ddp and elastic train on a written synthetic set (one writer for every rank) instead of --synthetic-images.

Hook state may move inside a checkpoint between the two (a flat key then, under "hooks" now): both
layouts are read into one before they are compared. A config field that only the new code records (a new
flag) is listed, not compared. Exit status 0 when everything is equal.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from maskrcnn_launcher.contract import TRAINER_CMD
from maskrcnn_launcher.peers import free_port

from maskrcnn_dist.data import write_train_val

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_job import THREE_CPU_PODS as TOPOLOGY  # noqa: E402
from local_job import LocalJob  # noqa: E402

#: Timings and clocks: the only values two identical runs may disagree on.
TIMING_KEYS = frozenset({"time", "images_per_s"})
#: Keys of the run itself in a checkpoint; every other top-level key of a flat (old) checkpoint is a
#: hook's state, under the key that hook kept it by (the evaluation's was "best").
RUN_KEYS = frozenset(
    {"format_version", "model", "optimizer", "scheduler", "scaler", "step", "epoch", "batch", "rng", "pending_hooks"}
    | {"engine", "config", "categories", "trained_model"}
)
FLAT_HOOK_KEYS = {"best": "evaluation"}

FLAGS = [
    "--synthetic-images", "8", "--synthetic-image-size", "64", "--model", "maskrcnn_resnet18_fpn",
    "--min-size", "64", "--max-size", "64", "--device", "cpu", "--threads", "1", "--workers", "0",
    "--batch-size", "2", "--epochs", "3", "--val-period", "3", "--checkpoint-period", "2",
    "--keep-checkpoints", "10", "--warmup-iters", "5", "--lr", "0.02", "--clip-grad-norm", "10",
    "--print-freq", "1", "--seed", "7", "--best-metric", "bbox_AP",
]  # fmt: skip
FIRST_STEPS, LAST_STEPS = 6, 12  # 4 steps an epoch: the first half ends inside the second epoch


KILL_AFTER = 5  # no boundary work at step 5 (val-period 3, checkpoint-period 2, 4 steps an epoch on 3 ranks)
DATA_FLAGS = ("--synthetic-images", "8", "--synthetic-image-size", "64")


class Launch:
    """How a run's trainer starts (module docstring); `data`: the written set of ddp and elastic."""

    def __init__(self, kind: str, data: Path) -> None:
        self.kind, self.data = kind, data
        self.flags = list(FLAGS) if kind == "local" else [*FLAGS[len(DATA_FLAGS) :], "--data-path", str(data)]
        if kind == "elastic":  # 24 images: 4 global batches of 6 an epoch
            self.flags[self.flags.index("--epochs") + 1] = "2"

    def command(self, binary: Path, out: Path, extra: tuple[str, ...]) -> list[str]:
        args = ["train", *self.flags, "--output-dir", str(out), *extra]
        if self.kind == "local":
            return [str(binary), *args]
        rendezvous = ["--nnodes", "1", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
        torchrun = [sys.executable, "-m", "maskrcnn_dist.torchrun", *rendezvous, "--master-port", str(free_port())]
        return [*torchrun, "--no-python", str(binary), *args[:1], "--engine", "ddp", *args[1:]]

    def train(self, binary: Path, out: Path, *extra: str) -> None:
        if self.kind == "elastic":
            return self.train_elastic(binary, out, *extra)
        command = self.command(binary, out, extra)
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")

    def train_elastic(self, binary: Path, out: Path, *extra: str) -> None:
        os.environ[TRAINER_CMD] = f"{binary} train --engine ddp"  # what torchrun starts (launch.py)
        job = LocalJob(out.parent / f"{out.name}-job", out, TOPOLOGY, [*self.flags, "--output-dir", str(out), *extra])
        try:
            job.wait_for_step(KILL_AFTER, 600)
            job.kill_trainer(2)
            if (code := job.finish(600)) != 0:
                sys.exit(f"the elastic run into {out} failed ({code}):\n{job.output()[-4000:]}")
        finally:
            job.kill()


def evaluate_best(binary: Path, out: Path) -> dict[str, Any]:
    command = [str(binary), "eval", "--output-dir", str(out), "--resume", "best", "--workers", "0", "--threads", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_half(launch: Launch, binary: Path, out: Path) -> None:
    launch.train(binary, out, "--max-steps", str(FIRST_STEPS))


def second_half(launch: Launch, binary: Path, out: Path) -> None:
    launch.train(binary, out, "--max-steps", str(LAST_STEPS), "--resume", "auto")


def records(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


def one_layout(state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint with its hook state under "hooks", whichever layout it was written in."""
    state = dict(state)
    hooks = dict(state.pop("hooks", {}))
    for key in [k for k in state if k not in RUN_KEYS]:
        hooks[FLAT_HOOK_KEYS.get(key, key)] = state.pop(key)
    return {**state, "hooks": hooks}


def leaves(value: Any, folders: tuple[str, ...], path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every tensor and plain value; the runs' folders, which differ by design (the
    output folder, and the synthetic set written there), read as one."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from leaves(value[key], folders, f"{path}/{key}")
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple, torch.Tensor)) for v in value):
        for i, item in enumerate(value):
            yield from leaves(item, folders, f"{path}[{i}]")
    elif isinstance(value, str):
        for folder in folders:
            value = value.replace(folder, "OUTPUT_DIR")
        yield path, value
    else:
        yield path, value


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


class Comparison:
    def __init__(self, name: str, folders: tuple[str, ...]) -> None:
        self.name, self.folders, self.differences = name, folders, []
        self.records = self.checkpoints = self.tensors = self.elements = self.values = self.samples = 0
        self.new_fields: set[str] = set()  # config fields only the new code records (new flags): not compared

    def differ(self, what: str) -> None:
        self.differences.append(what)

    def runs(self, before: Path, after: Path) -> None:
        old, new = records(before), records(after)
        self.records = len(old)
        if len(old) != len(new):
            self.differ(f"metrics.jsonl: {len(old)} records before, {len(new)} after")
        for i, (a, b) in enumerate(zip(old, new)):
            if a != b:
                self.differ(f"metrics.jsonl record {i}: {a} != {b}")
        for name in sorted({p.name for run in (before, after) for p in (run / "samples").glob("*.jsonl")}):
            self.samples += 1
            if (before / "samples" / name).read_text() != (after / "samples" / name).read_text():
                self.differ(f"samples/{name} differs")
        old_files = sorted(p.name for p in (before / "checkpoints").glob("*.pt"))
        new_files = sorted(p.name for p in (after / "checkpoints").glob("*.pt"))
        if old_files != new_files:
            self.differ(f"checkpoint files: {old_files} before, {new_files} after")
        for name in old_files:
            if name in new_files:
                self.checkpoint(before / "checkpoints" / name, after / "checkpoints" / name)

    def checkpoint(self, before: Path, after: Path) -> None:
        self.checkpoints += 1
        old = dict(leaves(one_layout(torch.load(before, map_location="cpu", weights_only=True)), self.folders))
        new = dict(leaves(one_layout(torch.load(after, map_location="cpu", weights_only=True)), self.folders))
        for path in sorted(old.keys() | new.keys()):
            if path.startswith("/config/") and path not in old:  # a flag the old code did not have
                self.new_fields.add(path)
                continue
            if path not in old or path not in new:
                self.differ(f"{before.name}: {path} only {'before' if path in old else 'after'}")
                continue
            a, b = old[path], new[path]
            if isinstance(a, torch.Tensor):
                self.tensors += 1
                self.elements += a.numel()
            else:
                self.values += 1
            if not same(a, b):
                self.differ(f"{before.name}: {path} differs")

    def report(self) -> str:
        verdict = "EQUAL" if not self.differences else f"{len(self.differences)} DIFFERENCES"
        lines = [
            f"{self.name}: {verdict}: {self.records} metrics records, {self.samples} sample records, "
            f"{self.checkpoints} checkpoints "
            f"({self.tensors} tensors, {self.elements} elements, {self.values} other values)"
        ]
        if self.new_fields:
            lines.append(f"  new config fields, recorded after only: {', '.join(sorted(self.new_fields))}")
        return "\n".join(lines + [f"  {d}" for d in self.differences[:20]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the reference install's maskrcnn-dist")
    parser.add_argument("--after", type=Path, required=True, help="the changed install's maskrcnn-dist")
    parser.add_argument("--work", type=Path, default=Path("runs/same-run"), help="where the runs are written")
    parser.add_argument(
        "--reuse-before", action="store_true", help="keep the runs of `before` already in --work (the reference)"
    )
    parser.add_argument("--launch", choices=("local", "ddp", "elastic"), default="local", help="see the docstring")
    args = parser.parse_args()
    launch = Launch(args.launch, args.work / "data")
    names = ("before", "after") if args.launch == "elastic" else ("before", "after", "mixed")
    runs = {name: args.work / name for name in names}
    half = args.work / "before-half"  # before's first half: what `mixed` resumes
    # Longest first: an absolute folder before the relative one it ends with.
    folders = {s for p in [*runs.values(), half, launch.data] for s in (str(p), str(p.resolve()))}
    folders = tuple(sorted(folders, key=len, reverse=True))

    reuse = args.reuse_before and (runs["before"] / "metrics.jsonl").is_file() and half.is_dir()
    for name in names[1:] if reuse else names:
        shutil.rmtree(runs[name], ignore_errors=True)
    if args.launch != "local" and not launch.data.is_dir():
        write_train_val(launch.data, num_train=24 if args.launch == "elastic" else 16, num_val=4, seed=3)
    if not reuse:
        shutil.rmtree(half, ignore_errors=True)
        if args.launch == "elastic":
            launch.train(args.before, runs["before"])
            half.mkdir()
        else:
            first_half(launch, args.before, runs["before"])
            shutil.copytree(runs["before"], half)
            second_half(launch, args.before, runs["before"])
        (runs["before"] / "eval.json").write_text(json.dumps(evaluate_best(args.before, runs["before"])))
    if args.launch == "elastic":
        launch.train(args.after, runs["after"])
    else:
        shutil.copytree(half, runs["mixed"])  # the old code's checkpoints, resumed by the new
        first_half(launch, args.after, runs["after"])
        second_half(launch, args.after, runs["after"])
        second_half(launch, args.after, runs["mixed"])
    evaluations = {name: evaluate_best(args.after, runs[name]) for name in names[1:]}
    evaluations["before"] = json.loads((runs["before"] / "eval.json").read_text())

    reference = records(runs["before"])
    last = {r["kind"]: r for r in reference}
    print(f"before: {len(reference)} records; last train loss {last['train']['loss']!r} at step "
          f"{last['train']['step']}; last eval bbox_AP {last['eval']['bbox_AP']!r} segm_AP "
          f"{last['eval']['segm_AP']!r}; eval --resume best: {evaluations['before']}")  # fmt: skip
    failed = False
    for name in names[1:]:
        comparison = Comparison(f"{name} vs before", folders)
        comparison.runs(runs["before"], runs[name])
        if evaluations[name] != evaluations["before"]:
            comparison.differ(f"eval --resume best: {evaluations[name]} != {evaluations['before']}")
        print(comparison.report())
        failed |= bool(comparison.differences)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
