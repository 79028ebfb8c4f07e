"""Fixed canvases (modeling/canvas.py, measured on a GPU only): a training batch is padded to the smallest
canvas of its orientation that holds it, evaluation is not, and the graph capture refuses a CPU model.
The CUDA graphs themselves run only in `make gpu-check` (kit_amp_bf16_graph)."""

from __future__ import annotations

import pytest
import torch

from maskrcnn_dist.config import ModelConfig
from maskrcnn_dist.modeling.canvas import (
    CanvasTransform,
    canvas_for,
    capture_backbone,
    default_canvases,
    use_fixed_canvases,
)
from maskrcnn_dist.modeling.model import build_model


def test_a_batch_takes_the_smallest_canvas_of_its_orientation() -> None:
    canvases = default_canvases(800, 1333)
    assert canvases == ((800, 1344), (1344, 800))
    assert canvas_for(800, 1088, canvases) == (800, 1344)
    assert canvas_for(1088, 800, canvases) == (1344, 800)
    assert canvas_for(800, 800, canvases) in canvases  # a square fits either
    assert canvas_for(900, 1400, canvases) is None  # nothing holds it: padded as torchvision pads


def test_training_batches_are_padded_to_a_canvas_and_evaluation_is_not() -> None:
    model = build_model(ModelConfig(name="maskrcnn_resnet18_fpn", min_size=64, max_size=96), 3)
    assert type(model.transform) is not CanvasTransform  # never a default: a GPU figure first
    use_fixed_canvases(model, default_canvases(64, 96))
    # Square images: torchvision pads the batch to 64 x 64, the canvas of a square is the landscape one.
    images = [torch.rand(3, 40, 40), torch.rand(3, 44, 44)]
    targets = [
        {"boxes": torch.tensor([[1.0, 2, 20, 30]]), "labels": torch.tensor([1]), "masks": torch.zeros(1, *i.shape[1:])}
        for i in images
    ]
    model.train()
    padded, resized = model.transform(images, targets)
    assert padded.tensors.shape[-2:] == (64, 96)
    assert padded.image_sizes == [(64, 64), (64, 64)]  # the images themselves are torchvision's
    assert padded.tensors[..., :, 64:].abs().sum() == 0  # the canvas beyond the images is zero
    assert padded.tensors[..., :, :64].abs().sum() > 0
    losses = model(images, targets)  # a training step runs on the canvas (eagerly: no graph on a CPU)
    assert all(torch.isfinite(v) for v in losses.values())
    model.eval()
    assert model.transform(images)[0].tensors.shape[-2:] == (64, 64)
    with pytest.raises(RuntimeError, match="need the model on a GPU"):
        capture_backbone(model, 2, None)


def test_fixed_canvases_need_the_batched_transform() -> None:
    model = build_model(ModelConfig(name="maskrcnn_resnet18_fpn", min_size=64, max_size=96, heads="torchvision"), 3)
    with pytest.raises(TypeError, match="batched heads' transform"):
        use_fixed_canvases(model, default_canvases(64, 96))
