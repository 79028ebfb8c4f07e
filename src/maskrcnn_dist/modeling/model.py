"""Build torchvision's Mask R-CNN variants. Pretrained weights come only from local files."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import nn
from torchvision.models import get_model_weights, get_weight, resnet18
from torchvision.models.detection import MaskRCNN, maskrcnn_resnet50_fpn, maskrcnn_resnet50_fpn_v2
from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops import misc as misc_nn_ops

from ..checkpoint import read_torch_file
from ..config import ModelConfig
from ..errors import WeightsError
from .batched import use_batched_heads
from .exact_resize import use_exact_resize
from .fold_bn import fold_frozen_batchnorm
from .perf import keep_head_outputs_fp32, to_channels_last
from .roi_align import use_sparse_roi_align

log = logging.getLogger(__name__)

# Layers whose shape depends on the number of classes: a COCO-pretrained file fits everything else.
CLASS_DEPENDENT_PREFIXES = ("roi_heads.box_predictor.", "roi_heads.mask_predictor.mask_fcn_logits.")
CLASS_SCORE_WEIGHT = "roi_heads.box_predictor.cls_score.weight"  # [num_classes, features]


# The small variant also samples fewer proposals: at 128 px the box and mask heads, not the trunk,
# dominate a step, and a few dozen objects per image need nowhere near 2000 proposals.
SMALL_VARIANT_SAMPLING = dict(
    rpn_pre_nms_top_n_train=300,
    rpn_post_nms_top_n_train=150,
    rpn_pre_nms_top_n_test=150,
    rpn_post_nms_top_n_test=100,
    box_batch_size_per_image=128,
)


def _norm_layer(cfg: ModelConfig) -> type[nn.Module]:
    return misc_nn_ops.FrozenBatchNorm2d if cfg.resolved_backbone_norm() == "frozen" else nn.BatchNorm2d


def _trainable_layers(cfg: ModelConfig) -> int:
    if cfg.trainable_backbone_layers is not None:
        return cfg.trainable_backbone_layers
    # torchvision: 3 trainable stages when starting from pretrained weights, all 5 from scratch.
    return 3 if (cfg.weights or cfg.weights_backbone) else 5


def state_num_classes(state: dict[str, torch.Tensor]) -> int | None:
    """Classes (background included) a Mask R-CNN state dict was trained for; None without a box predictor."""
    weight = state.get(CLASS_SCORE_WEIGHT)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


def read_state_dict(path: Path, what: str) -> dict[str, torch.Tensor]:
    if not Path(path).is_file():
        raise WeightsError(f"{what} file {path} does not exist (weights are never downloaded; give a local file)")
    state = read_torch_file(path, what, WeightsError)
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]  # a maskrcnn-dist or torchvision-reference checkpoint
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightsError(f"{what} file {path} does not hold a state dict of tensors")
    return state


def _load_into(
    module: nn.Module, state: dict[str, torch.Tensor], path: Path, what: str, skippable: tuple[str, ...] = ()
) -> None:
    """Load strictly, except class-dependent layers whose shape differs (the usual fine-tuning case)."""
    own = module.state_dict()
    mismatched = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    skipped = [k for k in mismatched if k.startswith(skippable)]
    fatal = [k for k in mismatched if k not in skipped]
    missing = [k for k in own if k not in state and k not in skipped]
    # FrozenBatchNorm2d drops num_batches_tracked on load: files from BatchNorm models still fit.
    unexpected = [k for k in state if k not in own and not k.endswith("num_batches_tracked")]
    if fatal or missing or unexpected:

        def head(keys: list[str]) -> str:
            return ", ".join(keys[:5]) + (f" (+{len(keys) - 5} more)" if len(keys) > 5 else "")

        details = [
            f"{label}: {head(keys)}"
            for label, keys in (("shape mismatch", fatal), ("missing", missing), ("unexpected", unexpected))
            if keys
        ]
        raise WeightsError(f"{what} file {path} does not fit the model: " + "; ".join(details))
    module.load_state_dict({k: v for k, v in state.items() if k not in skipped}, strict=False)
    if skipped:
        log.info("%s: re-initialised %d class-dependent tensors (different number of classes)", path, len(skipped))


def _load_file(module: nn.Module, path: Path, what: str, skippable: tuple[str, ...]) -> None:
    _load_into(module, read_state_dict(path, what), path, what, skippable=skippable)


# torchvision's architecture whose ImageNet weights --weights-backbone takes, per model.
BACKBONE_ARCHITECTURES = {
    "maskrcnn_resnet50_fpn": "resnet50",
    "maskrcnn_resnet50_fpn_v2": "resnet50",
    "maskrcnn_resnet18_fpn": "resnet18",
}


def torchvision_weights_hint(name: str, cfg: ModelConfig, backbone: bool) -> str | None:
    """Where `name`, given to --weights (`backbone`: --weights-backbone) and not a file, names torchvision's
    weights as its builders take them (`DEFAULT`, `COCO_V1`, `MaskRCNN_ResNet50_FPN_Weights.COCO_V1`):
    how to get that file, since the kit downloads nothing at run time. None for any other name."""
    architecture = BACKBONE_ARCHITECTURES[cfg.name] if backbone else cfg.name
    try:
        expected = get_model_weights(architecture)
    except ValueError:  # the kit's own maskrcnn_resnet18_fpn: torchvision has no weights for it
        expected = None
    if "." not in name and expected is None:
        return None
    try:
        weights = get_weight(name) if "." in name else expected[name]
    except (ValueError, KeyError, AttributeError):
        return None
    if type(weights) is not expected:
        return f"it names torchvision's {weights}, which are not weights of {architecture}"
    hint = (
        f"it names torchvision's {weights}, and the kit downloads nothing at run time: fetch "
        f"{weights.url} once (curl -LO ...) and pass the file"
    )
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    return f"{hint}; torch's download cache holds it already: {cached}" if cached.is_file() else hint


def builder_kwargs(cfg: ModelConfig, num_classes: int) -> dict[str, int]:
    """Every keyword argument of torchvision's MaskRCNN that `build_model` sets for these settings: a
    checkpoint records them (modeling/trained.py), so that torchvision alone rebuilds the same model."""
    kwargs = dict(num_classes=num_classes, min_size=cfg.min_size, max_size=cfg.max_size)
    if cfg.name == "maskrcnn_resnet18_fpn":
        kwargs.update(SMALL_VARIANT_SAMPLING)
    if cfg.box_batch_size_per_image is not None:
        kwargs["box_batch_size_per_image"] = cfg.box_batch_size_per_image
    if cfg.detections_per_image is not None:
        kwargs["box_detections_per_img"] = cfg.detections_per_image
    return kwargs


def build_model(
    cfg: ModelConfig, num_classes: int, exportable: bool = False, keep_data_sizes: bool = False
) -> MaskRCNN:
    """Mask R-CNN for `num_classes` (background included), randomly initialised or from local files.
    `exportable`: torchvision's own modules only, for TorchScript and ONNX (outputs/export): none of the
    speed-ups below (the state dict is the same either way).
    `keep_data_sizes`: training images keep the size the data augmentation gave them (DataConfig.sized_by_data):
    torchvision's `_skip_resize`, as its references set it for multiscale and lsj; evaluation still resizes."""
    common = builder_kwargs(cfg, num_classes)
    layers = _trainable_layers(cfg)
    if cfg.name == "maskrcnn_resnet18_fpn":
        # The small CPU-test variant: same heads, ResNet-18 trunk (4x fewer FLOPs than R50).
        trunk = resnet18(weights=None, norm_layer=_norm_layer(cfg))
        if cfg.weights_backbone:
            _load_file(trunk, cfg.weights_backbone, "backbone weights", skippable=("fc.",))
        model = MaskRCNN(_resnet_fpn_extractor(trunk, layers), **common)
    else:
        builder = maskrcnn_resnet50_fpn if cfg.name == "maskrcnn_resnet50_fpn" else maskrcnn_resnet50_fpn_v2
        # torchvision only honours trainable_backbone_layers when it downloads weights itself.
        model = builder(weights=None, weights_backbone=None, **common)
        if _norm_layer(cfg) is misc_nn_ops.FrozenBatchNorm2d:
            _freeze_backbone_batchnorm(model)
        _freeze_backbone_layers(model, layers)
        if cfg.weights_backbone:
            _load_file(model.backbone.body, cfg.weights_backbone, "backbone weights", skippable=("fc.",))
    if cfg.weights:
        _load_file(model, cfg.weights, "weights", skippable=CLASS_DEPENDENT_PREFIXES)
    if keep_data_sizes:
        model.transform._skip_resize = True
    if exportable:
        # The sparse RoIAlign is an autograd Function scripting cannot compile and ONNX has no op for; the
        # fp32 hooks matter only under autocast; the exported formats keep no memory layout. The resize
        # must be the eager one to the pixel (exact_resize.py).
        use_exact_resize(model)
        return model
    # Both are part of the model, not of an engine, so that every engine (and every pipeline stage,
    # which builds its part from this function) computes the same thing.
    keep_head_outputs_fp32(model)
    # torchvision's CPU RoIAlign is single-threaded and scalar: ~15% of an R50 step (roi_align.py).
    use_sparse_roi_align(model.roi_heads)
    if cfg.heads == "batched":
        use_batched_heads(model)  # training forwards only: no parameter, key or eval result changes
    if cfg.channels_last:
        to_channels_last(model)
    if cfg.fold_frozen_bn:
        fold_frozen_batchnorm(model.backbone)  # training steps only: eval mode computes as torchvision does
    return model


def _freeze_backbone_batchnorm(model: MaskRCNN) -> None:
    """torchvision builds R50 with BatchNorm2d when no weights are downloaded; swap in the frozen kind."""
    for parent in model.backbone.body.modules():
        for attr, child in list(parent.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(parent, attr, misc_nn_ops.FrozenBatchNorm2d(child.num_features, eps=child.eps))


def _freeze_backbone_layers(model: MaskRCNN, trainable: int) -> None:
    """torchvision's rule: the last `trainable` ResNet stages learn, the rest are frozen."""
    prefixes = ["layer4", "layer3", "layer2", "layer1", "conv1"][:trainable]
    if trainable == 5:
        prefixes.append("bn1")
    for name, parameter in model.backbone.body.named_parameters():
        parameter.requires_grad_(any(name.startswith(p) for p in prefixes))


def set_batchnorm_eval(model: nn.Module) -> list[nn.Module]:
    """Put every BatchNorm in eval mode (use, never update, running stats); return those that were training."""
    switched = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training]
    for m in switched:
        m.eval()
    return switched


@contextlib.contextmanager
def side_effect_free_losses(model: nn.Module, cuda_devices: Sequence[torch.device] = ()) -> Iterator[None]:
    """Run `model` (or a stage of it) for training-mode losses that change nothing.

    torchvision returns losses only in training mode, but the validation loss must not move BatchNorm's
    running statistics, build an autograd graph, or consume the global RNG (the training run after it
    must draw the same numbers as without it): BatchNorm uses, never updates, its statistics, no
    gradient is recorded, and the generators of the CPU and of `cuda_devices` are restored after."""
    model.train()
    switched = set_batchnorm_eval(model)
    # Validation images are not augmented: the model resizes them, as in evaluation, even where the
    # training augmentation sizes the training images itself (`_skip_resize`).
    transforms = [m for m in model.modules() if isinstance(m, GeneralizedRCNNTransform) and m._skip_resize]
    for transform in transforms:
        transform._skip_resize = False
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=list(cuda_devices)):
            yield
    finally:
        for module in switched:
            module.train()
        for transform in transforms:
            transform._skip_resize = True
