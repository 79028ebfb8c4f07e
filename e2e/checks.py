"""Assertions on what a run left on the shared volume: metrics records, evaluation, checkpoints.

`Failed` carries a message meant for a person reading CI output: what was expected, what was found.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from maskrcnn_dist.run_dir import BEST_CHECKPOINT, METRICS_FILE, checkpoint_dir
from maskrcnn_dist.run_dir import CHECKPOINT_NAME as CHECKPOINT
from maskrcnn_dist.run_dir import CHECKPOINT_TMP_NAME as TMP
from maskrcnn_dist.training.metrics import read_metrics

# Anything a checkpoint writer could leave behind: the atomic writer's temporary file (TMP) of a
# checkpoint or of best.pt, or any other partial name that mentions a checkpoint or a .pt file.
CHECKPOINT_LIKE = re.compile(r"checkpoint|\.pt", re.IGNORECASE)
AP_KEYS = ("bbox_AP", "segm_AP")


class Failed(AssertionError):
    pass


def require(ok: bool, message: str) -> None:
    if not ok:
        raise Failed(message)


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The run's metrics records so far (none before the trainer starts writing)."""
    path = run_dir / METRICS_FILE
    return read_metrics(path) if path.is_file() else []


def records_since(run_dir: Path, since: float) -> list[dict[str, Any]]:
    """The records written at or after `since` (time.time() here; the containers share the host's clock).
    By time, not by position: a resumed run drops the records of the steps it trains again."""
    return [r for r in read_records(run_dir) if float(r.get("time", 0)) >= since]


def train_steps(records: list[dict[str, Any]]) -> list[int]:
    return [int(r["step"]) for r in records if r.get("kind") == "train"]


def last_train_step(run_dir: Path) -> int:
    return max(train_steps(read_records(run_dir)), default=0)


def checkpoint_steps(run_dir: Path) -> list[int]:
    folder = checkpoint_dir(run_dir)
    if not folder.is_dir():
        return []
    return sorted(int(m[1]) for p in folder.iterdir() if (m := CHECKPOINT.match(p.name)))


def check_training_complete(run_dir: Path, planned_steps: int) -> dict[str, Any]:
    """Every planned step logged, finite losses, validation and COCO AP present. Returns the eval record."""
    records = read_records(run_dir)
    require(bool(records), f"{run_dir}/metrics.jsonl: missing or empty")
    steps = train_steps(records)
    require(
        set(steps) == set(range(1, planned_steps + 1)),
        f"train records cover steps {_ranges(steps)}; the plan is 1..{planned_steps}",
    )
    for r in records:
        if r.get("kind") == "train":
            bad = {k: v for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
            require(not bad, f"non-finite training values at step {r['step']}: {bad}")
            require("loss" in r and "lr" in r, f"train record without loss/lr: {r}")
    require(any(r.get("kind") == "val" for r in records), "no validation-loss ('val') record")
    evals = [r for r in records if r.get("kind") == "eval"]
    require(bool(evals), "no evaluation ('eval') record")
    final = evals[-1]
    require(int(final["step"]) == planned_steps, f"last eval at step {final['step']}, expected {planned_steps}")
    for key in AP_KEYS:
        require(key in final, f"eval record lacks {key}: {sorted(final)}")
        require(isinstance(final[key], (int, float)) and math.isfinite(final[key]), f"{key} = {final[key]!r}")
    return final


def check_one_train_record_per_step(run_dir: Path, planned_steps: int) -> None:
    """metrics.jsonl holds exactly one train record for each planned step: none missing, none twice
    (a resume that redid a step it had logged, or logged one the checkpoint did not hold)."""
    counts = Counter(train_steps(read_records(run_dir)))
    twice = sorted(s for s, n in counts.items() if n > 1)
    require(not twice, f"train records for steps {twice} more than once")
    require(
        sorted(counts) == list(range(1, planned_steps + 1)),
        f"train records cover steps {_ranges(sorted(counts))}; the plan is 1..{planned_steps}",
    )


def check_each_image_once(run_dir: Path, image_ids: Iterable[int], epochs: Iterable[int]) -> None:
    """By the sample record (samples/rank<r>.jsonl, every rank's lines): in each of `epochs` every
    image of `image_ids` was trained on exactly once: none missing, none twice, none foreign, whatever
    members came and went (an elastic member writes its line before the step, and lines past the
    committed position are dropped when a generation forms: docs/elastic.md)."""
    from maskrcnn_dist.training.samples import read_samples  # the trainer's own reader

    wanted, samples = set(image_ids), read_samples(run_dir)
    for epoch in epochs:
        seen = Counter(i for s in samples if s["epoch"] == epoch for i in s["image_ids"])
        twice = sorted(i for i, n in seen.items() if n > 1)
        require(not twice, f"epoch {epoch}: images {twice} trained on more than once (sample record)")
        foreign = sorted(set(seen) - wanted)
        require(not foreign, f"epoch {epoch}: images {foreign} are not in the train set (sample record)")
        gone = sorted(wanted - set(seen))
        require(not gone, f"epoch {epoch}: {len(gone)} train images missing from the sample record: {gone[:10]}")


def check_checkpoints(run_dir: Path, expected_steps: list[int] | None = None, just_crashed: bool = False) -> list[int]:
    """Every checkpoint loads (weights_only) and names its own step; no leftovers of a partial write.

    `just_crashed`: right after a writer was killed its temporary file may still be there (the next
    save removes it); it must be the atomic writer's `.checkpoint_<step>.pt.tmp-<pid>`, never a
    file under a checkpoint's own name."""
    folder = checkpoint_dir(run_dir)
    require(folder.is_dir(), f"{folder}: no checkpoint folder")
    strays = [
        p.name
        for p in folder.iterdir()
        if CHECKPOINT_LIKE.search(p.name) and not CHECKPOINT.match(p.name) and p.name != BEST_CHECKPOINT
    ]
    if just_crashed:
        strays = [n for n in strays if not TMP.match(n)]
    require(not strays, f"partial checkpoint files left in {folder}: {strays}")
    steps = checkpoint_steps(run_dir)
    require(bool(steps), f"{folder}: no checkpoint_*.pt")
    if expected_steps is not None:
        require(steps == expected_steps, f"checkpoints at steps {steps}, expected {expected_steps}")
    from maskrcnn_dist.checkpoint import checkpoint_path, load_checkpoint  # torch: only when checking

    for step in steps:
        state = load_checkpoint(checkpoint_path(folder, step))  # raises on a torn or foreign file
        require(int(state["step"]) == step, f"checkpoint_{step:08d}.pt holds step {state['step']}")
    if (folder / BEST_CHECKPOINT).is_file():
        load_checkpoint(folder / BEST_CHECKPOINT)  # the best evaluation's checkpoint: whole, ours
    return steps


def _ranges(steps: list[int]) -> str:
    """[1,2,3,5,5,6] -> '1-3, 5-6 (repeats: 5)': readable in a failure message."""
    if not steps:
        return "none"
    uniq = sorted(set(steps))
    parts, start, prev = [], uniq[0], uniq[0]
    for s in uniq[1:] + [None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(f"{start}-{prev}" if start != prev else f"{start}")
        if s is not None:
            start = prev = s
    repeats = sorted({s for s in steps if steps.count(s) > 1})
    return ", ".join(parts) + (f" (repeats: {repeats})" if repeats else "")
