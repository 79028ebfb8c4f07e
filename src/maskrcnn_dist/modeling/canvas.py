"""Fixed image canvases per orientation, and the backbone + FPN replayed as CUDA graphs on them
(MLPerf's Mask R-CNN). Prepared for a GPU and measured there only (make gpu-check's
`kit_amp_bf16_graph`): never a default without a GPU figure.

Canvases. torchvision pads a batch to its largest image, rounded up to 32 pixels: every batch has a
shape of its own. With canvases, a batch is padded to the smallest canvas of its orientation that
holds it (`CanvasTransform`), so the backbone sees a few shapes only. More padding: the backbone
computes more, and its batch statistics and the features near the right and bottom edges change
(torchvision's pad is zeros too, but a narrower one): a training run is not torchvision's to the bit.

Graphs. For each canvas and batch size the backbone's forward and backward are captured once as CUDA
graphs (torch.cuda.make_graphed_callables, under autocast without its weight cache, as it requires);
a training step whose padded batch has a captured shape replays them (one launch each way instead of
hundreds; batched/model.py's run_backbone), any other shape runs eagerly. The capture's warm-up steps
leave the model's buffers (the BatchNorm statistics) as they were.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import Tensor, nn

from .batched.model import GRAPHED_BACKBONES, BatchedTransform

Canvas = tuple[int, int]  # (height, width)


def default_canvases(min_size: int, max_size: int, divisible: int = 32) -> tuple[Canvas, Canvas]:
    """A landscape and a portrait canvas that hold any image the model's resize can give."""

    def up(side: int) -> int:
        return -(-side // divisible) * divisible

    return (up(min_size), up(max_size)), (up(max_size), up(min_size))


def canvas_for(height: int, width: int, canvases: tuple[Canvas, ...]) -> Canvas | None:
    """The smallest canvas of the batch's orientation (any, for a square) that holds it; None if none."""
    fitting = [c for c in canvases if c[0] >= height and c[1] >= width]
    same = [c for c in fitting if (c[0] <= c[1]) == (height <= width)]
    return min(same or fitting, key=lambda c: c[0] * c[1], default=None)


class CanvasTransform(BatchedTransform):
    """BatchedTransform that pads each training batch to a canvas (`canvases`), when one holds it."""

    canvases: tuple[Canvas, ...] = ()

    def batch_images(self, images: list[Tensor], size_divisible: int = 32) -> Tensor:
        batched = super().batch_images(images, size_divisible)
        canvas = canvas_for(batched.shape[-2], batched.shape[-1], self.canvases) if self.training else None
        if canvas is None or tuple(batched.shape[-2:]) == canvas:
            return batched
        padded = batched.new_zeros((*batched.shape[:-2], *canvas))
        padded[..., : batched.shape[-2], : batched.shape[-1]].copy_(batched)
        return padded


def use_fixed_canvases(model: nn.Module, canvases: tuple[Canvas, ...]) -> None:
    """Pad the model's training batches to `canvases` (the model's transform must be the batched one)."""
    if type(model.transform) is BatchedTransform:
        model.transform.__class__ = CanvasTransform
    if not isinstance(model.transform, CanvasTransform):
        raise TypeError(f"fixed canvases need the batched heads' transform, not {type(model.transform).__name__}")
    model.transform.canvases = tuple(canvases)


class _Trunk(nn.Module):
    """The backbone as a callable of one tensor (what a graph captures), outside the model's tree."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone

    def forward(self, images: Tensor) -> OrderedDict[str, Tensor]:
        return self.backbone(images)


def capture_backbone(model: nn.Module, batch: int, amp_dtype: torch.dtype | None, warmup: int = 3) -> list[Canvas]:
    """Capture the backbone's forward and backward for `batch` images on each of the model's canvases
    (use_fixed_canvases first), on the model's CUDA device; returns the canvases captured."""
    parameter = next(model.backbone.parameters())
    if parameter.device.type != "cuda":
        raise RuntimeError("CUDA graphs need the model on a GPU")
    memory_format = torch.channels_last if parameter.is_contiguous(memory_format=torch.channels_last) else None
    saved = {name: b.clone() for name, b in model.backbone.named_buffers()}
    graphs = model.__dict__.setdefault(GRAPHED_BACKBONES, {})
    for height, width in model.transform.canvases:
        sample = torch.zeros(batch, 3, height, width, device=parameter.device)
        if memory_format is not None:
            sample = sample.contiguous(memory_format=memory_format)
        with torch.autocast(
            "cuda", dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None, cache_enabled=False
        ):
            graphs[(batch, height, width)] = torch.cuda.make_graphed_callables(
                _Trunk(model.backbone), (sample,), num_warmup_iters=warmup
            )
    with torch.no_grad():
        for name, b in model.backbone.named_buffers():
            b.copy_(saved[name])
    return list(model.transform.canvases)
