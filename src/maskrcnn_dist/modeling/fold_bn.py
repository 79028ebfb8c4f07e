"""Frozen BatchNorm folded into the convolution before it, for the training step.

A FrozenBatchNorm2d (torchvision's, the backbone's norm when fine-tuning from pretrained weights)
is a fixed per-channel affine map: y = x * scale + shift, with scale = weight / sqrt(running_var + eps)
and shift = bias - running_mean * scale. After a convolution W (bias-free in ResNet) that is the
convolution with weights W * scale and bias shift. Computed that way, a step no longer reads and
writes every activation twice more forward (the multiply, the add; under autocast in fp32, since the
buffers are fp32) and once more backward: the folded weight is recomputed from W at every training
forward (W may be trainable; the product is weight-sized, not activation-sized), and its gradient
flows back to W through that product.

Only the training step folds: in eval mode both modules compute exactly what torchvision's do, so
evaluation, prediction and export see torchvision's numbers. Parameters and buffers stay where they
were (the same tensors under the same names): state dicts, checkpoints and optimizers are unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from torchvision.ops.misc import FrozenBatchNorm2d

__all__ = ["FoldedConv2d", "FoldedFrozenBatchNorm2d", "fold_frozen_batchnorm", "frozen_affine"]


def frozen_affine(norm: FrozenBatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) per channel: the frozen norm is x * scale + shift (torchvision's own formula)."""
    scale = norm.weight * (norm.running_var + norm.eps).rsqrt()
    return scale, norm.bias - norm.running_mean * scale


class FoldedFrozenBatchNorm2d(FrozenBatchNorm2d):
    """A FrozenBatchNorm2d whose work the preceding FoldedConv2d does in training mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.training else super().forward(x)


class FoldedConv2d(nn.Conv2d):
    """A Conv2d that, in training mode, also applies the FrozenBatchNorm2d after it (`norm`).

    `norm` is referred to, not registered: it stays its parent's child under its own name (a registered
    second path would duplicate its buffers in state dicts)."""

    norm: FoldedFrozenBatchNorm2d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        scale, shift = frozen_affine(self.norm)
        weight = self.weight * scale.reshape(-1, 1, 1, 1)
        bias = shift if self.bias is None else self.bias * scale + shift
        return self._conv_forward(x, weight, bias)


def _pairs(module: nn.Module) -> Iterator[tuple[nn.Module, str, str]]:
    """(parent, convolution's name, norm's name) of each Conv2d directly followed by a FrozenBatchNorm2d:
    torchvision's ResNet blocks and stem (`convK` then `bnK`) and its Sequentials (a downsample's conv, bn)."""
    for parent in module.modules():
        children = dict(parent.named_children())
        if isinstance(parent, nn.Sequential):
            names = list(children)
            candidates = zip(names, names[1:])
        else:
            candidates = ((n, "bn" + n[len("conv") :]) for n in children if n.startswith("conv"))
        for conv, norm in candidates:
            if type(children.get(conv)) is nn.Conv2d and type(children.get(norm)) is FrozenBatchNorm2d:
                yield parent, conv, norm


def fold_frozen_batchnorm(module: nn.Module) -> int:
    """Make every Conv2d + FrozenBatchNorm2d pair in `module` fold in training mode; returns how many.
    The modules are swapped for their folding kinds, keeping the very same parameters and buffers."""
    pairs = list(_pairs(module))
    for parent, conv_name, norm_name in pairs:
        conv, norm = getattr(parent, conv_name), getattr(parent, norm_name)
        conv.__class__ = FoldedConv2d  # same object: its parameters, hooks and optimizer entries stay
        norm.__class__ = FoldedFrozenBatchNorm2d
        object.__setattr__(conv, "norm", norm)  # not nn.Module.__setattr__: no second registration
    return len(pairs)
