"""The ddp engine with real processes on localhost (gloo on CPU), started by torch's own torchrun."""

from __future__ import annotations

import pytest

from maskrcnn_dist.config import small_cpu_run, to_argv
from maskrcnn_dist.data import write_train_val
from maskrcnn_dist.metrics import read_metrics

from ..procs import run_job, torchrun

SMALL = to_argv(small_cpu_run(64, threads=1, workers=0, warmup_iters=5, aspect_ratio_group_factor=-1, print_freq=1))


@pytest.fixture(scope="module")
def odd_coco(tmp_path_factory):
    """3 validation images: with 2 ranks and batch 1, rank 0 gets 2 batches and rank 1 only 1."""
    root = tmp_path_factory.mktemp("odd_coco")
    write_train_val(root, num_train=8, num_val=3, seed=5, image_size=(48, 64), max_objects=2)
    return root


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_rank_ddp_trains_validates_and_evaluates_unequal_shards(odd_coco, tmp_path, free_port):
    """Validation every step, mid-training, on unequal shards: must finish, not hang."""
    out = tmp_path / "run"
    result = run_job(
        torchrun(
            2,
            free_port,
            [
                *SMALL,
                "--engine",
                "ddp",
                "--data-path",
                str(odd_coco),
                "--output-dir",
                str(out),
                "--epochs",
                "1",
                "--batch-size",
                "2",
                "--val-batch-size",
                "1",
                "--val-period",
                "1",
                "--rpc-timeout",
                "60",
            ],
        ),
        timeout=240,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    records = read_metrics(out / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    # 8 images, 2 ranks, 2 per rank per step: 2 steps, each logging 4 images over the world.
    assert [r["step"] for r in train] == [1, 2]
    val_steps = [r["step"] for r in records if r["kind"] == "val"]
    assert val_steps == [1, 2]  # periodic (step 1) and the epoch end (step 2)
    evaluation = [r for r in records if r["kind"] == "eval"]
    assert len(evaluation) == 1 and evaluation[0]["images"] == 3  # every image once, none twice
    # Only rank 0 writes: one metrics file, one record per step.
    assert result.stdout.count("train step 1/2") == 1
    assert (out / "checkpoints" / "checkpoint_00000002.pt").is_file()
