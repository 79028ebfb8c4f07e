"""COCO evaluation (bbox and segm AP through pycocotools) and validation loss, for every engine.

Both run on every data-parallel rank or on none, and each reaches exactly one collective at the
end (a gather or a sum) whatever the size of its shard: a collective that only some ranks reach is
the classic multi-GPU validation hang. For the same reason the stop check after each batch (a tiny
all-reduce, `Evaluated.agree_to_stop`) runs as many times on every rank: the largest shard's batch
count, a rank with a smaller shard checking once more without a batch.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np
import pycocotools.mask as mask_util
import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from .data import build_eval_loader, eval_rounds
from .lifetime.stop import Interrupted

log = logging.getLogger(__name__)

# Mask R-CNN's loss terms: fixed, so a rank with an empty shard still contributes a full vector.
LOSS_NAMES = ("loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg")
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl")
T = TypeVar("T")
IOU_TYPES = ("bbox", "segm")
#: The metrics `evaluate` returns, fixed before any evaluation runs: `--best-metric` is checked against
#: them at start. All are COCO APs in [0, 1], higher is better ("images", the count, is not a metric).
METRIC_KEYS = tuple(f"{iou_type}_{name}" for iou_type in IOU_TYPES for name in STAT_NAMES)


class Evaluated(Protocol):
    """What evaluation needs of an engine (engines/base.py's Engine has all of it)."""

    data_rank: int
    data_world_size: int

    def predict(self, images: list[torch.Tensor]) -> list[dict[str, torch.Tensor]]: ...

    def validation_losses(self, images: list[torch.Tensor], targets: list[dict]) -> dict[str, torch.Tensor]: ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def gather_objects(self, obj: Any) -> list[Any] | None: ...

    def agree_to_stop(self) -> bool: ...


def until_stopped(batches: Iterable[T], engine: Evaluated, rounds: int) -> Iterator[T]:
    """`batches`, then the engine's stop agreement after each of `rounds` rounds (the largest shard's batch
    count: the same on every rank); Interrupted as soon as the processes agree to stop."""
    remaining = iter(batches)
    for _ in range(rounds):
        batch = next(remaining, None)
        if batch is not None:
            yield batch
        if engine.agree_to_stop():
            raise Interrupted
    if next(remaining, None) is not None:
        raise AssertionError(f"an evaluation shard has more than {rounds} batches")


def detections_to_coco(
    image_id: int, detection: dict[str, torch.Tensor], label_to_category_id: list[int]
) -> list[dict[str, Any]]:
    """One image's detections as COCO result records (xywh boxes, RLE masks thresholded at 0.5)."""
    boxes = detection["boxes"].detach().cpu()
    if boxes.numel() == 0:
        return []
    xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
    scores = detection["scores"].tolist()
    categories = [label_to_category_id[int(label)] for label in detection["labels"]]
    records = [
        {"image_id": image_id, "category_id": c, "bbox": b, "score": s} for b, c, s in zip(xywh, categories, scores)
    ]
    if "masks" in detection:
        binary = (detection["masks"][:, 0] > 0.5).to(torch.uint8).cpu().numpy()
        rles = mask_util.encode(np.asfortranarray(binary.transpose(1, 2, 0)))
        for record, rle in zip(records, rles):
            rle["counts"] = rle["counts"].decode("ascii")  # bytes do not survive JSON or gathers
            record["segmentation"] = rle
    return records


def coco_ap(coco_gt: COCO, results: list[dict[str, Any]], image_ids: Iterable[int]) -> dict[str, float]:
    """bbox and segm AP over exactly `image_ids`; no detections at all scores 0 rather than failing."""
    image_ids = sorted(set(image_ids))
    metrics: dict[str, float] = {}
    for iou_type in IOU_TYPES:
        usable = [r for r in results if iou_type == "bbox" or "segmentation" in r]
        if not usable:
            metrics.update({f"{iou_type}_{name}": 0.0 for name in STAT_NAMES})
            continue
        with contextlib.redirect_stdout(io.StringIO()) as captured:
            coco_dt = coco_gt.loadRes(usable)
            evaluator = COCOeval(coco_gt, coco_dt, iou_type)
            evaluator.params.imgIds = image_ids
            evaluator.evaluate()
            evaluator.accumulate()
            evaluator.summarize()
        log.debug("COCOeval %s:\n%s", iou_type, captured.getvalue())
        # COCOeval reports -1 where a category/area range has no ground truth.
        metrics.update({f"{iou_type}_{name}": max(0.0, float(v)) for name, v in zip(STAT_NAMES, evaluator.stats)})
    return metrics


def evaluate(engine: Evaluated, dataset, batch_size: int, workers: int) -> dict[str, float] | None:
    """COCO AP of the engine's model on `dataset`. Rank 0 gets the metrics, other ranks None; Interrupted
    when the processes agree to stop before the end."""
    loader = build_eval_loader(
        dataset, batch_size, rank=engine.data_rank, world_size=engine.data_world_size, num_workers=workers
    )
    rounds = eval_rounds(len(dataset), batch_size, world_size=engine.data_world_size)
    per_image: dict[int, list[dict[str, Any]]] = {}
    for images, targets in until_stopped(loader, engine, rounds):
        for target, detection in zip(targets, engine.predict(images)):
            image_id = int(target["image_id"])
            per_image[image_id] = detections_to_coco(image_id, detection, dataset.label_to_category_id)
    gathered = engine.gather_objects(per_image)
    if gathered is None:
        return None
    merged: dict[int, list[dict[str, Any]]] = {}
    for shard in gathered:
        for image_id, records in shard.items():
            merged.setdefault(image_id, records)  # an image seen by two ranks counts once
    results = [r for records in merged.values() for r in records]
    metrics = coco_ap(dataset.coco, results, merged.keys())
    metrics["images"] = float(len(merged))
    return metrics


def validation_loss(engine: Evaluated, dataset, batch_size: int, workers: int) -> dict[str, float]:
    """Mean validation losses per image over the whole set, identical on every rank; Interrupted when the
    processes agree to stop before the end."""
    loader = build_eval_loader(
        dataset, batch_size, rank=engine.data_rank, world_size=engine.data_world_size, num_workers=workers
    )
    rounds = eval_rounds(len(dataset), batch_size, world_size=engine.data_world_size)
    totals = torch.zeros(len(LOSS_NAMES) + 1, dtype=torch.float64)
    for images, targets in until_stopped(loader, engine, rounds):
        losses = engine.validation_losses(images, targets)
        totals[:-1] += torch.tensor([float(losses[name]) * len(images) for name in LOSS_NAMES], dtype=torch.float64)
        totals[-1] += len(images)
    totals = engine.all_reduce_sum(totals)  # the one collective, reached by every rank once
    count = max(1.0, float(totals[-1]))
    means = {name: float(value) / count for name, value in zip(LOSS_NAMES, totals[:-1])}
    means["loss"] = sum(means[name] for name in LOSS_NAMES)
    return means
