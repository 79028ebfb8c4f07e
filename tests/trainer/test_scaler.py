"""fp16's GradScaler, exercised on the CPU (`GradScaler("cpu")`; the command line refuses fp16 there, a
library caller gets it): its state in the checkpoint, an overflowing step that changes neither weights
nor momenta, gradients unscaled before they are clipped, and a resume that carries the scale on.

fp16 has no fast CPU kernels (the heads' convolutions and matrix products dominate a step): one image a
step, 32 RoIs an image, and one first fp16 step (`first_step`) shared by the tests that start after it."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.modeling import perf

from .conftest import FEWER_ROIS, first_steps


def fp16_config(data: Path, out: Path, **flags: object) -> TrainConfig:
    """The tests' small CPU run under fp16 autocast, built without the command line's fp16 refusal."""
    torch.set_num_threads(2)
    values = small_cpu_run(64, data_path=data, output_dir=out, batch_size=1, workers=0, lr=0.005)
    values |= {"amp": True, "amp-dtype": "float16", "aspect-ratio-group-factor": -1, **FEWER_ROIS, **flags}
    return apply_overrides(TrainConfig(), values, "test")


@pytest.fixture(scope="module")
def batches(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory):
    cfg = fp16_config(tiny_coco, tmp_path_factory.mktemp("data"))
    train_set, _ = load_datasets(cfg)
    return train_set.num_classes, first_steps(train_set, 1, 2)


def engine_for(cfg: TrainConfig, num_classes: int) -> TorchEngine:
    return TorchEngine(cfg, num_classes, iters_per_epoch=10)


def momenta(engine: TorchEngine) -> list[torch.Tensor]:
    state = engine.optimizer.state_dict()["state"]
    return [v["momentum_buffer"].clone() for v in state.values() if v.get("momentum_buffer") is not None]


@pytest.fixture(scope="module")
def first_step(tiny_coco, tmp_path_factory, batches):
    """An fp16 engine after its first step (the test of a resume goes on with it), a copy of its state then
    (what a checkpoint of that step holds: the others start from it) and its scaler's scale then."""
    num_classes, data = batches
    engine = engine_for(fp16_config(tiny_coco, tmp_path_factory.mktemp("first_step")), num_classes)
    assert engine.scaler.is_enabled()
    engine.train_step(0, *data[0])
    saved = io.BytesIO()
    torch.save(engine.state_dict(), saved)
    saved.seek(0)
    return engine, torch.load(saved, weights_only=True), engine.scaler.get_scale()


@pytest.mark.slow
def test_fp16_runs_the_scaler_on_cpu_and_the_checkpoint_holds_its_state(first_step):
    _, state, scale = first_step
    saved = state["scaler"]
    assert saved["scale"] == scale and saved["_growth_tracker"] in (0, 1)


@pytest.mark.slow
def test_an_overflowing_step_changes_neither_weights_nor_momenta(tiny_coco, tmp_path, batches, first_step):
    num_classes, data = batches
    engine = engine_for(fp16_config(tiny_coco, tmp_path), num_classes)
    _, state, scale = first_step
    # After a step (momenta exist from here on), at a scale the scaled loss overflows fp32 with: every
    # gradient is inf.
    engine.load_state_dict({**state, "scaler": {**state["scaler"], "scale": 3.0e38}})
    weights = {k: v.clone() for k, v in engine.model.state_dict().items() if v.is_floating_point()}
    before_momenta = momenta(engine)
    engine.train_step(1, *data[1])
    params = {k for k, _ in engine.model.named_parameters()}
    after = engine.model.state_dict()
    changed = [k for k in weights if k in params and not torch.equal(weights[k], after[k])]
    assert changed == [], changed[:5]
    assert all(torch.equal(a, b) for a, b in zip(before_momenta, momenta(engine), strict=True))
    assert engine.scaler.get_scale() == pytest.approx(3.0e38 * 0.5) != scale


@pytest.mark.slow
def test_gradients_are_unscaled_before_they_are_clipped(tiny_coco, tmp_path, batches, monkeypatch):
    """The norm clip_grad_norm_ sees under fp16 is the fp32 step's (within autocast's rounding), not
    the scaled one (256 times larger). The fp16 engine starts at that scale: at torch's 2**16 its first
    step overflows, and an overflowing step clips nothing."""
    num_classes, data = batches
    seen: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_

    def recording(parameters, max_norm, *args, **kwargs):
        norm = clip(parameters, max_norm, *args, **kwargs)
        seen.append(float(norm))
        return norm

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    for flags in ({"amp": False}, {}):
        engine = engine_for(fp16_config(tiny_coco, tmp_path, **{"clip-grad-norm": 10.0, **flags}), num_classes)
        if engine.cfg.amp:  # (fp32 runs the scaler too, at a fixed scale of 1: left as it is)
            engine.scaler.load_state_dict({**engine.scaler.state_dict(), "scale": 256.0})
        engine.train_step(0, *data[0])
        assert not bool(engine.skipped())
    fp32, fp16 = seen
    assert 0.5 < fp16 / fp32 < 2.0, seen


@pytest.mark.slow
def test_a_resume_carries_the_scale_on(tiny_coco, tmp_path, batches, first_step):
    num_classes, data = batches
    first = first_step[0]
    first.scaler.update(new_scale=1024.0)
    state = first.state_dict()
    resumed = engine_for(fp16_config(tiny_coco, tmp_path / "b"), num_classes)
    resumed.load_state_dict(state)
    assert resumed.scaler.get_scale() == 1024.0
    first.train_step(1, *data[1])
    resumed.train_step(1, *data[1])
    assert resumed.scaler.get_scale() == first.scaler.get_scale()
    mine, theirs = resumed.model.state_dict(), first.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


def test_auto_amp_dtype_follows_the_gpu(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert perf.amp_dtype(cpu) == torch.bfloat16
    monkeypatch.setattr(perf, "gpu_has_bf16", lambda device: True)
    assert perf.amp_dtype(cuda) == torch.bfloat16 and not perf.grad_scaler(cuda, True).is_enabled()
    monkeypatch.setattr(perf, "gpu_has_bf16", lambda device: False)
    assert perf.amp_dtype(cuda) == torch.float16
    assert perf.amp_dtype(cuda, "bfloat16") == torch.bfloat16
