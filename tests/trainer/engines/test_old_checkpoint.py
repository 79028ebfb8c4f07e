"""A checkpoint written before the batch plan (no batch layout, no world size), resumed for real: ddp on 2 ranks
(torchrun, gloo, CPU), each rank grouping its own share by aspect ratio, stopped by SIGTERM mid-epoch; the
checkpoint made old by taking out what the plan added; resumed on 2 ranks and on 1. Either way the epoch
keeps its 4 steps (2 ranks x --batch-size 2: a global batch of 4, not 1 x 2) and its learning rates, every
image of it is trained on once (the rest of it in the order it began in), and one notice says so."""

from __future__ import annotations

import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest
import torch
from maskrcnn_launcher.peers import free_port as pick_free_port

from maskrcnn_dist.checkpoint import list_checkpoints
from maskrcnn_dist.config import TrainConfig, apply_overrides, small_stop_run
from maskrcnn_dist.data import load_datasets
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


def train_ids(data: Path) -> Counter:
    cfg = apply_overrides(TrainConfig(), small_stop_run(data, data / "unused"), "old checkpoint test")
    train_set, _ = load_datasets(cfg)
    return Counter(train_set.image_ids)


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
        samples = read_samples(out)
        assert {s["epoch"] for s in samples} == {0}
        assert Counter(i for s in samples for i in s["image_ids"]) == train_ids(stop_coco)  # each image once
    assert [r["lr"] for r in runs[1]] == [r["lr"] for r in runs[2]]  # the schedule did not move
