"""A checkpoint written before the batch plan (no batch layout, no world size), resumed for real: ddp on 2 ranks
(torchrun, gloo, CPU) with aspect-ratio grouping, stopped by SIGTERM mid-epoch; the checkpoint made old by
taking out what the plan added; resumed on 2 ranks and on 1. Either way the epoch keeps its 4 steps (2 ranks
x --batch-size 2: a global batch of 4, not 1 x 2) and its learning rates, its remaining steps train the old
order's images (each rank had grouped its own share: data/old_order.py, checked against DistributedSampler
in tests/trainer/data/test_old_order.py), and one notice says so. (The steps before the stop ran on the plan,
as this run is new: that every image of the epoch is trained on once is the unit tests' to show.)"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch
from maskrcnn_launcher.peers import free_port as pick_free_port

from maskrcnn_dist.checkpoint import list_checkpoints
from maskrcnn_dist.config import TrainConfig, apply_overrides, small_stop_run
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.data.loader import aspect_ratio_groups
from maskrcnn_dist.data.old_order import old_epoch_plan
from maskrcnn_dist.training.samples import read_samples

from ..procs import torchrun
from ..stop_procs import Job, assert_stopped_cleanly, newest_checkpoint, records, small_args, stop_after

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 4  # 16 images, a global batch of 4: one epoch
# Grouped per rank, as the old loader did: the old order differs from the plan's from the first step on.
FLAGS = {"engine": "ddp", "batch_size": 2, "rpc_timeout": 60, "aspect_ratio_group_factor": 0}


def ddp_job(data: Path, out: Path, ranks: int, logs: Path, *extra: str) -> Job:
    return Job(torchrun(ranks, pick_free_port(), [*small_args(data, out, **FLAGS), *extra]), logs)


def make_old(run: Path) -> None:
    """Every checkpoint of `run` as written before the plan: without its batch layout and world size."""
    for path in list_checkpoints(run / "checkpoints"):
        state = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("batch_layout", "world_size", "old_order"):
            state.pop(key, None)
        torch.save(state, path)


def old_order_ids(data: Path) -> list[set[int]]:
    """The image ids of each global batch of epoch 0 in the order 2 ranks began it in before the plan."""
    cfg = apply_overrides(TrainConfig(), small_stop_run(data, data / "unused", **FLAGS), "old checkpoint test")
    train_set, _ = load_datasets(cfg)
    groups = aspect_ratio_groups(train_set.aspect_ratios(), 0)
    plan = old_epoch_plan(len(train_set), 2, 2, epoch=0, seed=cfg.seed, groups=groups)
    return [{train_set.image_ids[i] for m in batch.micro_batches for i in m} for batch in plan]


def test_an_old_checkpoint_resumes_its_epoch_in_its_order_on_its_ranks_or_fewer(stop_coco, tmp_path) -> None:
    first = tmp_path / "two"
    job = ddp_job(stop_coco, first, 2, tmp_path / "first")
    assert_stopped_cleanly(job, stop_after(job, first, "train", 1, lambda j: j.signal(signal.SIGTERM)), lines=2)
    stopped_at = int(newest_checkpoint(first)["step"])
    assert stopped_at < STEPS, "the run must stop mid-epoch"
    make_old(first)
    second = tmp_path / "one"
    shutil.copytree(first, second)

    runs = {}
    for out, ranks in ((first, 2), (second, 1)):
        resumed = ddp_job(stop_coco, out, ranks, tmp_path / f"resumed-{ranks}", "--resume", "auto")
        try:
            assert resumed.start().finish(400) == 0, resumed.output
        finally:
            resumed.kill()
        notices = [line for line in resumed.stderr.splitlines() if "has no batch layout" in line]
        assert len(notices) == 1, resumed.output
        assert "written at world size 2, as its run's train records show" in notices[0]
        assert f"the rest of epoch 0 (from its step {stopped_at + 1} of {STEPS})" in notices[0]
        assert ("world size 2 -> 1" in notices[0]) == (ranks == 1), notices[0]
        runs[ranks] = [r for r in records(out / "metrics.jsonl") if r["kind"] == "train"]
        assert [r["step"] for r in runs[ranks]] == list(range(1, STEPS + 1))  # not 8 steps on 1 rank
        by_step: dict[int, set[int]] = {}
        for line in read_samples(out):
            assert line["epoch"] == 0
            by_step.setdefault(line["step"], set()).update(line["image_ids"])
        old = old_order_ids(stop_coco)
        assert [by_step[step] for step in range(stopped_at + 1, STEPS + 1)] == old[stopped_at:]
    assert [r["lr"] for r in runs[1]] == [r["lr"] for r in runs[2]]  # the schedule did not move
