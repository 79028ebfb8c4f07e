"""The GPU check's amp comparison (checks/gpu/amp.py) on the CPU: bf16 and fp16 (GradScaler("cpu")) agree
with fp32 within their floors, and a broken amp step (gradients left scaled) is caught.

One thread, as every trainer test: the floors hold at any thread count because the compared steps share
the fp32 step's proposals (docs/gpu-check.md has the ratios measured with and without)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checks.gpu.amp import StepRunner, compare_amp, problems
from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.engines.torch_engine import TorchEngine

from .conftest import FEWER_ROIS, first_steps


@pytest.fixture(scope="module")
def engine_and_batches(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory):
    torch.set_num_threads(1)
    values = small_cpu_run(64, data_path=tiny_coco, output_dir=tmp_path_factory.mktemp("amp"), batch_size=2, lr=0.005)
    values.update({"workers": 0, "aspect-ratio-group-factor": -1, **FEWER_ROIS})  # the floors see the same heads
    cfg = apply_overrides(TrainConfig(), values, "test")
    train_set, _ = load_datasets(cfg)
    batches = first_steps(train_set, 2, 2)
    return lambda: TorchEngine(cfg, train_set.num_classes, iters_per_epoch=10), batches


pytestmark = pytest.mark.slow  # half precision on a CPU without its units: seconds a step, 5-15x fp32's

# fp16's first scale: torch's 2**16 overflows three times on the first batch before 2**13 passes, each
# overflow a full fp16 step. 2**14 still overflows (so does 2**13.5: a margin of 1.4x), then passes at the
# same 2**13, computing the same step: one overflow counted, two steps fewer.
FP16_INIT_SCALE = 2.0**14


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_amp_agrees_with_fp32_within_its_floor(engine_and_batches, dtype):
    make_engine, batches = engine_and_batches
    report = compare_amp(make_engine(), batches, dtype, repeat_floor=False, init_scale=FP16_INIT_SCALE)
    assert problems(report) == [], report
    assert set(report["floor"]) == {"loss", "backbone", "rpn", "heads"} and report["batches"] == 2
    assert all(0 < v for v in report["floor"].values()), report["floor"]
    if dtype == "fp16":  # the scaler's overflowing steps are counted, never hidden
        assert report["skipped_steps"] >= 1 and report["final_scale"] < FP16_INIT_SCALE


def test_gradients_left_scaled_are_caught(engine_and_batches, monkeypatch):
    make_engine, batches = engine_and_batches
    unscale = torch.amp.GradScaler.unscale_

    def leave_scaled(self, optimizer):  # the scaler's bookkeeping runs, the gradients keep their scale
        unscale(self, optimizer)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(self.get_scale())

    monkeypatch.setattr(torch.amp.GradScaler, "unscale_", leave_scaled)
    report = compare_amp(make_engine(), batches[:1], "fp16", repeat_floor=False, init_scale=256.0)
    assert {"backbone", "rpn", "heads"} <= {p.split()[0] for p in problems(report)}, report


def test_the_compared_steps_take_the_proposals_they_are_given(engine_and_batches):
    """What keeps the comparison continuous: a step given proposals hands exactly those to its RoI heads,
    whatever its own RPN chose; a step given none hands on its RPN's."""
    make_engine, batches = engine_and_batches
    runner = StepRunner(make_engine())
    heads_took: list[list[torch.Tensor]] = []
    hook = runner.model.roi_heads.register_forward_pre_hook(lambda _heads, args: heads_took.append(args[1]))
    try:
        reference = runner.gradients(0, *batches[0], None)
        given = runner.gradients(1, *batches[1], None).proposals  # another batch's: never this one's own
        result = runner.gradients(0, *batches[0], "bf16", proposals=given)
    finally:
        hook.remove()
    assert len(heads_took) == 3
    assert same_boxes(heads_took[0], reference.proposals) and not same_boxes(reference.proposals, given)
    assert same_boxes(heads_took[2], given) and same_boxes(result.proposals, given)


def same_boxes(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Each image's proposals equal, bit for bit; the batched RPN's padding rows (NaN) equal each other."""
    pairs = list(zip(a, b, strict=True))
    return all(x.shape == y.shape and torch.allclose(x, y, rtol=0, atol=0, equal_nan=True) for x, y in pairs)
