"""Checkpoints are atomic and pruned; weight files load only when they fit, with clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from maskrcnn_dist import checkpoint
from maskrcnn_dist.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint
from maskrcnn_dist.config import ModelConfig, OptimConfig
from maskrcnn_dist.errors import CheckpointError, WeightsError
from maskrcnn_dist.modeling.model import build_model, torchvision_weights_hint
from maskrcnn_dist.modeling.optim import lr_factor

SMALL = ModelConfig(name="maskrcnn_resnet18_fpn", min_size=64, max_size=64)


def test_keeps_newest_k_and_loads_with_weights_only(tmp_path: Path):
    for step in (1, 2, 3, 4):
        save_checkpoint({"model": {"w": torch.full((2,), float(step))}, "step": step}, tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint_00000003.pt", "checkpoint_00000004.pt"]
    assert load_checkpoint(tmp_path)["model"]["w"][0] == 4.0


def test_a_failed_write_leaves_no_partial_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    save_checkpoint({"model": {}, "step": 1}, tmp_path, 1, keep=3)

    def crash(obj, handle):  # the process dies half-way through writing
        handle.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*checkpoint_00000002\.pt: disk full"):
        save_checkpoint({"model": {}, "step": 2}, tmp_path, 2, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_00000001.pt"]


def test_a_full_volume_is_named_and_the_checkpoints_written_stay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real ENOSPC (writes to /dev/full fail with it), which torch reports behind its own RuntimeError
    ("unexpected pos ..."), as CI saw on a full disk: the error says the volume is full, names the
    checkpoint, and the one already written loads."""
    save_checkpoint({"model": {"w": torch.ones(2)}, "step": 1}, tmp_path, 1, keep=3)
    real_open = open
    monkeypatch.setattr(checkpoint, "open", lambda path, mode: real_open("/dev/full", mode), raising=False)
    state = {"model": {"w": torch.zeros(1 << 20)}, "step": 2}
    with pytest.raises(CheckpointError) as failure:
        save_checkpoint(state, tmp_path, 2, keep=3)
    message = str(failure.value)
    assert message.startswith(f"cannot write checkpoint {tmp_path / 'checkpoint_00000002.pt'}: its volume is full")
    assert "--keep-checkpoints" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_00000001.pt"]
    monkeypatch.undo()
    assert load_checkpoint(tmp_path)["step"] == 1


def test_unreadable_or_foreign_checkpoints_are_clear_errors(tmp_path: Path):
    (tmp_path / "garbage.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="garbage.pt is not a PyTorch file"):
        load_checkpoint(tmp_path / "garbage.pt")
    torch.save({"format_version": 1, "model": {"w": torch.zeros(1000)}}, tmp_path / "whole.pt")
    (tmp_path / "torn.pt").write_bytes((tmp_path / "whole.pt").read_bytes()[:600])  # a zip cut short
    with pytest.raises(CheckpointError, match="torn.pt cannot be read"):
        load_checkpoint(tmp_path / "torn.pt")
    torch.save({"something": 1}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="foreign.pt is not a maskrcnn-dist checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        load_checkpoint(tmp_path)


def test_weights_from_a_file_with_another_class_count(tmp_path: Path):
    torch.manual_seed(0)
    donor = build_model(SMALL, num_classes=6)
    torch.save({"model": donor.state_dict()}, tmp_path / "donor.pt")  # checkpoint-style dict accepted
    cfg = ModelConfig(name=SMALL.name, min_size=64, max_size=64, weights=tmp_path / "donor.pt")
    model = build_model(cfg, num_classes=3)
    assert torch.equal(model.backbone.body.conv1.weight, donor.backbone.body.conv1.weight)
    assert model.roi_heads.box_predictor.cls_score.out_features == 3


def test_missing_and_mismatched_weight_files(tmp_path: Path):
    with pytest.raises(WeightsError, match="nothing.pt does not exist"):
        build_model(ModelConfig(name=SMALL.name, weights=tmp_path / "nothing.pt"), num_classes=3)
    torch.save({"conv.weight": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(WeightsError, match=r"other.pt does not fit the model: missing: .*unexpected: conv.weight"):
        build_model(ModelConfig(name=SMALL.name, weights=tmp_path / "other.pt"), num_classes=3)
    r50 = build_model(ModelConfig(name="maskrcnn_resnet50_fpn", min_size=64, max_size=64), num_classes=3)
    torch.save(r50.state_dict(), tmp_path / "r50.pt")
    with pytest.raises(WeightsError, match="r50.pt does not fit the model: shape mismatch"):
        build_model(ModelConfig(name=SMALL.name, weights=tmp_path / "r50.pt"), num_classes=3)


def test_a_torchvision_weights_name_says_which_file_to_fetch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`--weights DEFAULT` as torchvision's builders take it: the kit downloads nothing, so the error says
    which file those weights are, and where torch's own download cache already holds it."""
    r50, r18 = ModelConfig(name="maskrcnn_resnet50_fpn"), ModelConfig(name="maskrcnn_resnet18_fpn")
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    for name in ("DEFAULT", "COCO_V1", "MaskRCNN_ResNet50_FPN_Weights.COCO_V1"):
        hint = torchvision_weights_hint(name, r50, backbone=False)
        assert "MaskRCNN_ResNet50_FPN_Weights.COCO_V1" in hint and "maskrcnn_resnet50_fpn_coco-bf2d0c1e.pth" in hint
        assert "cache" not in hint
    assert "resnet18-f37072fd.pth" in torchvision_weights_hint("IMAGENET1K_V1", r18, backbone=True)
    assert "not weights of maskrcnn_resnet50_fpn" in torchvision_weights_hint("ResNet50_Weights.DEFAULT", r50, False)
    for name, cfg in (("DEFAULT", r18), ("COCO_V9", r50), ("Foo.bar", r50), ("model.pth", r50)):
        assert torchvision_weights_hint(name, cfg, backbone=False) is None
    cached = tmp_path / "checkpoints" / "resnet50-11ad3fa6.pth"
    cached.parent.mkdir()
    cached.write_bytes(b"")
    assert str(cached) in torchvision_weights_hint("DEFAULT", r50, backbone=True)


def test_schedule_warms_up_linearly_then_steps_down():
    cfg = OptimConfig(lr=0.1, warmup_iters=10, warmup_factor=0.001, lr_steps=(2, 3), lr_gamma=0.1)
    assert lr_factor(0, cfg, iters_per_epoch=10, total_steps=40) == pytest.approx(0.001)
    assert lr_factor(5, cfg, iters_per_epoch=10, total_steps=40) == pytest.approx(0.5005)
    assert lr_factor(10, cfg, iters_per_epoch=10, total_steps=40) == 1.0
    assert lr_factor(19, cfg, iters_per_epoch=10, total_steps=40) == 1.0
    assert lr_factor(20, cfg, iters_per_epoch=10, total_steps=40) == pytest.approx(0.1)
    assert lr_factor(30, cfg, iters_per_epoch=10, total_steps=40) == pytest.approx(0.01)


@pytest.mark.parametrize("name", ["maskrcnn_resnet18_fpn", "maskrcnn_resnet50_fpn"])
def test_trainable_backbone_layers_freeze_the_early_stages(name: str):
    model = build_model(ModelConfig(name=name, min_size=64, max_size=64, trainable_backbone_layers=2), num_classes=3)
    trainable = {n.split(".")[0] for n, p in model.backbone.body.named_parameters() if p.requires_grad}
    assert trainable == {"layer3", "layer4"}
