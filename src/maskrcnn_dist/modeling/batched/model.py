"""The model's parts outside the heads that a batched training step changes: Mask R-CNN's forward,
which checks the targets' boxes once for the batch (torchvision reads once per image), and a
transform that builds no tensor from Python values on the device (each such copy is a host wait on a
GPU) and draws no training size when there is only one to draw.

`use_batched_heads` installs them with the batched RPN and RoI heads by changing the classes of the
model's own modules (as fold_bn.py does): the same objects, parameters, hooks and state-dict keys;
only the training forwards differ, evaluation runs torchvision's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torchvision.models.detection import MaskRCNN
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork
from torchvision.models.detection.transform import (
    GeneralizedRCNNTransform,
    _resize_image_and_masks,
    resize_keypoints,
)

from .roi_heads import BatchedRoIHeads
from .rpn import BatchedRPN


def check_boxes(targets: list[dict[str, Tensor]]) -> None:
    """Every box has a positive width and height (GeneralizedRCNN's check and message); one host read."""
    boxes = [t["boxes"] for t in targets]
    if not boxes or not bool((torch.cat(boxes)[:, 2:] <= torch.cat(boxes)[:, :2]).any()):
        return
    for index, b in enumerate(boxes):  # only when one is degenerate: find it for the message
        degenerate = (b[:, 2:] <= b[:, :2]).any(dim=1)
        if degenerate.any():
            raise ValueError(
                "All bounding boxes should have positive height and width. Found invalid box "
                f"{b[degenerate][0].tolist()} for target at index {index}."
            )


# Where a model keeps backbone graphs captured on fixed canvases (modeling/canvas.py, GPU only):
# (batch, height, width) -> the graphed backbone.
GRAPHED_BACKBONES = "_graphed_backbones"


def run_backbone(model: nn.Module, images: Tensor) -> Any:
    """The backbone's features; a captured graph replays them where the padded batch has its shape (in a
    training step only: validation runs without gradients, its BatchNorm in eval mode)."""
    graphed = model.__dict__.get(GRAPHED_BACKBONES, {}).get((images.shape[0], *images.shape[-2:]))
    if graphed is None or not torch.is_grad_enabled():
        return model.backbone(images)
    return graphed(images)


class BatchedMaskRCNN(MaskRCNN):
    """MaskRCNN whose training forward checks the batch's boxes with one read; otherwise
    GeneralizedRCNN.forward's lines, calling the (batched) transform, RPN and RoI heads."""

    def forward(self, images: list[Tensor], targets: list[dict[str, Tensor]] | None = None) -> Any:
        if not self.training:
            return super().forward(images, targets)
        if targets is None:
            raise ValueError("targets should not be None when in training mode")
        for target in targets:
            boxes = target["boxes"]
            if not isinstance(boxes, Tensor):
                raise ValueError(f"Expected target boxes to be of type Tensor, got {type(boxes)}.")
            if boxes.dim() != 2 or boxes.shape[-1] != 4:
                raise ValueError(f"Expected target boxes to be a tensor of shape [N, 4], got {boxes.shape}.")
        image_list, targets = self.transform(images, targets)
        check_boxes(targets)
        features = run_backbone(self, image_list.tensors)
        if isinstance(features, Tensor):
            features = {"0": features}
        proposals, proposal_losses = self.rpn(image_list, features, targets)
        _, detector_losses = self.roi_heads(features, proposals, image_list.image_sizes, targets)
        return {**detector_losses, **proposal_losses}


class BatchedTransform(GeneralizedRCNNTransform):
    """GeneralizedRCNNTransform with the same sizes and values: the normalisation constants made once
    per device and dtype, the boxes' resize ratios computed on the host (in float32, as torchvision
    computes them on the device), and no random draw when the training size has one choice."""

    def torch_choice(self, k: list[int]) -> int:
        return k[0] if len(k) == 1 else super().torch_choice(k)

    def normalize(self, image: Tensor) -> Tensor:
        if not image.is_floating_point():
            return super().normalize(image)  # its error message
        constants = self.__dict__.setdefault("_constants", {})
        key = (image.device, image.dtype)
        if key not in constants:
            mean = torch.as_tensor(self.image_mean, dtype=image.dtype, device=image.device)
            std = torch.as_tensor(self.image_std, dtype=image.dtype, device=image.device)
            constants[key] = (mean[:, None, None], std[:, None, None])
        mean, std = constants[key]
        return (image - mean) / std

    def resize(self, image: Tensor, target: dict[str, Tensor] | None = None) -> tuple[Tensor, dict[str, Tensor] | None]:
        if not self.training or target is None or self._skip_resize:
            return super().resize(image, target)
        h, w = image.shape[-2:]
        image, target = _resize_image_and_masks(
            image, self.torch_choice(self.min_size), self.max_size, target, self.fixed_size
        )
        ratio_h, ratio_w = (
            torch.tensor(new, dtype=torch.float32) / torch.tensor(old, dtype=torch.float32)
            for new, old in zip(image.shape[-2:], (h, w))
        )
        # 0-d CPU tensors act as scalars in a device op: the products torchvision's resize_boxes makes.
        x1, y1, x2, y2 = target["boxes"].unbind(1)
        target["boxes"] = torch.stack((x1 * ratio_w, y1 * ratio_h, x2 * ratio_w, y2 * ratio_h), dim=1)
        if "keypoints" in target:
            target["keypoints"] = resize_keypoints(target["keypoints"], (h, w), image.shape[-2:])
        return image, target


# Each torchvision class and the batched class it becomes; modules of any other class are left alone.
BATCHED = (
    ("", MaskRCNN, BatchedMaskRCNN),
    ("transform", GeneralizedRCNNTransform, BatchedTransform),
    ("rpn", RegionProposalNetwork, BatchedRPN),
    ("roi_heads", RoIHeads, BatchedRoIHeads),
)


def use_batched_heads(model: nn.Module) -> list[str]:
    """Give the model (a MaskRCNN, or a pipeline stage holding some of its modules) the batched training
    forwards; returns the names of the modules changed. No state is added or removed."""
    changed = []
    for name, torchvision_class, batched_class in BATCHED:
        module = model.get_submodule(name) if name else model
        if type(module) is torchvision_class:
            module.__class__ = batched_class
            changed.append(name or "model")
    return changed
