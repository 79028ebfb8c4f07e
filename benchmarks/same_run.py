"""Is a change bit-identical? Train one short fixed-seed run with two installs of maskrcnn-dist and
compare what they wrote: every metrics.jsonl record (timings left out), every checkpoint tensor and
value, and the evaluation of the best checkpoint.

    python benchmarks/same_run.py --before ../main/.venv/bin/maskrcnn-dist --after .venv/bin/maskrcnn-dist

The run: a synthetic set, the small model at 64 px on one CPU thread, validation and checkpoints every
few steps and COCO AP at every epoch end (a best.pt), stopped by --max-steps and resumed with
--resume auto; then `eval --resume best`. Three runs are compared with `before`'s: `after`'s own, and
`mixed`, which resumes `before`'s first half with `after` (a checkpoint written by the old code must
go on exactly as the old code would).

Hook state may move inside a checkpoint between the two (a flat key then, under "hooks" now): both
layouts are read into one before they are compared. Exit status 0 when everything is equal.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

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


def train(binary: Path, out: Path, *extra: str) -> None:
    command = [str(binary), "train", *FLAGS, "--output-dir", str(out), *extra]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")


def evaluate_best(binary: Path, out: Path) -> dict[str, Any]:
    command = [str(binary), "eval", "--output-dir", str(out), "--resume", "best", "--workers", "0", "--threads", "1"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def first_half(binary: Path, out: Path) -> None:
    train(binary, out, "--max-steps", str(FIRST_STEPS))


def second_half(binary: Path, out: Path) -> None:
    train(binary, out, "--max-steps", str(LAST_STEPS), "--resume", "auto")


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
        self.records = self.checkpoints = self.tensors = self.elements = self.values = 0

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
            f"{self.name}: {verdict}: {self.records} metrics records, {self.checkpoints} checkpoints "
            f"({self.tensors} tensors, {self.elements} elements, {self.values} other values)"
        ]
        return "\n".join(lines + [f"  {d}" for d in self.differences[:20]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the reference install's maskrcnn-dist")
    parser.add_argument("--after", type=Path, required=True, help="the changed install's maskrcnn-dist")
    parser.add_argument("--work", type=Path, default=Path("runs/same-run"), help="where the runs are written")
    parser.add_argument(
        "--reuse-before", action="store_true", help="keep the runs of `before` already in --work (the reference)"
    )
    args = parser.parse_args()
    runs = {name: args.work / name for name in ("before", "after", "mixed")}
    half = args.work / "before-half"  # before's first half: what `mixed` resumes
    # Longest first: an absolute folder before the relative one it ends with.
    folders = {s for p in [*runs.values(), half] for s in (str(p), str(p.resolve()))}
    folders = tuple(sorted(folders, key=len, reverse=True))

    reuse = args.reuse_before and (runs["before"] / "metrics.jsonl").is_file() and half.is_dir()
    for name in ("after", "mixed") if reuse else ("before", "after", "mixed"):
        shutil.rmtree(runs[name], ignore_errors=True)
    if not reuse:
        shutil.rmtree(half, ignore_errors=True)
        first_half(args.before, runs["before"])
        shutil.copytree(runs["before"], half)
        second_half(args.before, runs["before"])
        (runs["before"] / "eval.json").write_text(json.dumps(evaluate_best(args.before, runs["before"])))
    shutil.copytree(half, runs["mixed"])  # the old code's checkpoints, resumed by the new
    first_half(args.after, runs["after"])
    second_half(args.after, runs["after"])
    second_half(args.after, runs["mixed"])
    evaluations = {name: evaluate_best(args.after, runs[name]) for name in ("after", "mixed")}
    evaluations["before"] = json.loads((runs["before"] / "eval.json").read_text())

    reference = records(runs["before"])
    last = {r["kind"]: r for r in reference}
    print(f"before: {len(reference)} records; last train loss {last['train']['loss']!r} at step "
          f"{last['train']['step']}; last eval bbox_AP {last['eval']['bbox_AP']!r} segm_AP "
          f"{last['eval']['segm_AP']!r}; eval --resume best: {evaluations['before']}")  # fmt: skip
    failed = False
    for name in ("after", "mixed"):
        comparison = Comparison(f"{name} vs before", folders)
        comparison.runs(runs["before"], runs[name])
        if evaluations[name] != evaluations["before"]:
            comparison.differ(f"eval --resume best: {evaluations[name]} != {evaluations['before']}")
        print(comparison.report())
        failed |= bool(comparison.differences)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
