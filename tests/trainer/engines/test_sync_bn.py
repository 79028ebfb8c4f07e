"""--sync-bn: two gloo ranks normalise as one process over the whole batch; the flag's refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run, to_argv
from maskrcnn_dist.data import write_train_val
from maskrcnn_dist.errors import ConfigError
from maskrcnn_dist.training.metrics import read_metrics

from ..procs import run_job, torchrun, torchrun_command
from .sync_bn_proc import ROWS, make_net

HERE = Path(__file__).resolve().parent


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_sync_bn_equals_one_process_over_the_whole_batch(tmp_path, free_port):
    result = run_job(torchrun_command(2, free_port, str(HERE / "sync_bn_proc.py"), str(tmp_path)), timeout=150)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "FutureWarning" not in result.stdout, result.stdout[-3000:]  # torch's deprecated all_reduce, every step
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    net, batch, weights = make_net()
    net.train()
    whole = batch.clone().requires_grad_()
    output = net(whole)
    (output * weights).sum().backward()
    close = dict(rtol=1e-4, atol=1e-5)
    assert [r["kind"] for r in ranks] == ["AllReduceBatchNorm2d"] * 2
    # The ddp engine converts its model's BatchNorm (the trunk's, with --backbone-norm batch), all of it.
    assert ranks[0]["engine_norms"]["synced"] > 0 and ranks[0]["engine_norms"]["plain"] == 0
    for rank, rows in zip(ranks, ROWS, strict=True):
        torch.testing.assert_close(rank["output"], output[rows].detach(), **close)
        torch.testing.assert_close(rank["input_grad"], whole.grad[rows], **close)
        torch.testing.assert_close(rank["running"][0], net[1].running_mean, **close)
        torch.testing.assert_close(rank["running"][1], net[1].running_var, **close)
    # Each rank's parameter gradient is its part's; DDP sums (and averages) them to the whole batch's.
    for name, param in net.named_parameters():
        torch.testing.assert_close(ranks[0]["param_grads"][name] + ranks[1]["param_grads"][name], param.grad, **close)


def _config(**flags: object) -> TrainConfig:
    cfg = apply_overrides(TrainConfig(), {"sync-bn": True, **flags}, "test")
    cfg.validate()
    return cfg


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"engine": "pipeline"}, "--sync-bn is for --engine ddp"),
        ({"engine": "ddp", "backbone-norm": "frozen"}, "--sync-bn with frozen BatchNorm"),
        ({"engine": "ddp", "weights-backbone": "r50.pth"}, "--sync-bn with frozen BatchNorm"),
    ],
)
def test_sync_bn_is_refused_where_it_cannot_work(flags, message):
    with pytest.raises(ConfigError, match=message):
        _config(**flags)


def test_sync_bn_with_batch_statistics_on_ddp_is_accepted():
    assert _config(engine="ddp", **{"weights-backbone": "r50.pth", "backbone-norm": "batch"}).sync_bn


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_ddp_run_trains_with_sync_bn(tmp_path, free_port):
    """Two ranks of `train --engine ddp --sync-bn`, BatchNorm trained: the all-reduce in every BatchNorm's
    forward runs in step on both ranks, through DDP, to the end (validation and evaluation do not sync)."""
    data = tmp_path / "data"
    write_train_val(data, num_train=8, num_val=2, seed=5, image_size=(48, 64), max_objects=2)
    flags = small_cpu_run(64, threads=1, workers=0, warmup_iters=1, aspect_ratio_group_factor=-1, print_freq=1)
    args = to_argv({**flags, "engine": "ddp", "sync-bn": True, "backbone-norm": "batch", "rpc-timeout": 60.0})
    args += ["--data-path", str(data), "--output-dir", str(tmp_path / "run"), "--max-steps", "2", "--batch-size", "2"]
    result = run_job(torchrun(2, free_port, args), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:]
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"] == [1, 2]
