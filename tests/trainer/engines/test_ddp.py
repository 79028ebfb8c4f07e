"""The ddp engine with real processes on localhost (gloo on CPU), started by torch's own torchrun."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskrcnn_dist.config import small_cpu_run, to_argv
from maskrcnn_dist.data import write_train_val
from maskrcnn_dist.training.metrics import read_metrics

from ..conftest import TEST_HEADS
from ..procs import run_job, torchrun, torchrun_command

HERE = Path(__file__).resolve().parent

SMALL = to_argv(
    small_cpu_run(64, threads=1, workers=0, warmup_iters=5, aspect_ratio_group_factor=-1, print_freq=1, **TEST_HEADS)
)


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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_rank_ddp_equals_the_local_engine_on_the_global_batch(tmp_path, free_port):
    """Rank r trains on half of a 4-image batch; the single-process reference runs the same halves
    (seeded as rank r is) and accumulates their mean loss's gradient (reference.local_accumulating).
    Frozen BatchNorm: with batch statistics the ranks would normalise differently by design."""
    out = tmp_path / "result.pt"
    command = torchrun_command(2, free_port, str(HERE / "ddp_equivalence_proc.py"), str(out), "2")
    result = run_job(command, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    saved = torch.load(out, weights_only=False)
    for got, expected in zip(saved["ddp_losses"], saved["ref_losses"], strict=True):
        assert got.keys() == expected.keys()
        for name in expected:
            assert got[name] == pytest.approx(expected[name], rel=1e-5, abs=1e-6), name
    rank0, rank1 = saved["ddp_states"]
    for key, expected in saved["ref_state"].items():
        torch.testing.assert_close(rank0[key].float(), expected.float(), rtol=1e-5, atol=1e-6, msg=key)
        assert torch.equal(rank0[key], rank1[key]), key  # the replicas stay identical


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_checks_the_data_once_and_every_rank_drops_the_same_images(odd_coco, tmp_path, free_port):
    """Rank 0 checks; rank 1 gets its verdict: both warn and drop image 2, and train in step."""
    data = tmp_path / "data"
    for split in ("train", "val"):
        (data / split / "images").mkdir(parents=True)
        (data / split / "annotations.json").write_bytes((odd_coco / split / "annotations.json").read_bytes())
        for image in (odd_coco / split / "images").iterdir():
            (data / split / "images" / image.name).write_bytes(image.read_bytes())
    (data / "train" / "images" / "000002.png").write_bytes(b"not an image")
    args = [*SMALL, "--engine", "ddp", "--data-path", str(data), "--output-dir", str(tmp_path / "run")]
    args += ["--batch-size", "1", "--max-steps", "2", "--rpc-timeout", "60", "--no-eval-every-epoch"]
    refused = run_job(torchrun(2, free_port, args), timeout=240)
    assert refused.returncode != 0
    assert refused.stdout.count("1 of 8 images are bad") == 2  # rank 0's verdict, raised on both ranks
    result = run_job(torchrun(2, free_port, [*args, "--skip-bad-images"]), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    # train and val, on rank 0 only (the refused run cached its verdicts: "(header, 7 unchanged ...)")
    assert result.stdout.count("images checked (header") == 2
    assert "[rank 1] INFO maskrcnn_dist.data.images.check" not in result.stdout
    warnings = [line for line in result.stdout.splitlines() if "--skip-bad-images: training without 1 of 8" in line]
    assert len(warnings) == 2 and [any(f"[rank {r}]" in line for line in warnings) for r in (0, 1)] == [True, True]
