"""A run that changes its world size at a resume, for real: ddp on 2 ranks (torchrun, gloo, CPU) stopped by
SIGTERM mid-epoch, resumed on 1 rank, stopped again, resumed on 2 to the end. The global batch stays
2 images (one micro-batch per rank, two on one rank): the sample record shows every image of the epoch
once, and every step's losses are an uninterrupted 2-rank run's, within the accumulation's rounding."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from maskrcnn_launcher.contract import TERMINATION_GRACE_SECONDS
from maskrcnn_launcher.peers import free_port as pick_free_port

from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.training.samples import read_samples

from ..disk import drop_checkpoints
from ..procs import torchrun
from ..stop_procs import Job, assert_stopped_cleanly, newest_checkpoint, records, small_args, stop_after, train_losses

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 8  # 16 images, a global batch of 2 (2 ranks x --batch-size 1): one epoch
ENV = {TERMINATION_GRACE_SECONDS: ""}
BATCHNORM_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def ddp_job(data: Path, out: Path, ranks: int, logs: Path, *extra: str) -> Job:
    """No clipping in effect (a bound it never reaches: clipping would hide a gradient of the wrong scale),
    and a rate low enough to stay finite without it."""
    args = small_args(data, out, engine="ddp", batch_size=1, rpc_timeout=60, clip_grad_norm=1e6, lr=0.001)
    return Job(torchrun(ranks, pick_free_port(), [*args, *extra]), logs, ENV)


def finished(job: Job) -> int:
    """Start `job` and let it run to its end; its exit code."""
    try:
        return job.start().finish(300)
    finally:
        job.kill()


def sigterm(job: Job) -> None:
    job.signal(signal.SIGTERM)


@pytest.fixture(scope="module")
def reference(stop_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    out = tmp_path_factory.mktemp("world_reference") / "run"
    job = ddp_job(stop_coco, out, 2, out.parent / "logs")
    assert finished(job) == 0, job.output
    yield out
    drop_checkpoints(out)


def test_two_ranks_to_one_and_back_train_each_image_once_and_the_same_steps(stop_coco, reference, tmp_path) -> None:
    out = tmp_path / "run"
    first = ddp_job(stop_coco, out, 2, tmp_path / "first")
    assert_stopped_cleanly(first, stop_after(first, out, "train", 2, sigterm), lines=2)
    stopped_at = int(newest_checkpoint(out)["step"])
    assert stopped_at < STEPS - 2, "the 2-rank run must stop mid-epoch, with steps left for the other two"

    one = ddp_job(stop_coco, out, 1, tmp_path / "one", "--resume", "auto")
    assert_stopped_cleanly(one, stop_after(one, out, "train", stopped_at + 1, sigterm), lines=1)
    assert one.stderr.count("resume: world size 2 -> 1: the global batch stays 2 images") == 1, one.output
    back_at = int(newest_checkpoint(out)["step"])
    assert back_at < STEPS, "the 1-rank run must stop with steps left for 2 ranks again"

    back = ddp_job(stop_coco, out, 2, tmp_path / "back", "--resume", "auto")
    assert finished(back) == 0, back.output
    assert back.stderr.count("resume: world size 1 -> 2") == 1, back.output

    train = [r for r in records(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))
    worlds = [2 if s <= stopped_at or s > back_at else 1 for s in range(1, STEPS + 1)]
    assert [r["world_size"] for r in train] == worlds  # every train record carries its world size

    # The sample record: each rank's lines; the epoch's images, each once, across the three world sizes.
    samples = read_samples(out)
    assert [(s["step"], s["world_size"]) for s in samples] == [
        (step, world) for step, world in zip(range(1, STEPS + 1), worlds, strict=True) for _ in range(world)
    ]
    assert {s["epoch"] for s in samples} == {0} and all(len(s["image_ids"]) == 2 // s["world_size"] for s in samples)
    train_set, _ = load_datasets_of(stop_coco)
    assert Counter(i for s in samples for i in s["image_ids"]) == Counter(train_set.image_ids)
    by_step = {}
    for s in samples:
        by_step.setdefault(s["step"], set()).update(s["image_ids"])
    for s in read_samples(reference):
        assert set(s["image_ids"]) <= by_step[s["step"]], s  # a step trains the same images at any world size

    got, expected = dict(train_losses(out / "metrics.jsonl")), dict(train_losses(reference / "metrics.jsonl"))
    worst = max(abs(got[s][n] - v) / max(abs(v), 1e-6) for s in expected for n, v in expected[s].items())
    for step in range(1, STEPS + 1):
        if step <= stopped_at:
            assert got[step] == expected[step], step  # bit for bit before any change
        for name, value in expected[step].items():
            assert got[step][name] == pytest.approx(value, rel=1e-4, abs=1e-6), (step, name)
    # The weights after the last step: every step's update, not only the losses it logged. Not BatchNorm's
    # running statistics: in ddp they follow rank 0's micro-batch (DDP broadcasts its buffers), on one rank
    # every micro-batch it ran (docs/world-size.md).
    weights, ref_weights = newest_checkpoint(out)["model"], newest_checkpoint(reference)["model"]
    ref_weights = {k: w for k, w in ref_weights.items() if not k.endswith(BATCHNORM_STATISTICS)}
    drift = max(float((weights[k].float() - w.float()).abs().max()) for k, w in ref_weights.items())
    print(f"world size 2 -> 1 -> 2: losses within {worst:.1e} (relative), weights within {drift:.1e}")
    for key, value in ref_weights.items():
        torch.testing.assert_close(weights[key].float(), value.float(), rtol=1e-4, atol=1e-6, msg=key)


def load_datasets_of(data: Path):
    """The train split as the runs read it (the same flags), for its image ids."""
    from maskrcnn_dist.config import TrainConfig, apply_overrides, small_stop_run

    cfg = apply_overrides(TrainConfig(), small_stop_run(data, data / "unused"), "world size test")
    return load_datasets(cfg)


def test_three_ranks_resume_a_two_rank_sync_bn_run_with_a_filler_each_step(stop_coco, tmp_path) -> None:
    """3 ranks on a global batch of 2 micro-batches: rank 2 runs a zero-weight filler every step, so that
    SyncBatchNorm's all-reduce in every forward and DDP's in the backward pair up on all three (a rank
    without one would leave the others waiting until --rpc-timeout). Every image still once."""
    out, sync_bn = tmp_path / "run", ("--sync-bn", "--backbone-norm", "batch")
    first = ddp_job(stop_coco, out, 2, tmp_path / "first", *sync_bn)
    assert_stopped_cleanly(first, stop_after(first, out, "train", 2, sigterm), lines=2)
    three = ddp_job(stop_coco, out, 3, tmp_path / "three", *sync_bn, "--resume", "auto")
    assert finished(three) == 0, three.output
    assert three.stderr.count("resume: world size 2 -> 3") == 1, three.output
    train = [r for r in records(out / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1)) and train[-1]["world_size"] == 3
    samples = read_samples(out)
    assert {s["rank"] for s in samples if s["world_size"] == 3} == {0, 1, 2}
    assert all(s["image_ids"] == [] for s in samples if s["rank"] == 2)  # its filler is nobody's sample
    train_set, _ = load_datasets_of(stop_coco)
    assert Counter(i for s in samples for i in s["image_ids"]) == Counter(train_set.image_ids)
