"""The one place that splits torchvision's GeneralizedRCNN into pipeline stages.

GeneralizedRCNN.forward is four calls in a row: transform -> backbone -> rpn -> roi_heads, then the
transform's parameter-free `postprocess` in evaluation. A stage is a contiguous run of those module
names (the placement is data, e.g. ``[["transform", "backbone"], ["rpn", "roi_heads"]]``; the pod
contract owns the order and the rule, `maskrcnn_launcher.contract.validate_placement`). What flows
from one stage to the next is a `MicroBatchState`: exactly the local variables of
GeneralizedRCNN.forward that later modules read, and nothing more.

One thing is deliberately *not* sent: the padded image batch after the backbone has consumed it.
The RPN's AnchorGenerator reads only ``image_list.tensors.shape[-2:]`` (plus the features' dtype and
device), so later stages rebuild an ImageList around a zero-size placeholder of the padded shape.

A `StageModule` holds its modules under their original attribute names, so ``stage.state_dict()`` keys are
GeneralizedRCNN's own keys: a checkpoint is the union of the stages' dicts, loadable by any engine.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from maskrcnn_launcher.contract import MODULES, validate_placement
from torch import Tensor, nn
from torchvision.models.detection.generalized_rcnn import GeneralizedRCNN
from torchvision.models.detection.image_list import ImageList

from ...modeling.batched.model import check_boxes
from ..base import as_float_image

DEFAULT_PLACEMENT = (("transform", "backbone"), ("rpn", "roi_heads"))

Placement = Sequence[Sequence[str]]
# A context manager factory a stage host passes in to serialise modules that reseed the global RNG
# (process-wide) when several replicas of a stage run in threads of one process.
RngGuard = Callable[[], contextlib.AbstractContextManager]


@dataclass
class MicroBatchState:
    """What travels between stages: the locals of GeneralizedRCNN.forward that later modules need."""

    original_image_sizes: list[tuple[int, int]]
    images: list[Tensor] | None = None  # raw images, until the transform has run
    targets: list[dict[str, Tensor]] | None = None  # raw, then resized by the transform
    padded: Tensor | None = None  # the padded batch, from the transform until the backbone
    image_sizes: list[tuple[int, int]] | None = None  # per-image size after resizing
    batch_shape: tuple[int, int] | None = None  # padded (H, W): all the anchor generator reads
    features: dict[str, Tensor] | None = None
    proposals: list[Tensor] | None = None
    losses: dict[str, Tensor] = field(default_factory=dict)
    detections: list[dict[str, Tensor]] | None = None

    @classmethod
    def from_inputs(cls, images: list[Tensor], targets: list[dict[str, Tensor]] | None) -> MicroBatchState:
        sizes = [(int(img.shape[-2]), int(img.shape[-1])) for img in images]
        return cls(original_image_sizes=sizes, images=list(images), targets=targets)

    @property
    def num_images(self) -> int:
        return len(self.original_image_sizes)


class Postprocess(nn.Module):
    """The transform's postprocess (boxes and masks back to original image sizes); no parameters."""

    def __init__(self, transform: nn.Module) -> None:
        super().__init__()
        self.transform = transform

    def forward(self, state: MicroBatchState) -> MicroBatchState:
        state.detections = self.transform.postprocess(state.detections, state.image_sizes, state.original_image_sizes)
        return state


class StageModule(nn.Module):
    """A contiguous run of GeneralizedRCNN's modules, registered under their original names."""

    def __init__(self, modules: dict[str, nn.Module], postprocess: Postprocess | None = None) -> None:
        """`modules`: a contiguous run of contract.MODULES, in order (build_stages checks the placement)."""
        super().__init__()
        self.names = tuple(modules)
        for name, module in modules.items():
            self.add_module(name, module)
        # Evaluation ends with the transform's postprocess; it lives with roi_heads, in the last stage.
        self.postprocess = postprocess
        self._runners = {
            "transform": self._transform,
            "backbone": self._backbone,
            "rpn": self._rpn,
            "roi_heads": self._roi_heads,
        }

    @property
    def is_last(self) -> bool:
        return self.names[-1] == MODULES[-1]

    def parts(self) -> dict[str, nn.Module]:
        """name -> module, as GeneralizedRCNN.named_children() would give them (for StepSeeder)."""
        return {name: getattr(self, name) for name in self.names}

    def forward(self, state: MicroBatchState, rng_guard: RngGuard = contextlib.nullcontext) -> MicroBatchState:
        for name in self.names:
            # Only the transform, RPN and RoI heads draw random numbers; the backbone runs unguarded.
            guard = rng_guard() if name != "backbone" else contextlib.nullcontext()
            with guard:
                self._runners[name](state)
        if self.is_last:
            if not self.training and self.postprocess is not None:
                self.postprocess(state)
            # Only the results leave the last stage.
            state.targets = state.features = state.proposals = None
            state.batch_shape = state.image_sizes = None
        return state

    # Each runner is the matching lines of GeneralizedRCNN.forward, reading and writing `state`.

    def _transform(self, state: MicroBatchState) -> None:
        if self.training and state.targets is None:
            raise ValueError("targets should not be None in training mode")
        # uint8 images (the training loader's, a quarter of the bytes on the wire) become float here.
        images = [as_float_image(img) for img in state.images]
        image_list, targets = self.transform(images, state.targets)
        if targets is not None:
            check_boxes(targets)  # GeneralizedRCNN's check, one host read for the micro-batch
        state.images, state.targets = None, targets
        state.padded = image_list.tensors
        state.image_sizes = list(image_list.image_sizes)
        state.batch_shape = (int(image_list.tensors.shape[-2]), int(image_list.tensors.shape[-1]))

    def _backbone(self, state: MicroBatchState) -> None:
        features = self.backbone(state.padded)
        if isinstance(features, Tensor):
            features = OrderedDict([("0", features)])
        state.features, state.padded = features, None

    def _rpn(self, state: MicroBatchState) -> None:
        proposals, losses = self.rpn(_image_list(state), state.features, state.targets)
        state.proposals = proposals
        state.losses = {**state.losses, **losses}

    def _roi_heads(self, state: MicroBatchState) -> None:
        detections, losses = self.roi_heads(state.features, state.proposals, state.image_sizes, state.targets)
        state.detections = detections
        # GeneralizedRCNN orders the dict detector losses first, then the RPN's: keep that order, so
        # that sum(losses.values()) adds in the same order and matches bitwise.
        state.losses = {**losses, **state.losses}


def _image_list(state: MicroBatchState) -> ImageList:
    """An ImageList the RPN can use: real sizes, and a zero-size placeholder of the padded batch."""
    first = next(iter(state.features.values()))
    height, width = state.batch_shape
    placeholder = first.new_empty((state.num_images, 0, height, width))
    return ImageList(placeholder, state.image_sizes)


def build_stages(
    model: GeneralizedRCNN, placement: Placement = DEFAULT_PLACEMENT, trained: bool = True
) -> list[StageModule]:
    """Split `model` into stages that share its modules (deep-copy the model first for separate copies).
    ValueError (from the contract's one placement rule) unless `placement` splits MODULES in order;
    `trained=False` also allows a stage without parameters (the profiler times each module alone)."""
    stages = validate_placement(placement, trained)
    return [
        StageModule(
            {name: getattr(model, name) for name in names},
            Postprocess(model.transform) if names[-1] == MODULES[-1] else None,
        )
        for names in stages
    ]
