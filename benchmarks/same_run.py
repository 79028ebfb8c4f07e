"""Two checkouts train the same fixed-seed runs: their losses, APs, checkpoint tensors and metrics equal.

A refactoring that keeps behaviour bit-identical is held to it here: every variant below is trained
once with each checkout's own virtual environment (`maskrcnn-dist train` as a user runs it), then
every record of metrics.jsonl (timings and dates left out) and every tensor of every checkpoint are
compared exactly. The variants cover the data paths: the generated synthetic set (not checked), a
written set behind --data-path with a carved val split and a bad image skipped (the data check, its
frames and its drops), lsj with copy-paste and aspect-ratio groups, and ddp on two processes (rank 0
checks, the others receive its verdicts).

    python benchmarks/same_run.py --before /work/main --after . [--variants synthetic,checked]

Exit 0 when every variant is equal; each difference is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Record fields that measure time or place, not what was computed.
UNTIMED = {"time", "s_per_iter", "data_time", "images_per_s", "eta_s", "wall_s", "seconds", "date", "timestamp"}

COMMON = [
    "--model", "maskrcnn_resnet18_fpn", "--min-size", "96", "--max-size", "96", "--device", "cpu",
    "--lr", "0.02", "--clip-grad-norm", "10", "--batch-size", "2", "--workers", "1", "--warmup-iters", "5",
    "--print-freq", "1", "--seed", "7", "--threads", "1",
]  # fmt: skip

VARIANTS: dict[str, list[str]] = {
    "synthetic": ["--synthetic-images", "8", "--synthetic-image-size", "96", "--epochs", "2"],
    "checked": [
        "--train-annotations", "{data}/train/annotations.json", "--train-images", "{data}/train/images",
        "--val-fraction", "0.25", "--skip-bad-images", "--epochs", "2",
        "--data-cache", "{out}/cache",
    ],
    "lsj": [
        "--data-path", "{data}", "--skip-bad-images", "--epochs", "1", "--data-augmentation", "lsj",
        "--use-copypaste", "--aspect-ratio-group-factor", "3",
    ],
    "ddp": ["--data-path", "{data}", "--skip-bad-images", "--epochs", "1", "--engine", "ddp"],
}  # fmt: skip


def write_data(checkout: Path, root: Path) -> Path:
    """A written set of 10 + 4 images with one train image spoiled (the check drops it)."""
    data = root / "data"
    if not data.exists():
        cli = checkout / ".venv" / "bin" / "maskrcnn-dist"
        subprocess.run(
            [cli, "synth-data", "--output", data, "--train-images", "10", "--val-images", "4", "--image-size", "96"],
            check=True,
            capture_output=True,
        )
        (data / "train" / "images" / "000003.png").write_bytes(b"not an image\n")
    return data


def train(checkout: Path, variant: str, out: Path, data: Path) -> None:
    flags = [f.format(data=data, out=out) for f in VARIANTS[variant]]
    python = checkout / ".venv" / "bin" / "python"
    if "ddp" in flags:
        argv = [python, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29731"]
        argv += ["-m", "maskrcnn_dist.cli", "train"]
    else:
        argv = [checkout / ".venv" / "bin" / "maskrcnn-dist", "train"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    done = subprocess.run([*argv, *COMMON, *flags, "--output-dir", out], env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{checkout} {variant}: exit {done.returncode}\n{done.stderr[-4000:]}")


def records(out: Path) -> list[dict[str, Any]]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in UNTIMED} for line in lines]


def checkpoints(out: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted((out / "checkpoints").glob("*.pt"))}


def tensors(value: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a checkpoint, by its path: tensors as they are, the rest as values."""
    import torch

    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in tensors(item, f"{prefix}/{key}").items()}
    if isinstance(value, list | tuple) and any(isinstance(v, dict | list | tuple | torch.Tensor) for v in value):
        return {k: v for i, item in enumerate(value) for k, v in tensors(item, f"{prefix}/{i}").items()}
    return {prefix: value}


def compare(before: Path, after: Path) -> list[str]:
    """The differences between two runs; a path inside a run's own folder counts as the same path."""
    import torch

    def placed(value: Any, run: Path) -> str:
        return repr(value).replace(str(run.parent), "<run>")

    problems = []
    old, new = records(before), records(after)
    if len(old) != len(new):
        problems.append(f"metrics.jsonl: {len(old)} records before, {len(new)} after")
    for i, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b:
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            problems.append(f"metrics.jsonl record {i}: {[(k, a.get(k), b.get(k)) for k in keys]}")
    old_ck, new_ck = checkpoints(before), checkpoints(after)
    if old_ck.keys() != new_ck.keys():
        problems.append(f"checkpoints: {sorted(old_ck)} before, {sorted(new_ck)} after")
    for name in sorted(old_ck.keys() & new_ck.keys()):
        a = tensors(torch.load(old_ck[name], map_location="cpu", weights_only=False))
        b = tensors(torch.load(new_ck[name], map_location="cpu", weights_only=False))
        for key in sorted(a.keys() | b.keys()):
            x, y = a.get(key), b.get(key)
            if isinstance(x, torch.Tensor):
                same = isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
            else:
                same = placed(x, before) == placed(y, after)
            if not same:
                problems.append(f"{name}{key}: differs")
    counted = sum(len(tensors(torch.load(p, map_location="cpu", weights_only=False))) for p in new_ck.values())
    print(f"  {len(new)} metrics records, {len(new_ck)} checkpoints, {counted} checkpoint leaves compared")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout with its own .venv")
    parser.add_argument("--after", type=Path, required=True, help="a checkout with its own .venv")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--keep", type=Path, help="train here and keep the runs (default: a temporary folder)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="same-run-"))
    failed = False
    for variant in args.variants.split(","):
        runs = {}
        for side, checkout in (("before", args.before), ("after", args.after)):
            # Each checkout trains on data of its own writing, at the same path: paths are in the records.
            place = root / variant / side
            data = write_data(checkout, place)
            out = place / "run"
            train(checkout.resolve(), variant, out, data)
            runs[side] = out
        print(f"{variant}:")
        problems = compare(runs["before"], runs["after"])
        for problem in problems:
            print(f"  DIFFERS {problem}")
        print("  equal" if not problems else f"  {len(problems)} differences")
        failed |= bool(problems)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
