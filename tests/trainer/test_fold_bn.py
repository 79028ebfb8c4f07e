"""Frozen BatchNorm folded into its convolution (modeling/fold_bn.py): the same model, computed faster.

Folding changes where the affine map is applied, not what it is: in fp32 the folded training forward
and its gradients equal the unfolded ones to rounding (measured on this CPU: outputs within 3e-6 of
their largest value, weight gradients within 2e-6 of their norm), and eval mode computes exactly what
torchvision computes. The frozen statistics are randomised here: freshly built frozen norms are the
identity, which any fold would reproduce.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torchvision.ops.misc import FrozenBatchNorm2d

from maskrcnn_dist.config import ModelConfig
from maskrcnn_dist.modeling.fold_bn import FoldedConv2d, FoldedFrozenBatchNorm2d, fold_frozen_batchnorm
from maskrcnn_dist.modeling.model import build_model


def frozen_model(fold: bool = False, **options: object) -> torch.nn.Module:
    cfg = ModelConfig(
        name="maskrcnn_resnet18_fpn", backbone_norm="frozen", min_size=64, max_size=96, fold_frozen_bn=fold, **options
    )
    torch.manual_seed(0)
    model = build_model(cfg, num_classes=3)
    randomise_frozen_statistics(model)
    return model


def randomise_frozen_statistics(model: torch.nn.Module, seed: int = 1) -> None:
    """Give every frozen norm of `model` statistics and an affine map of its own, as pretrained ones have."""
    g = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, FrozenBatchNorm2d):
            channels = module.weight.numel()
            module.weight.copy_(torch.rand(channels, generator=g) + 0.5)
            module.running_var.copy_(torch.rand(channels, generator=g) * 1.5 + 0.5)
            module.bias.copy_(torch.randn(channels, generator=g) * 0.1)
            module.running_mean.copy_(torch.randn(channels, generator=g) * 0.1)


def backbone_pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    """(unfolded, folded) copies of one backbone with random frozen statistics, in training mode."""
    plain = frozen_model().backbone.train()
    folded = copy.deepcopy(plain)
    fold_frozen_batchnorm(folded)
    return plain, folded


def test_every_resnet_conv_and_frozen_norm_pair_folds_keeping_tensors_and_names():
    model = frozen_model()
    names = list(model.state_dict())
    params = dict(model.named_parameters())
    # ResNet-18: the stem, 8 blocks x 2 convolutions, 3 downsampling shortcuts.
    assert fold_frozen_batchnorm(model.backbone) == 1 + 8 * 2 + 3
    assert list(model.state_dict()) == names
    assert all(p is params[n] for n, p in model.named_parameters())
    assert model.backbone.body.layer2[0].downsample[0].norm is model.backbone.body.layer2[0].downsample[1]
    # A deep copy (pipeline replicas) refers to its own norms, not the original's.
    twin = copy.deepcopy(model.backbone.body)
    assert twin.conv1.norm is twin.bn1 and twin.conv1.norm is not model.backbone.body.bn1


def test_folded_training_forward_and_gradients_equal_unfolded():
    plain, folded = backbone_pair()
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    outputs = [model(x) for model in (plain, folded)]
    for key, expected in outputs[0].items():
        got = outputs[1][key]
        assert (got - expected).abs().max() <= 1e-5 * expected.abs().max(), key
    for out in outputs:
        sum(o.square().mean() for o in out.values()).backward()
    trainable = [(n, p) for n, p in plain.named_parameters() if p.requires_grad]
    assert trainable
    folded_params = dict(folded.named_parameters())
    for name, p in trainable:
        grad = folded_params[name].grad
        assert (grad - p.grad).norm() <= 1e-4 * p.grad.norm(), name


def test_eval_mode_computes_exactly_what_torchvision_computes():
    plain, folded = backbone_pair()
    plain.eval()
    folded.eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, got = plain(x), folded(x)
    assert all(torch.equal(expected[k], got[k]) for k in expected)


@pytest.mark.parametrize(
    ("options", "folds"),
    [
        ({}, True),  # on by default: it pays (docs/performance.md)
        ({"fold_frozen_bn": True}, True),
        ({"fold_frozen_bn": False}, False),  # --no-fold-frozen-bn
        ({"exportable": True}, False),  # export: torchvision's own modules
    ],
)
def test_build_model_folds_by_default_unless_turned_off_and_never_for_export(options, folds):
    flags = {k: v for k, v in options.items() if k != "exportable"}
    cfg = ModelConfig(name="maskrcnn_resnet18_fpn", backbone_norm="frozen", min_size=64, max_size=96, **flags)
    model = build_model(cfg, num_classes=3, exportable=options.get("exportable", False))
    kinds = {type(m) for m in model.modules()}
    assert (FoldedConv2d in kinds and FoldedFrozenBatchNorm2d in kinds) is folds
    assert (FrozenBatchNorm2d in kinds) is not folds


def test_nothing_folds_with_batch_statistics():
    cfg = ModelConfig(
        name="maskrcnn_resnet18_fpn", backbone_norm="batch", min_size=64, max_size=96, fold_frozen_bn=True
    )
    model = build_model(cfg, num_classes=3)
    assert not any(isinstance(m, FoldedConv2d) for m in model.modules())
