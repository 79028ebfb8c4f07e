"""The profile's byte counts are the pipeline's own: the same micro-batch through the default split's
first stage, counted by the transport, gives the bytes reported for the cut after `backbone`."""

from __future__ import annotations

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.engines.pipeline.stages import MicroBatchState, build_stages
from maskrcnn_dist.engines.pipeline.transport import HOST, gradient_bytes, to_wire, wire_bytes
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.profile.measure import NUM_CLASSES, measure, synthetic_batch


@pytest.mark.slow
def test_bytes_over_a_cut_are_what_the_transport_sends() -> None:
    torch.set_num_threads(2)
    cfg = apply_overrides(TrainConfig(), small_cpu_run(64, batch_size=2, micro_batches=1), "test")
    meas = measure(cfg, (64, 80), instances_per_image=2, iterations=1)
    assert [m.name for m in meas.modules] == ["transform", "backbone", "rpn", "roi_heads"]
    assert all(m.forward_s > 0 for m in meas.modules[1:]) and all(m.backward_s > 0 for m in meas.modules[1:])

    torch.manual_seed(cfg.seed)
    first, _ = build_stages(build_model(cfg.model, NUM_CLASSES).train())
    images, targets = synthetic_batch(2, (64, 80), 2, seed=cfg.seed)
    sent = to_wire(first(MicroBatchState.from_inputs(images, targets)), bf16_features=False, route=HOST)
    cut = meas.cut_after("backbone")
    assert cut.forward_bytes == wire_bytes(sent)
    assert cut.backward_bytes == gradient_bytes(sent) > 0
    # The FPN features dominate: 256 channels x 5 levels in fp32
    assert cut.forward_bytes > sum(t.numel() * 4 for t in sent.features.values()) * 0.9


@pytest.mark.slow
def test_profile_runs_on_micro_batches_of_the_data_set(tiny_coco) -> None:
    """--data-path: the passes run the training set's own micro-batches (their input bytes, not a
    synthetic batch's), and the model gets the data set's class count."""
    import json
    from statistics import mean

    from maskrcnn_dist.profile.command import real_batches

    torch.set_num_threads(2)
    flags = small_cpu_run(64, batch_size=2, micro_batches=1, data_path=tiny_coco)
    cfg = apply_overrides(TrainConfig(), flags, "test")
    real = real_batches(cfg, 2)
    batches, num_classes, what = real.batches, real.num_classes, real.what
    assert len(batches) == 2 and all(len(images) == 2 for images, _ in batches)
    categories = json.loads((tiny_coco / "train" / "annotations.json").read_text())["categories"]
    assert num_classes == len(categories) + 1 and what.startswith("2 micro-batch(es) of ")
    meas = measure(cfg, (64, 80), 2, iterations=2, batches=batches, num_classes=num_classes, data=what)
    expected = mean(wire_bytes(MicroBatchState.from_inputs(images, targets)) for images, targets in batches)
    assert meas.cut_after("input").forward_bytes == round(expected)
    assert meas.data == what


@pytest.mark.slow
def test_profile_measures_lsjs_squares() -> None:
    """With --data-augmentation lsj the profile runs the 82 px squares training runs at --min-size 64 (not
    the model's 64 x 80 resize): more bytes cross the cut after the backbone."""
    torch.set_num_threads(2)
    flags = small_cpu_run(64, batch_size=1, micro_batches=1)
    plain = measure(apply_overrides(TrainConfig(), flags, "test"), (64, 80), instances_per_image=2, iterations=1)
    lsj_cfg = apply_overrides(TrainConfig(), {**flags, "data-augmentation": "lsj"}, "test")
    lsj = measure(lsj_cfg, (64, 80), instances_per_image=2, iterations=1)
    # FPN features of the padded batch: 96 x 96 (82 rounded up to 32) against 64 x 64 (the model's resize to
    # 51 x 64, padded); 64 x 96 if the squares were not made (the synthetic 64 x 80 kept as it is).
    ratio = lsj.cut_after("backbone").forward_bytes / plain.cut_after("backbone").forward_bytes
    assert 2.0 < ratio < 2.5
