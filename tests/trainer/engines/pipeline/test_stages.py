"""Composing the shards in one process is exactly the monolithic model: losses, gradients, detections."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from maskrcnn_launcher.contract import MODULES, validate_placement

from maskrcnn_dist.engines.pipeline.stages import MicroBatchState, StageModule, build_stages
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.modeling.rng import StepSeeder

from .pipeline_toy import NUM_CLASSES, make_batch, small_config

PLACEMENTS = [
    [["transform", "backbone"], ["rpn", "roi_heads"]],
    [["transform", "backbone"], ["rpn"], ["roi_heads"]],
]


def run_stages(stages: list[StageModule], state: MicroBatchState) -> MicroBatchState:
    """Compose stages in one process: the reference the pipeline is tested against."""
    for stage in stages:
        state = stage(state)
    return state


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(small_config().model, NUM_CLASSES)
    model.roi_heads.detections_per_img = 10  # a random model's 100 masks to paste cost seconds
    return model


def _seeded_pair(model, placement):
    reference, staged = copy.deepcopy(model), copy.deepcopy(model)
    stages = build_stages(staged, placement)
    seeders = (StepSeeder(0).at(3, 0), StepSeeder(0).at(3, 0))
    seeders[0].attach(dict(reference.named_children()))
    for stage in stages:
        seeders[1].attach(stage.parts())
    return reference, staged, stages


@pytest.mark.parametrize("placement", PLACEMENTS, ids=["2-stage", "3-stage"])
def test_train_losses_and_gradients_are_identical(model, placement) -> None:
    reference, staged, stages = _seeded_pair(model, placement)
    images, targets = make_batch(2)
    reference.train()
    for stage in stages:
        stage.train()
    expected = reference(images, targets)
    got = run_stages(stages, MicroBatchState.from_inputs(images, targets)).losses
    assert list(got) == list(expected)  # same order: the sums below add in the same order
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    sum(expected.values()).backward()
    sum(got.values()).backward()
    for (name, p), (_, q) in zip(reference.named_parameters(), staged.named_parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad, q.grad), name


@pytest.mark.parametrize("placement", PLACEMENTS[1:], ids=["3-stage"])
def test_eval_detections_are_identical(model, placement) -> None:
    reference, staged, stages = _seeded_pair(model, placement)
    images, _ = make_batch(2, seed=1)
    reference.eval()
    for stage in stages:
        stage.eval()
    with torch.no_grad():
        expected = reference(images)
        got = run_stages(stages, MicroBatchState.from_inputs(images, None)).detections
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for key in e:
            assert torch.equal(g[key], e[key]), key


def test_stage_state_dict_keys_are_the_models(model) -> None:
    stages = build_stages(model)
    keys = [k for stage in stages for k in stage.state_dict()]
    assert keys == list(model.state_dict())


@pytest.mark.parametrize(
    "bad",
    [
        [["backbone", "transform"], ["rpn", "roi_heads"]],
        [list(MODULES[:3])],
        [["transform", "rpn"], ["backbone", "roi_heads"]],
        [[], list(MODULES)],
    ],
)
def test_placement_must_be_contiguous_runs(bad) -> None:
    with pytest.raises(ValueError, match="contiguous"):
        validate_placement(bad)


def test_a_seeded_stage_pickles_and_draws_alike_after(model) -> None:
    """With TensorPipe device maps an RPC's result is pickled to find its CUDA tensors, a stage's RRef
    type query included: a stage with its reseeding hooks must pickle (a closure hook could not, seen
    on a GPU), and the copy draws what the original draws at the same position."""
    _, _, stages = _seeded_pair(model, PLACEMENTS[0])
    stage = stages[1]  # rpn + roi_heads: both hooked
    copied = pickle.loads(pickle.dumps(stage))
    draws = []
    for module in (stage.parts()["rpn"], copied.parts()["rpn"]):
        for hook in module._forward_pre_hooks.values():
            hook(module, ())
        draws.append(torch.rand(4))
    assert torch.equal(draws[0], draws[1])


def test_a_degenerate_box_is_refused_as_the_whole_model_refuses_it(model) -> None:
    """The first stage checks the micro-batch's boxes with GeneralizedRCNN's message (one host read for
    the whole micro-batch, modeling/batched/model.py), before the backbone runs."""
    images, targets = make_batch(2)
    targets[1]["boxes"][0, 2] = targets[1]["boxes"][0, 0]  # zero width
    reference, _, stages = _seeded_pair(model, PLACEMENTS[0])
    reference.train()
    with pytest.raises(ValueError, match="at index 1") as expected:
        reference(images, targets)
    stages[0].train()
    with pytest.raises(ValueError) as got:
        stages[0](MicroBatchState.from_inputs(images, targets))
    assert str(got.value) == str(expected.value)
