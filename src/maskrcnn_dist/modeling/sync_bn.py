"""--sync-bn: BatchNorm whose batch statistics are those of the whole ddp batch, every rank's images.

On CUDA this is torch's SyncBatchNorm (convert_sync_batchnorm, as torchvision's reference does). torch's
refuses CPU tensors, and the ddp engine runs on CPUs too (gloo): there, `AllReduceBatchNorm2d` computes
the same statistics with one all-reduce of each channel's count, sum and sum of squares, through the
differentiable all-reduce (`_SumOverRanks`: torch's own, torch.distributed.nn.functional.all_reduce,
warns of its deprecation at every call, two lines on every step of every rank), so that the gradient
flows to every rank's inputs as in torch's backward. Both keep BatchNorm2d's parameters and buffers:
checkpoints load with or without the flag.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["AllReduceBatchNorm2d", "convert_sync_batchnorm"]


class AllReduceBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d normalising by the statistics of the batch over every rank of the default group
    while training in a group of more than one process; plain BatchNorm2d otherwise."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        synced = self.training and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if not synced:
            return super().forward(input)
        x = input.float()  # statistics in fp32, as BatchNorm's kernels keep them under autocast
        channels = x.shape[1]
        count = torch.full((1,), x.numel() / channels, dtype=torch.float32, device=x.device)
        dims = [0, 2, 3]
        totals = _SumOverRanks.apply(torch.cat([x.sum(dims), (x * x).sum(dims), count]))
        n = totals[-1].clamp(min=1)
        mean = totals[:channels] / n
        var = (totals[channels : 2 * channels] / n - mean * mean).clamp(min=0)  # biased, as BatchNorm normalises
        self._track(mean.detach(), var.detach(), n.detach())
        scale = torch.rsqrt(var + self.eps)
        if self.weight is not None:
            scale = scale * self.weight
        shift = -mean * scale + (self.bias if self.bias is not None else 0)
        return (x * scale[None, :, None, None] + shift[None, :, None, None]).to(input.dtype)

    @torch.no_grad()
    def _track(self, mean: torch.Tensor, var: torch.Tensor, n: torch.Tensor) -> None:
        """Running statistics as BatchNorm2d updates them (the unbiased variance), over the whole batch."""
        if not self.track_running_stats or self.running_mean is None or self.running_var is None:
            return
        assert self.num_batches_tracked is not None
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        unbiased = var * n / (n - 1).clamp(min=1)
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)


class _SumOverRanks(torch.autograd.Function):
    """The sum of a tensor over every rank of the default group, differentiable: the gradient of each
    rank's input is the sum of every rank's output gradient (torch.distributed.nn's _AllReduce, SUM)."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total


def convert_sync_batchnorm(module: nn.Module, device: torch.device) -> nn.Module:
    """`module` with every BatchNorm2d synchronised across the default process group (on `device`'s
    kind: torch's SyncBatchNorm on CUDA, AllReduceBatchNorm2d elsewhere). FrozenBatchNorm2d is no
    BatchNorm2d and stays as it is."""
    if device.type == "cuda":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    return _swap(module, device)


def _swap(module: nn.Module, device: torch.device) -> nn.Module:
    if type(module) is nn.BatchNorm2d:
        synced = AllReduceBatchNorm2d(
            module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats
        )
        synced.load_state_dict(module.state_dict())
        if module.affine:  # the same Parameter objects: anything holding them (an optimizer) still does
            synced.weight, synced.bias = module.weight, module.bias
        return synced.to(device).train(module.training)
    for name, child in module.named_children():
        module.add_module(name, _swap(child, device))
    return module
