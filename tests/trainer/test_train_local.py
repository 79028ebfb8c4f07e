"""The local engine end to end: loss falls, AP > 0, exact resume, clean stops on non-finite loss."""

from __future__ import annotations

import math
import shutil
from contextlib import closing

import pytest
import torch

from maskrcnn_dist.checkpoint import load_checkpoint
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.outputs.report import draw_report
from maskrcnn_dist.train import train
from maskrcnn_dist.trainer_parts import build_trainer, run_metrics
from maskrcnn_dist.training.metrics import read_metrics

from .conftest import MODEL_HEADS, fast_config
from .disk import drop_checkpoints


def train_losses(output_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(output_dir / "metrics.jsonl") if r["kind"] == "train"}


@pytest.fixture(scope="module")
def trained_run(tiny_coco, tmp_path_factory):
    """One short run shared by the tests that only read its outputs (training is the slow part)."""
    out = tmp_path_factory.mktemp("trained")
    # lr 0.01: the lr-0.02 run is chaotic enough that small numeric changes (channels_last) move its AP.
    cfg = fast_config(tiny_coco, out, epochs=8, lr=0.01, **{"max-steps": 42, "val-period": 20}, **MODEL_HEADS)
    yield cfg, train(cfg)
    drop_checkpoints(out)


def test_loss_falls_on_synthetic_data(trained_run):
    cfg, result = trained_run
    losses = train_losses(cfg.output_dir)
    assert result.position.step == 42 and len(losses) == 42
    first, last = [losses[s] for s in range(1, 7)], [losses[s] for s in range(37, 43)]
    assert sum(last) / len(last) < 0.6 * sum(first) / len(first)


def test_evaluation_reports_positive_ap(trained_run):
    _, result = trained_run
    assert result.eval is not None
    assert result.eval["images"] == 4  # the whole val split, each image once
    assert result.eval["bbox_AP"] > 0 and result.eval["segm_AP"] > 0


def test_metrics_validation_checkpoint_and_report(trained_run, tmp_path):
    cfg, result = trained_run
    records = read_metrics(cfg.output_dir / "metrics.jsonl")
    kinds = {r["kind"] for r in records}
    assert kinds == {"train", "val", "eval", "best"}  # the first evaluation is always a new best
    train_record = next(r for r in records if r["kind"] == "train")
    assert {"loss_classifier", "loss_mask", "lr", "images_per_s", "loss"} <= set(train_record)
    # every epoch end (6 steps each), every 20 steps, and the end of training
    assert [r["step"] for r in records if r["kind"] == "val"] == [6, 12, 18, 20, 24, 30, 36, 40, 42]
    assert math.isfinite(result.val["loss"])
    checkpoint = load_checkpoint(cfg.output_dir / "checkpoints")
    assert checkpoint["step"] == 42 and checkpoint["engine"] == "local"
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "epoch", "batch", "config"} <= set(checkpoint)
    png = draw_report(cfg.output_dir / "metrics.jsonl", tmp_path / "report.png")
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert (cfg.output_dir / "tensorboard").is_dir()


@pytest.fixture(scope="module")
def train_only_coco(tiny_coco, tmp_path_factory):
    """tiny_coco's training split alone: runs that only compare training losses skip validation and AP."""
    root = tmp_path_factory.mktemp("train_only")
    shutil.copytree(tiny_coco / "train", root / "train")
    return root


@pytest.mark.slow
def test_resume_continues_exactly(train_only_coco, tmp_path):
    """Stopping at step 4 (mid-epoch: 6 batches per epoch) and resuming gives the uninterrupted losses,
    across the epoch boundary at step 6 (new shuffle, new flips). At 64 px: what resumes is the state,
    whatever the size."""
    common = dict(epochs=2, **{"checkpoint-period": 4, "min-size": 64, "max-size": 64})
    straight = fast_config(train_only_coco, tmp_path / "straight", **common, **{"max-steps": 9})
    train(straight)
    first_half = fast_config(train_only_coco, tmp_path / "resumed", **common, **{"max-steps": 4})
    train(first_half)
    second_half = fast_config(train_only_coco, tmp_path / "resumed", **common, **{"max-steps": 9, "resume": "auto"})
    result = train(second_half)
    assert result.position.step == 9
    expected, got = train_losses(straight.output_dir), train_losses(second_half.output_dir)
    assert [got[s] for s in range(5, 10)] == [expected[s] for s in range(5, 10)]
    assert load_checkpoint(second_half.output_dir / "checkpoints")["step"] == 9


@pytest.mark.slow
def test_a_non_finite_step_changes_no_weight_nor_momentum(tiny_coco, tmp_path):
    """The step reads nothing back: it returns the NaN and skips its update on the device (the scaler's
    found_inf with the fused optimizer); the loop stops the run where it reads the loss (test_step_reads)."""
    cfg = fast_config(tiny_coco, tmp_path, **{"max-steps": 2, "checkpoint-period": 1})
    train_set, val_set = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
    with closing(run_metrics(cfg, True, cfg.total_steps(6))) as metrics:
        build_trainer(cfg, engine, train_set, val_set, 6, metrics).fit()
    bias = engine.model.roi_heads.box_predictor.cls_score.bias
    bias.data.fill_(float("nan"))
    # Parameters are what an update changes (BatchNorm statistics move in any training forward).
    before = {k: v.detach().clone() for k, v in engine.model.named_parameters()}
    momenta = [b.clone() for b in momentum_buffers(engine)]
    images, targets = zip(*(train_set[i] for i in range(2)))
    losses = engine.train_step(2, list(images), list(targets))
    assert torch.isnan(losses["loss_classifier"]) and bool(engine.skipped())
    after = dict(engine.model.named_parameters())
    assert all(torch.equal(before[k], after[k]) or torch.isnan(before[k]).all() for k in before)
    assert all(torch.equal(a, b) for a, b in zip(momenta, momentum_buffers(engine), strict=True))


def momentum_buffers(engine: TorchEngine) -> list[torch.Tensor]:
    state = engine.optimizer.state_dict()["state"].values()
    return [s["momentum_buffer"] for s in state if s.get("momentum_buffer") is not None]


@pytest.mark.parametrize("model", ["maskrcnn_resnet18_fpn", "maskrcnn_resnet50_fpn_v2"])
def test_validation_changes_no_model_state(tiny_coco, tmp_path, model):
    """BatchNorm statistics (backbone with --backbone-norm batch, the v2 heads) and the RNG stay put."""
    cfg = fast_config(tiny_coco, tmp_path, model=model, **{"backbone-norm": "batch", "min-size": 64, "max-size": 64})
    _, val_set = load_datasets(cfg)
    engine = TorchEngine(cfg, val_set.num_classes, iters_per_epoch=1)
    bn_layers = [m for m in engine.model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bn_layers, "the configuration must contain BatchNorm layers for this test to mean anything"
    state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    rng = torch.get_rng_state()
    images, targets = zip(*(val_set[i] for i in range(2)))
    losses = engine.validation_losses(list(images), list(targets))
    assert set(losses) >= {"loss_classifier", "loss_mask", "loss_objectness"}
    assert all(torch.equal(state[k], v) for k, v in engine.model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())
    assert all(m.training for m in bn_layers)  # training mode restored afterwards


@pytest.mark.slow
def test_eval_counts_its_checkpoints_step_and_records_only_where_told(four_images, tmp_path, capsys):
    out = tmp_path / "run"
    train(fast_config(four_images, out, **{"max-steps": 1}))
    capsys.readouterr()
    # fast_config's schedule (1 epoch of 2 steps) is not the evaluated checkpoint's: the count is its step
    evaluated = train(fast_config(four_images, out, resume="auto", **{"test-only": True}))
    assert "eval step 1/1 " in capsys.readouterr().out
    assert [r["kind"] for r in read_metrics(out / "metrics.jsonl")][-1] == "eval"
    # told no --output-dir (the CLI's `eval --resume RUN/checkpoints`): its AP, and nothing written
    elsewhere = tmp_path / "not-told"
    quiet = train(fast_config(four_images, elsewhere, resume=out / "checkpoints", **{"test-only": True}), record=False)
    assert quiet.eval == evaluated.eval
    assert not elsewhere.exists()
