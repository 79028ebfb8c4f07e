"""The data plan a run trains with, read where its resume checkpoint is read: the global batch (data/plan.py's
`BatchLayout`), and for a checkpoint written before the plan the order its epoch began in (data/old_order.py).

A checkpoint without a `batch_layout` kept neither its global batch nor the number of ranks that wrote it,
and its position means a batch of that world size's old order (DistributedSampler's shares, grouped by
aspect ratio per rank). Resumed as if it were this launch's, a 2-rank checkpoint on 1 rank would halve the
global batch, double the epoch's steps and move the learning-rate milestones, and even at its own world size
the rest of its epoch would repeat some images and leave others out. So the world size that wrote it is read
from what the run recorded (`old_world_size`), its global batch kept (that world size x its --batch-size),
and the rest of its epoch finished in its old order, shared by this run's ranks (each image once); the next
epoch starts on the plan. One notice says so. The marker goes into the next checkpoints until that epoch ends.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.old_order import OLD_ORDER_KEY, OldOrder, repeated_images
from ..data.plan import LAYOUT_KEY, BatchLayout, layout_change, layout_of_run

log = logging.getLogger(__name__)

#: The engines that train on one data rank whatever their processes (the pipeline's master feeds every stage).
ONE_DATA_RANK = ("local", "pipeline")


@dataclass(frozen=True)
class RunPlan:
    """The run's global batch, and the epoch that still goes on in its old order (None: none)."""

    layout: BatchLayout
    old_order: OldOrder | None = None

    def facts(self) -> dict[str, Any]:
        """What the run's checkpoints keep of it (beside the layout, which build_trainer writes)."""
        return {OLD_ORDER_KEY: self.old_order.to_state()} if self.old_order else {}


def run_plan(
    resumed: tuple[Mapping[str, Any], Path | None] | None,
    num_samples: int,
    batch_size: int,
    world_size: int,
    announce: bool = True,
) -> RunPlan:
    """The plan of a run at `world_size` resumed from `resumed` (a checkpoint and its file; None: a fresh run)."""
    saved, source = resumed if resumed is not None else (None, None)
    if saved is None or LAYOUT_KEY in saved:
        layout = layout_of_run(saved, batch_size, world_size, announce)
        old = saved.get(OLD_ORDER_KEY) if saved is not None else None
        if old is not None and int(saved["epoch"]) == int(old["epoch"]):  # type: ignore[index]
            return RunPlan(layout, OldOrder.from_state(old))
        return RunPlan(layout)
    old_batch = int(saved.get("config", {}).get("data", {}).get("batch_size", batch_size))
    written_by, evidence = old_world_size(saved, source, num_samples, old_batch)
    assumed = written_by is None
    before = world_size if written_by is None else written_by
    layout = BatchLayout(before, old_batch)
    epoch, batch = int(saved["epoch"]), int(saved["batch"])
    plan = RunPlan(layout, OldOrder(epoch, before) if batch > 0 and before <= num_samples else None)
    if announce:
        where = (source, evidence, assumed)
        log.info("%s", old_checkpoint_notice(plan, where, num_samples, batch, batch_size, world_size))
    return plan


def old_checkpoint_notice(
    plan: RunPlan,
    where: tuple[Path | None, str, bool],
    num_samples: int,
    batch: int,
    batch_size: int,
    world_size: int,
) -> str:
    """The one line that says how a checkpoint written before the plan goes on; `where`: the checkpoint, what
    showed its world size, and whether nothing did (this run's taken instead)."""
    (source, evidence, assumed), layout = where, plan.layout
    before, steps = layout.micro_batches, layout.steps_per_epoch(num_samples)
    parts = [
        f"resume: checkpoint {source} has no batch layout (written before the batch plan); "
        + (
            f"nothing it recorded shows how many ranks wrote it ({evidence}): taken as this run's, {before}; had "
            "another number written it, the rest of its epoch would repeat some images and leave others out"
            if assumed
            else f"written at world size {before}, as {evidence}"
        ),
        f"the global batch stays {layout.global_batch_size} images ({before} x --batch-size {layout.batch_size}), "
        f"{steps} steps an epoch",
    ]
    if plan.old_order is not None:
        repeats = repeated_images(num_samples, before)
        left_out = f"; the {repeats} image(s) it repeated to even out its ranks are left out" if repeats else ""
        parts.append(
            f"the rest of epoch {plan.old_order.epoch} (from its step {batch + 1} of {steps}) keeps the order it "
            f"began in, each image once{left_out}; the next epoch starts on the plan"
        )
    if change := layout_change(layout, before, batch_size, world_size):
        parts.append(change.removeprefix("resume: "))
    return "; ".join(parts)


def old_world_size(
    saved: Mapping[str, Any], source: Path | None, num_samples: int, batch_size: int
) -> tuple[int | None, str]:
    """The number of data ranks that wrote a checkpoint made before the plan, and what shows it; None (and
    what was looked at) where nothing does: its engine, its run's train records (each carries
    `world_size`), or its position (steps an epoch, once one has ended)."""
    engine = saved.get("engine")
    if engine in ONE_DATA_RANK:
        return 1, f"its engine, {engine}, trains on one data rank"
    step, epoch, batch = int(saved["step"]), int(saved["epoch"]), int(saved["batch"])
    if (recorded := _recorded_world_size(source, step)) is not None:
        return recorded, "its run's train records show"
    if epoch >= 1 and (step - batch) % epoch == 0:
        per_epoch = (step - batch) // epoch
        fits = [n for n in range(1, num_samples + 1) if math.ceil(num_samples / (n * batch_size)) == per_epoch]
        if len(fits) == 1:
            return fits[0], f"its position shows ({per_epoch} steps an epoch of {num_samples} images)"
    return None, "no train records, and its position fits several"


def _recorded_world_size(source: Path | None, step: int) -> int | None:
    """The `world_size` of the last train record up to `step` in the metrics of the run whose checkpoints
    folder holds `source` (a train record carries it since the plan: a run resumed from an older checkpoint
    has them)."""
    if source is None or source.parent.name != "checkpoints":
        return None
    metrics = source.parent.parent / "metrics.jsonl"
    found = None
    try:
        lines = metrics.read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or record.get("kind") != "train":
            continue
        at, size = record.get("step"), record.get("world_size")
        if isinstance(at, int) and at <= step and isinstance(size, int) and size >= 1:
            found = size
    return found
