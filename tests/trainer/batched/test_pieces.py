"""Each deterministic piece of the batched heads equals torchvision's on the same inputs: the matcher's
labels (low-quality matches included, images without objects too), the box coder's targets and boxes,
the pooled features of every level (both pooling paths, padding rows ignored), and the mask targets."""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
from torchvision.models.detection._utils import BoxCoder, Matcher
from torchvision.models.detection.roi_heads import project_masks_on_boxes
from torchvision.ops import MultiScaleRoIAlign, box_iou

from maskrcnn_dist.modeling.batched.boxes import decode, encode, pad_rows
from maskrcnn_dist.modeling.batched.mask_targets import project_masks
from maskrcnn_dist.modeling.batched.matcher import match, quality_matrix
from maskrcnn_dist.modeling.batched.pooler import pool


def grid_boxes(g: torch.Generator, count: int, extent: int) -> torch.Tensor:
    """Boxes with corners on a coarse integer grid: many equal IoUs (ties for the low-quality rule)."""
    corner = torch.randint(0, extent - 4, (count, 2), generator=g)
    side = torch.randint(2, extent // 2, (count, 2), generator=g)
    return torch.cat((corner, (corner + side).clamp(max=extent)), dim=1).float()


@pytest.mark.parametrize("low_quality", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_matches_are_torchvisions(low_quality: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    matcher = Matcher(0.7, 0.3, allow_low_quality_matches=low_quality)
    counts = [int(torch.randint(1, 6, (), generator=g)) for _ in range(3)] + [0]  # the last has no objects
    gt = [grid_boxes(g, n, 32) for n in counts]
    predictions = torch.stack([grid_boxes(g, 200, 32) for _ in counts])
    gt_boxes = pad_rows(gt, 0.0, max(counts))
    gt_valid = pad_rows([torch.ones(n, dtype=torch.bool) for n in counts], False, max(counts))
    ours = match(matcher, quality_matrix(gt_boxes, gt_valid, predictions), gt_valid)
    for image, boxes in enumerate(gt):
        if boxes.numel():
            expected = matcher(box_iou(boxes, predictions[image]))
        else:  # torchvision labels an image without objects all background, never calling the matcher
            expected = torch.full((200,), Matcher.BELOW_LOW_THRESHOLD)
        assert torch.equal(ours[image], expected)


def test_box_coding_is_torchvisions_to_the_bit() -> None:
    g = torch.Generator().manual_seed(0)
    references, proposals = grid_boxes(g, 500, 300) + 0.37, grid_boxes(g, 500, 300) * 1.01
    deltas = torch.randn(500, 8, generator=g)
    for weights in ((1.0, 1.0, 1.0, 1.0), (10.0, 10.0, 5.0, 5.0)):
        coder = BoxCoder(weights)
        assert torch.equal(encode(references, proposals, weights), coder.encode_single(references, proposals))
        assert torch.equal(decode(deltas, proposals, weights), coder.decode_single(deltas, proposals))


def feature_maps(g: torch.Generator, images: int, channels: int) -> OrderedDict:
    return OrderedDict(
        (str(level), torch.randn(images, channels, 64 >> level, 80 >> level, generator=g)) for level in range(4)
    )


@pytest.mark.parametrize("sparse", [True, False])
def test_pooled_features_are_torchvisions_on_every_level(sparse: bool) -> None:
    g = torch.Generator().manual_seed(0)
    features = feature_maps(g, 3, 8)
    image_shapes = [(256, 320), (240, 300), (256, 280)]
    per_image = [grid_boxes(g, 40, 256) * torch.tensor([1.2, 1.0, 1.2, 1.0]) for _ in image_shapes]
    for boxes in per_image:  # some large enough for the coarsest level, some tiny for the finest
        boxes[:4, 2:] = boxes[:4, :2] + 180
        boxes[4:8, 2:] = boxes[4:8, :2] + 3
    reference = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2)
    expected = reference(features, per_image, image_shapes)
    boxes = torch.cat(per_image)
    images = torch.arange(3).repeat_interleave(40)
    real = torch.rand(boxes.shape[0], generator=g) > 0.1
    ours = pool(MultiScaleRoIAlign(["0", "1", "2", "3"], 7, 2), features, boxes, images, real, image_shapes, sparse)
    torch.testing.assert_close(ours[real], expected[real], rtol=0, atol=1e-5)
    assert torch.isfinite(ours).all()  # the padding rows pooled something harmless


def test_mask_targets_are_torchvisions() -> None:
    """Masks of different sizes per image; proposals anywhere inside their image, to its very edge."""
    g = torch.Generator().manual_seed(0)
    sizes, counts = [(50, 70), (64, 48), (40, 40)], [3, 5, 2]
    masks = [(torch.rand(n, h, w, generator=g) > 0.5).to(torch.uint8) for (h, w), n in zip(sizes, counts)]
    boxes, images, matched, expected = [], [], [], []
    for image, ((h, w), n) in enumerate(zip(sizes, counts)):
        corner = torch.rand(12, 2, generator=g) * torch.tensor([w - 1.0, h - 1.0])
        far = corner + 1 + torch.rand(12, 2, generator=g) * torch.tensor([w, h])
        box = torch.cat((corner, torch.minimum(far, torch.tensor([float(w), float(h)]))), dim=1)
        box[0] = torch.tensor([0.0, 0.0, w, h])
        which = torch.randint(0, n, (12,), generator=g)
        expected.append(project_masks_on_boxes(masks[image], box, which, 28))
        boxes.append(box), images.append(torch.full((12,), image)), matched.append(which)
    ours = project_masks(masks, torch.cat(boxes), torch.cat(images), torch.cat(matched), 28)
    torch.testing.assert_close(ours, torch.cat(expected), rtol=0, atol=1e-6)
