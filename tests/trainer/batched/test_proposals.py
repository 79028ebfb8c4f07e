"""The batched NMS and proposal filter keep torchvision's boxes: per image and level the same kept set
as torchvision.ops.nms, and per image the same proposals in the same order as
RegionProposalNetwork.filter_proposals, through both of batched_nms's paths, with small and
low-scoring boxes, tied scores, images of different sizes and chains of boxes that suppress each other."""

from __future__ import annotations

import pytest
import torch
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.rpn import RegionProposalNetwork, RPNHead
from torchvision.ops import nms
from torchvision.ops.boxes import _batched_nms_coordinate_trick

from maskrcnn_dist.modeling.batched import proposals as proposals_module
from maskrcnn_dist.modeling.batched.boxes import is_real
from maskrcnn_dist.modeling.batched.nms import Settling, batched_nms_mask
from maskrcnn_dist.modeling.batched.proposals import ProposalFilter, level_shifted, select_proposals


def random_boxes(g: torch.Generator, shape: tuple[int, ...], extent: float, largest: float) -> torch.Tensor:
    """Boxes (..., 4) with centres over [-10%, 110%] of `extent` and sides up to `largest`."""
    centre = torch.rand(*shape, 2, generator=g) * extent * 1.2 - extent * 0.1
    half = (torch.rand(*shape, 2, generator=g) * largest + 0.2) / 2
    return torch.cat((centre - half, centre + half), dim=-1)


@pytest.mark.parametrize("seed", range(6))
def test_each_group_keeps_what_torchvision_nms_keeps(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    groups, n = 5, 160
    boxes = random_boxes(g, (groups, n), 100.0, 40.0)
    scores = torch.rand(groups, n, generator=g)
    if seed % 2:
        scores = (scores * 8).round() / 8  # many ties
    valid = torch.rand(groups, n, generator=g) > 0.2
    kept = batched_nms_mask(boxes, scores, valid, 0.5)
    for group in range(groups):
        candidates = valid[group].nonzero()[:, 0]
        expected = candidates[nms(boxes[group, candidates], scores[group, candidates], 0.5)]
        assert set(kept[group].nonzero()[:, 0].tolist()) == set(expected.tolist())


def test_a_long_chain_of_suppressions_is_followed_to_its_end() -> None:
    """Boxes shifted one pixel at a time with falling scores: each suppresses the next, so greedy keeps
    every other one; the fixed point needs ~n steps, far beyond the first check."""
    n = 40
    x = torch.arange(n, dtype=torch.float32)
    boxes = torch.stack((x, torch.zeros(n), x + 10, torch.full((n,), 10.0)), dim=1)[None]
    scores = torch.linspace(1, 0, n)[None]
    settling = Settling(steps=4)
    kept = batched_nms_mask(boxes, scores, torch.ones(1, n, dtype=torch.bool), 0.7, settling)
    expected = nms(boxes[0], scores[0], 0.7)
    assert sorted(kept[0].nonzero()[:, 0].tolist()) == sorted(expected.tolist()) == list(range(0, n, 2))
    assert settling.steps >= n // 2  # remembered: the next call checks only after as many steps


def test_each_image_is_shifted_apart_by_level_as_torchvision_shifts_it(monkeypatch) -> None:
    """The boxes the NMS sees: per image, its valid boxes moved by level x (their largest coordinate + 1),
    as batched_nms's coordinate trick moves them (the NMS then rounds as torchvision's does). The images'
    largest coordinates differ (one image's offset on another is a wrong shift); an image with more
    coordinates than the trick's limit is left as it is (batched_nms then runs one NMS per level)."""
    seen = []
    monkeypatch.setattr("torchvision.ops.boxes.nms", lambda boxes, scores, t: seen.append(boxes) or scores.argsort())
    g = torch.Generator().manual_seed(0)
    batch, levels = 4, torch.tensor([0] * 30 + [1] * 20 + [2] * 10)
    boxes = (
        random_boxes(g, (batch, len(levels)), 100.0, 40.0).clamp(min=0)
        * torch.tensor([1.0, 0.5, 2.0, 0.25])[:, None, None]
    )
    valid = torch.rand(batch, len(levels), generator=g) > 0.3
    valid[3] = False  # no box at all
    ours = level_shifted(boxes, valid, levels)
    for image in range(batch - 1):
        _batched_nms_coordinate_trick(
            boxes[image][valid[image]], torch.rand(int(valid[image].sum())), levels[valid[image]], 0.7
        )
        torch.testing.assert_close(ours[image][valid[image]], seen.pop(), rtol=0, atol=0)
    monkeypatch.setitem(proposals_module.COORDINATE_TRICK_LIMIT, "cpu", 4 * 20)
    crowded = valid.sum(1) > 20
    assert crowded.sum() == 3 and torch.equal(level_shifted(boxes, valid, levels)[crowded], boxes[crowded])


def torchvision_rpn(settings: ProposalFilter) -> RegionProposalNetwork:
    anchors = AnchorGenerator(((32,), (64,), (128,)), ((0.5, 1.0, 2.0),) * 3)
    top = {"training": settings.pre_nms_top_n, "testing": settings.pre_nms_top_n}
    keep = {"training": settings.post_nms_top_n, "testing": settings.post_nms_top_n}
    rpn = RegionProposalNetwork(
        anchors, RPNHead(8, 3), 0.7, 0.3, 256, 0.5, top, keep, settings.nms_thresh, settings.score_thresh
    )
    rpn.min_size = settings.min_size
    return rpn.train()


# (levels' anchors, pre-NMS top-n, post-NMS top-n, min size, score threshold, tied scores, where the
# boxes lie, their largest side): the third keeps more than 1000 boxes in an image, which torchvision's
# batched_nms suppresses level by level on the CPU (its other path: the levels shifted apart, one NMS);
# that path orders its kept boxes with an unstable sort: among tied scores its order is an accident of
# the sort, which no other code can follow. The last crowds boxes about the size limit together: a box
# too small to keep must not suppress its neighbours.
CASES = [
    ((400, 150, 40), 120, 70, 1e-3, 0.0, False, 128.0, 60.0),
    ((400, 150, 40), 120, 70, 1e-3, 0.0, True, 128.0, 60.0),
    ((1800, 900, 300), 1000, 300, 1e-3, 0.0, False, 128.0, 60.0),
    ((400, 150, 40), 150, 200, 6.0, 0.35, True, 128.0, 60.0),
    ((400, 150, 40), 150, 100, 4.0, 0.0, False, 24.0, 8.0),
]


@pytest.mark.parametrize("levels,pre,post,min_size,score,tied,extent,largest", CASES)
@pytest.mark.parametrize("seed", range(3))
def test_each_image_gets_torchvisions_proposals_in_order(
    levels, pre, post, min_size, score, tied, extent, largest, seed
) -> None:
    g = torch.Generator().manual_seed(seed)
    batch, total = 4, sum(levels)
    boxes = random_boxes(g, (batch, total), extent, largest)
    logits = torch.randn(batch, total, generator=g) * 2
    if tied:
        logits = (logits * 2).round() / 2
    sizes = [(128, 128 - 16 * i) for i in range(batch)]
    settings = ProposalFilter(pre, post, 0.7, score, min_size)
    expected, _ = torchvision_rpn(settings).filter_proposals(boxes.clone(), logits.clone(), sizes, list(levels))
    ours = select_proposals(boxes, logits, sizes, list(levels), settings)
    assert ours.shape == (batch, min(post, sum(min(pre, n) for n in levels)), 4)
    for image in range(batch):
        real = is_real(ours[image])
        assert not real[real.sum() :].any()  # proposals first, padding after
        torch.testing.assert_close(ours[image][real], expected[image], rtol=0, atol=0)
