"""The sparse-matrix RoIAlign computes torchvision's RoIAlign: outputs and feature gradients agree to
float rounding (measured: <= 4e-7 absolute on unit-variance features; gradients often bitwise), on
one level and through the multi-scale pooler, in NCHW and channels_last, and under bf16 autocast."""

from __future__ import annotations

import copy

import pytest
import torch
from torchvision.ops import MultiScaleRoIAlign, roi_align

from maskrcnn_dist.config import ModelConfig
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.modeling.perf import set_flush_denormal
from maskrcnn_dist.modeling.roi_align import (
    SparseMultiScaleRoIAlign,
    sampling_matrix,
    sparse_roi_align,
    transpose_csr,
    use_sparse_roi_align,
)

# Hand-picked RoIs (image, x1, y1, x2, y2) on a 17 x 13 map at scale 1: the whole map, one poking out
# top-left, one past the bottom-right edge, a sub-pixel one, one at the far corner, a zero-size one,
# and one entirely outside (its samples lie beyond one pixel of the map: it pools zeros).
EDGE_ROIS = [
    [0, 0, 0, 16, 12],
    [1, -5, -5, 3, 3],
    [0, 10, 8, 70, 60],
    [1, 2.3, 4.1, 2.4, 4.2],
    [0, 15.5, 11.5, 16.9, 12.9],
    [1, 0, 0, 0, 0],
    [0, 40, 40, 60, 60],
]


def random_rois(count: int, images: int, width: float, height: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(count, 2, generator=g) * torch.tensor([width, height])
    wh = torch.rand(count, 2, generator=g) * torch.tensor([width, height]) / 2 + 0.1
    image = torch.randint(0, images, (count, 1), generator=g).float()
    return torch.cat([image, xy, torch.minimum(xy + wh, torch.tensor([width, height]))], dim=1)


def both(features: torch.Tensor, rois: torch.Tensor, size: tuple[int, int], scale: float, ratio: int):
    """Outputs and feature gradients of torchvision's kernel and of the sparse one, same upstream grad."""
    ours_in = features.detach().clone().requires_grad_()
    ref_in = features.detach().clone().contiguous().requires_grad_()
    ours = sparse_roi_align(ours_in, rois, size, scale, ratio)
    ref = roi_align(ref_in, rois, size, scale, ratio)
    upstream = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    ours.backward(upstream)
    ref.backward(upstream)
    return ours, ref, ours_in.grad, ref_in.grad


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("scale,ratio,size", [(1.0, 2, (3, 4)), (0.5, 1, (2, 2)), (1.0, 3, (7, 7))])
def test_edge_rois_match_torchvision(memory_format, scale, ratio, size) -> None:
    features = torch.randn(2, 8, 13, 17, generator=torch.Generator().manual_seed(0))
    features = features.contiguous(memory_format=memory_format)
    ours, ref, grad, ref_grad = both(features, torch.tensor(EDGE_ROIS), size, scale, ratio)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-5)
    assert torch.count_nonzero(ours[-1]) == 0  # the RoI outside the map pools nothing


# Boxes whose samples fall exactly on the bounds of torchvision's inside test (-1 <= coord <= size):
# at 2 x 2 bins with one sample per bin, [-2, -2, 2, 2] samples at -1 and 1; [16, 12, 20, 16] on the
# 17 x 13 map samples at x = 17 = width and y = 13 = height. Those samples count, clamped to the edge.
BORDER_ROIS = [[0, -2, -2, 2, 2], [1, 16, 12, 20, 16], [0, -2, 3, 2, 7]]


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_samples_on_the_border_at_minus_one_and_at_the_size_match_torchvision(memory_format) -> None:
    features = torch.randn(2, 8, 13, 17, generator=torch.Generator().manual_seed(4))
    features = features.contiguous(memory_format=memory_format)
    ours, ref, grad, ref_grad = both(features, torch.tensor(BORDER_ROIS, dtype=torch.float32), (2, 2), 1.0, 1)
    # The bins whose one sample lies on a bound pool the edge pixel: not zero.
    assert torch.count_nonzero(ref[0, :, 0, 0]) == ref.shape[1] and torch.count_nonzero(ref[1, :, 0, 0])
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-5)


def test_many_random_rois_on_a_large_map_match_torchvision() -> None:
    features = torch.randn(2, 32, 50, 68, generator=torch.Generator().manual_seed(2))
    rois = random_rois(300, 2, width=272, height=200, seed=3)
    ours, ref, grad, ref_grad = both(features.contiguous(memory_format=torch.channels_last), rois, (7, 7), 0.25, 2)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-4)


def test_the_transpose_the_backward_uses_is_the_matrix_transposed() -> None:
    matrix = sampling_matrix(torch.tensor(EDGE_ROIS), (2, 13, 17), (3, 4), 1.0, 2)
    assert matrix.shape == (len(EDGE_ROIS) * 12, 2 * 13 * 17)
    torch.testing.assert_close(transpose_csr(matrix).to_dense(), matrix.to_dense().t(), rtol=0, atol=0)


def test_evaluation_pools_without_building_the_backward() -> None:
    features = torch.randn(2, 8, 13, 17, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pooled = sparse_roi_align(features, torch.tensor(EDGE_ROIS), (7, 7), 1.0, 2)
    assert pooled.grad_fn is None
    torch.testing.assert_close(pooled, roi_align(features, torch.tensor(EDGE_ROIS), (7, 7), 1.0, 2), rtol=0, atol=1e-5)


def test_no_rois_gives_an_empty_result() -> None:
    features = torch.randn(1, 4, 8, 8, requires_grad=True)
    pooled = sparse_roi_align(features, torch.zeros(0, 5), (2, 2), 1.0, 2)
    assert pooled.shape == (0, 4, 2, 2)
    pooled.sum().backward()
    assert torch.count_nonzero(features.grad) == 0


def test_adaptive_sampling_ratio_is_refused() -> None:
    with pytest.raises(ValueError, match="sampling_ratio"):
        sparse_roi_align(torch.randn(1, 4, 8, 8), torch.tensor([[0.0, 0, 0, 4, 4]]), (2, 2), 1.0, 0)


IMAGE_SHAPES = [(512, 640), (490, 600)]


def pyramid(channels: int, seed: int) -> dict[str, torch.Tensor]:
    """FPN-like maps for two images batched to 512 x 640 (strides 4 to 32), channels_last like the
    backbone's. Large images, so that the level mapper uses every level (level 5 takes boxes of
    more than 448 px a side)."""
    g = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(2, channels, 512 // s, 640 // s, generator=g).contiguous(memory_format=torch.channels_last)
        for name, s in (("0", 4), ("1", 8), ("2", 16), ("3", 32))
    }


def pool_both(features: dict[str, torch.Tensor], boxes: list[torch.Tensor], size: int, dtype: torch.dtype | None):
    image_shapes = IMAGE_SHAPES
    sparse = SparseMultiScaleRoIAlign(["0", "1", "2", "3"], size, 2)
    reference = MultiScaleRoIAlign(["0", "1", "2", "3"], size, 2)
    results = []
    for pooler in (sparse, reference):
        leaves = {k: v.detach().clone().requires_grad_() for k, v in features.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            inputs = {k: v.to(dtype) if dtype else v for k, v in leaves.items()}
            pooled = pooler(inputs, boxes, image_shapes)
        pooled.float().square().sum().backward()
        results.append((pooled, [leaves[k].grad for k in sorted(leaves)]))
    return results


def boxes_on_every_level() -> list[torch.Tensor]:
    """Small and large boxes, so that the level mapper sends some to every FPN level."""
    g = torch.Generator().manual_seed(5)
    per_image = []
    for height, width in IMAGE_SHAPES:
        side = torch.logspace(0.7, 2.68, 40).unsqueeze(1).repeat(1, 2)  # 5 to 480 px
        xy = torch.rand(40, 2, generator=g) * (torch.tensor([width, height]) - side).clamp(min=0)
        per_image.append(torch.cat([xy, torch.minimum(xy + side, torch.tensor([width, height]))], dim=1))
    return per_image


def test_multiscale_pooler_matches_torchvision_on_every_level() -> None:
    features, boxes = pyramid(16, seed=4), boxes_on_every_level()
    levels = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    levels(features, boxes, IMAGE_SHAPES)
    assert set(levels.map_levels(boxes).tolist()) == {0, 1, 2, 3}
    (ours, grads), (ref, ref_grads) = pool_both(features, boxes, 7, dtype=None)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=0, atol=1e-4)


def test_eval_mode_pools_with_torchvisions_kernel_to_the_bit() -> None:
    """Evaluation and predict give torchvision's own numbers (the plain-torchvision snippet's); the
    sparse product, which adds in another order, is for training."""
    features, boxes = pyramid(16, seed=4), boxes_on_every_level()
    sparse = SparseMultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    reference = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    with torch.no_grad():
        expected = reference(features, boxes, IMAGE_SHAPES)
        assert torch.equal(sparse.eval()(features, boxes, IMAGE_SHAPES), expected)
        trained = sparse.train()(features, boxes, IMAGE_SHAPES)
    assert not torch.equal(trained, expected)  # the sparse kind did run in training mode
    torch.testing.assert_close(trained, expected, rtol=0, atol=1e-5)


def test_bf16_features_pool_in_fp32_and_return_bf16_like_torchvisions_autocast_kernel() -> None:
    features, boxes = pyramid(16, seed=6), boxes_on_every_level()
    (ours, grads), (ref, ref_grads) = pool_both(features, boxes, 14, dtype=torch.bfloat16)
    assert ours.dtype == ref.dtype == torch.bfloat16
    # Both pool the same bf16 values in fp32 and round the result once: at most one bf16 ulp apart.
    torch.testing.assert_close(ours.float(), ref.float(), rtol=2**-7, atol=1e-6)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=2**-7, atol=1e-3)


def test_model_uses_sparse_poolers_and_computes_torchvisions_losses() -> None:
    set_flush_denormal(True)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="maskrcnn_resnet18_fpn", min_size=128, max_size=128), num_classes=3)
    assert isinstance(model.roi_heads.box_roi_pool, SparseMultiScaleRoIAlign)
    assert isinstance(model.roi_heads.mask_roi_pool, SparseMultiScaleRoIAlign)
    reference = copy.deepcopy(model)
    reference.roi_heads.box_roi_pool = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    reference.roi_heads.mask_roi_pool = MultiScaleRoIAlign(["0", "1", "2", "3"], 14, 2)
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert use_sparse_roi_align(model.roi_heads) == []  # already swapped: nothing to do

    images = [torch.rand(3, 128, 128, generator=torch.Generator().manual_seed(i)) for i in range(2)]
    masks = torch.zeros(2, 128, 128, dtype=torch.uint8)
    masks[0, 10:60, 20:90] = 1
    masks[1, 70:120, 30:70] = 1
    target = {
        "boxes": torch.tensor([[20.0, 10, 90, 60], [30, 70, 70, 120]]),
        "labels": torch.tensor([1, 2]),
        "masks": masks,
    }
    results = []
    for m in (model, reference):
        m.train()
        torch.manual_seed(1)  # the same proposal sampling in both
        loss = m(images, [target, target])
        sum(loss.values()).backward()
        results.append((loss, {n: p.grad for n, p in m.named_parameters() if p.grad is not None}))
    (ours, grads), (ref, ref_grads) = results
    for key in ref:
        torch.testing.assert_close(ours[key], ref[key], rtol=1e-4, atol=1e-6)
    # From scratch, BatchNorm's backward amplifies rounding: merely reordering the convolutions' sums
    # (channels_last vs contiguous) moves a parameter's gradient by up to 1.5e-3 of its norm; the
    # sparse pooler moves it by at most 5e-4 (measured). A wrong weight anywhere would be ~1e-1.
    assert grads.keys() == ref_grads.keys()
    for name, ref_grad in ref_grads.items():
        assert (grads[name] - ref_grad).norm() <= 5e-3 * ref_grad.norm(), name
