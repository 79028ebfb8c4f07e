"""The kit's model with batched heads is torchvision's model: the same state-dict keys, the same
detections in evaluation, the same proposals, and on a fixed sampled set (the samplers told to take
every candidate) the same training losses and gradients, in both row layouts, with an image that has
no objects in the batch. Only the random draw of the samplers differs from torchvision's."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torchvision.models.detection import maskrcnn_resnet50_fpn
from torchvision.models.detection.roi_heads import RoIHeads
from torchvision.models.detection.rpn import RegionProposalNetwork

from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.engines.base import as_float_image
from maskrcnn_dist.modeling.batched.boxes import is_real
from maskrcnn_dist.modeling.batched.roi_heads import BatchedRoIHeads
from maskrcnn_dist.modeling.batched.rpn import BatchedRPN
from maskrcnn_dist.modeling.model import build_model, builder_kwargs
from maskrcnn_dist.modeling.rng import StepSeeder

from ..conftest import fast_config

TAKE_ALL = 10**9  # a sampler batch so large that every candidate is sampled: no random draw left


@pytest.fixture(scope="module")
def batch(tiny_coco, tmp_path_factory):
    """Three training images, the last one stripped of its objects, and the run's config."""
    cfg = fast_config(tiny_coco, tmp_path_factory.mktemp("batched_model"))
    train_set, _ = load_datasets(cfg)
    images, targets = zip(*(train_set[i] for i in range(3)))
    targets = [dict(t) for t in targets]
    targets[2] = {**targets[2], "boxes": targets[2]["boxes"][:0], "labels": targets[2]["labels"][:0]}
    targets[2]["masks"] = targets[2]["masks"][:0]
    return cfg, train_set.num_classes, [as_float_image(i) for i in images], targets


def models(cfg, num_classes: int, name: str | None = None):
    """The torchvision form and the batched form of the kit's model (or of model `name`), with the same
    weights; 40 proposals an image (the heads then compute every candidate's row in a few seconds)."""
    torch.manual_seed(0)
    settings = replace(cfg.model, name=name or cfg.model.name)
    reference = build_model(replace(settings, heads="torchvision"), num_classes)
    batched = build_model(replace(settings, heads="batched"), num_classes)
    batched.load_state_dict(reference.state_dict())
    for model in (reference, batched):
        model.rpn._post_nms_top_n = {"training": 40, "testing": 40}
    return reference, batched


def test_the_modules_and_the_state_are_torchvisions(batch) -> None:
    cfg, num_classes, _, _ = batch
    reference, batched = models(cfg, num_classes)
    assert isinstance(batched.rpn, BatchedRPN) and isinstance(batched.roi_heads, BatchedRoIHeads)
    assert type(reference.rpn) is RegionProposalNetwork and type(reference.roi_heads) is RoIHeads
    assert list(batched.state_dict()) == list(reference.state_dict())
    assert copy.deepcopy(batched).rpn.__class__ is BatchedRPN  # the pipeline's replicas are deep copies


def test_evaluation_detections_are_torchvisions(batch) -> None:
    cfg, num_classes, images, _ = batch
    reference, batched = models(cfg, num_classes)
    with torch.no_grad():
        expected = reference.eval()(images)
        ours = batched.eval()(images)
    for e, o in zip(expected, ours, strict=True):
        assert e.keys() == o.keys()
        for key in e:
            assert torch.equal(e[key], o[key]), key


def test_the_rpn_proposes_what_torchvision_proposes(batch) -> None:
    cfg, num_classes, images, targets = batch
    reference, batched = models(cfg, num_classes)
    proposals = []
    for model in (reference, batched):
        model.train()
        image_list, resized = model.transform([i.clone() for i in images], copy.deepcopy(targets))
        with torch.no_grad():
            features = model.backbone(image_list.tensors)
            proposals.append(model.rpn(image_list, features, resized)[0])
    for expected, ours in zip(*proposals, strict=True):
        assert torch.equal(ours[is_real(ours)], expected)


# R50-FPN v2's box and mask heads hold BatchNorm: compact rows give it torchvision's batch.
@pytest.mark.parametrize(
    "name,rows",
    [
        ("maskrcnn_resnet18_fpn", "compact"),
        ("maskrcnn_resnet18_fpn", "padded"),
        ("maskrcnn_resnet50_fpn_v2", "compact"),
    ],
)
def test_losses_and_gradients_on_a_fixed_sample_are_torchvisions(batch, name: str, rows: str) -> None:
    cfg, num_classes, images, targets = batch
    reference, batched = models(cfg, num_classes, name)
    batched.roi_heads.rows = rows
    losses = []
    for model in (reference, batched):
        model.rpn.fg_bg_sampler.batch_size_per_image = TAKE_ALL
        model.roi_heads.fg_bg_sampler.batch_size_per_image = TAKE_ALL
        model.train()
        terms = model([i.clone() for i in images], copy.deepcopy(targets))
        sum(terms.values()).backward()
        losses.append(terms)
    expected, ours = losses
    assert list(ours) == list(expected)  # the same terms in the same order: their sum adds alike
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], rtol=2e-6, atol=1e-7)
    # Each parameter's gradient as a whole: the backbone's BatchNorm (batch statistics) turns the
    # losses' float rounding into relative differences of single elements well above it.
    gradients = dict(reference.named_parameters())
    for name, parameter in batched.named_parameters():
        expected_grad = gradients[name].grad
        assert (parameter.grad is None) == (expected_grad is None), name
        if expected_grad is not None:
            difference = (parameter.grad - expected_grad).norm() / expected_grad.norm().clamp(min=1e-12)
            assert difference < 1e-4, (name, float(difference))


def test_the_samplers_draw_the_same_at_the_same_step(batch) -> None:
    """Under the kit's step seeding (rng.StepSeeder) a step's samples are a function of its position: the
    same step draws the same losses again, another step draws others."""
    cfg, num_classes, images, targets = batch
    _, model = models(cfg, num_classes)
    seeder = StepSeeder(cfg.seed)
    seeder.attach(dict(model.named_children()))
    model.train()

    def losses_at(step: int) -> dict[str, float]:
        seeder.at(step)
        with torch.no_grad():
            return {k: float(v) for k, v in model([i.clone() for i in images], copy.deepcopy(targets)).items()}

    first = losses_at(3)
    assert losses_at(3) == first
    assert losses_at(4) != first


@pytest.mark.parametrize("heads", ["batched", "torchvision"])
def test_a_training_step_samples_the_rois_it_is_told_to(batch, heads: str) -> None:
    """--box-batch-size-per-image reaches both heads' sampler: the box head sees that many rows an image
    (there are more candidates than that), the mask head at most a quarter of them; without it, the
    small model's 128. A checkpoint's torchvision record carries it, and torchvision's builder takes it."""
    cfg, num_classes, images, targets = batch
    rows: dict[int | None, list[int]] = {}
    for asked in (None, 8):
        torch.manual_seed(0)  # the same proposals both times, whatever ran before in this process
        model = build_model(replace(cfg.model, heads=heads, box_batch_size_per_image=asked), num_classes)
        seen = rows.setdefault(asked, [])
        model.roi_heads.box_head.register_forward_hook(lambda _m, _a, out, seen=seen: seen.append(out.shape[0]))
        model.roi_heads.mask_head.register_forward_hook(lambda _m, _a, out, seen=seen: seen.append(out.shape[0]))
        model.train()
        with torch.no_grad():
            model([i.clone() for i in images], copy.deepcopy(targets))
    assert rows[None][0] == 3 * 128 and rows[8][0] == 3 * 8, rows
    if heads == "torchvision":  # the positives themselves: at most a quarter of 8 an image (one has no object)
        assert 0 < rows[8][1] <= 2 * 2, rows
    else:  # the batched mask head takes padded rows, a quarter of those sampled an image
        assert rows[8][1] < rows[None][1], rows
    kwargs = builder_kwargs(replace(cfg.model, name="maskrcnn_resnet50_fpn", box_batch_size_per_image=8), 3)
    assert kwargs["box_batch_size_per_image"] == 8
    unset = replace(cfg.model, name="maskrcnn_resnet50_fpn", box_batch_size_per_image=None)
    assert "box_batch_size_per_image" not in builder_kwargs(unset, 3)
    built = maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, **kwargs)
    assert built.roi_heads.fg_bg_sampler.batch_size_per_image == 8


def test_evaluation_keeps_the_detections_it_is_told_to(batch) -> None:
    """--detections-per-image caps what inference keeps an image, the best scores: of a random model's many
    low-score boxes (90 or more) 4 when told, the same best four, and a checkpoint's torchvision record
    carries it to torchvision's builder."""
    cfg, num_classes, images, _ = batch
    kept = {}
    for asked in (None, 4):
        torch.manual_seed(0)
        model = build_model(replace(cfg.model, detections_per_image=asked), num_classes).eval()
        with torch.no_grad():
            kept[asked] = model([i.clone() for i in images[:2]])
    for own, capped in zip(kept[None], kept[4], strict=True):
        assert len(own["scores"]) > 4 and len(capped["scores"]) == 4, (len(own["scores"]), len(capped["scores"]))
        torch.testing.assert_close(capped["scores"], own["scores"][:4])
        torch.testing.assert_close(capped["masks"], own["masks"][:4])
    kwargs = builder_kwargs(replace(cfg.model, name="maskrcnn_resnet50_fpn", detections_per_image=4), 3)
    assert maskrcnn_resnet50_fpn(weights=None, weights_backbone=None, **kwargs).roi_heads.detections_per_img == 4
    unset = replace(cfg.model, name="maskrcnn_resnet50_fpn", detections_per_image=None)
    assert "box_detections_per_img" not in builder_kwargs(unset, 3)
