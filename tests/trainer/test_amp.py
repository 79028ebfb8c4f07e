"""Mixed precision, channels_last and denormal flushing: same training, same detections, only faster.

Every run here starts from the same seed and sees the same batches, so loss curves can be compared
step by step. From scratch, training is chaotic: even fp32 with the convolutions' sums merely
reordered (channels_last) drifts apart after a few steps (at lr 0.02: 12% by step 8). The curves
are therefore compared over 6 steps at lr 0.005, where fp32 is stable under reordering. Measured on
this CPU (2 threads): channels_last vs contiguous <= 0.4% at every step, 4e-7 at step 0; bf16
autocast vs fp32 <= 3.3% at every step, 0.6% at step 0. Tolerances, with margin for other CPUs:
- channels_last vs contiguous (fp32): step 0 within 1e-4 relative, every step within 2%;
- --amp (bf16) vs fp32: step 0 within 2%, every step within 8%, the curve's mean within 3%
  (perf.AMP_CURVE_TOLERANCE, which the GPU check applies too).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from maskrcnn_dist.config import TrainConfig, build_config
from maskrcnn_dist.data import BatchLayout, build_step_loader, load_datasets
from maskrcnn_dist.engines.base import read_losses
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.evaluation import evaluate
from maskrcnn_dist.modeling.fold_bn import FoldedConv2d
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.modeling.perf import (
    AMP_CURVE_TOLERANCE,
    amp_dtype,
    autocast_context,
    grad_scaler,
    set_flush_denormal,
    setup_process,
)

from .conftest import fast_config
from .test_fold_bn import randomise_frozen_statistics

STEPS = 6
LR = 0.005


def loss_curve(
    cfg: TrainConfig, steps: int = STEPS, prepare: Callable[[torch.nn.Module], None] | None = None
) -> tuple[list[float], TorchEngine]:
    """Total training loss of each of the first `steps` steps of the local engine (its model first
    passed to `prepare`, when given)."""
    train_set, _ = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
    if prepare is not None:
        prepare(engine.model)
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        loader = build_step_loader(train_set, BatchLayout(1, cfg.data.batch_size), epoch=epoch, seed=cfg.seed)
        for batch in loader:
            losses.append(sum(read_losses(engine.train_micro_batches(len(losses), batch.micro_batches)).values()))
            if len(losses) == steps:
                break
        epoch += 1
    return losses, engine


def relative(a: list[float], b: list[float]) -> list[float]:
    return [abs(x - y) / abs(y) for x, y in zip(a, b, strict=True)]


@pytest.fixture(scope="module")
def curves(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """fp32 contiguous, fp32 channels_last and amp (channels_last) loss curves, and the amp engine."""
    runs = {
        "fp32": {"channels-last": False, "lr": LR},
        "fp32_channels_last": {"channels-last": True, "lr": LR},
        "amp": {"channels-last": True, "amp": True, "lr": LR},
    }
    out: dict[str, object] = {}
    for name, flags in runs.items():
        cfg = fast_config(tiny_coco, tmp_path_factory.mktemp(name), **flags)
        out[name], engine = loss_curve(cfg)
        if name == "amp":
            out["amp_engine"] = engine
    return out


def test_channels_last_gives_the_losses_of_contiguous(curves):
    contiguous, channels_last = curves["fp32"], curves["fp32_channels_last"]
    assert relative(channels_last[:1], contiguous[:1])[0] < 1e-4
    assert max(relative(channels_last, contiguous)) < 0.02, (channels_last, contiguous)


def test_amp_loss_curve_stays_within_tolerance_of_fp32(curves):
    fp32, amp = curves["fp32"], curves["amp"]
    assert AMP_CURVE_TOLERANCE.problems(amp, fp32) == [], (amp, fp32)
    assert amp[-1] < amp[0]  # and it trains


def test_amp_with_folded_frozen_batchnorm_stays_within_tolerance_of_fp32(tiny_coco, tmp_path):
    """Fine-tuning's case: frozen BatchNorm (random statistics, as pretrained ones are), folded into its
    convolutions under --amp (--fold-frozen-bn), against fp32 without the fold: today's --amp tolerance."""
    runs = {}
    for name, flags in {"fp32": {"fold-frozen-bn": False}, "amp": {"amp": True, "fold-frozen-bn": True}}.items():
        cfg = fast_config(tiny_coco, tmp_path / name, lr=LR, **{"backbone-norm": "frozen"}, **flags)
        runs[name], engine = loss_curve(cfg, prepare=randomise_frozen_statistics)
        folded = any(isinstance(m, FoldedConv2d) for m in engine.model.modules())
        assert folded is (name == "amp")
    assert AMP_CURVE_TOLERANCE.problems(runs["amp"], runs["fp32"]) == [], runs
    assert runs["amp"][-1] < runs["amp"][0]


def test_eval_under_amp_returns_fp32_detections_and_ap(curves, tiny_coco):
    engine: TorchEngine = curves["amp_engine"]
    _, val_set = load_datasets(engine.cfg)
    images = [val_set[i][0] for i in range(2)]
    detections = engine.predict(images)
    assert any(len(d["boxes"]) for d in detections)
    for d, image in zip(detections, images, strict=True):
        assert d["boxes"].dtype == d["scores"].dtype == d["masks"].dtype == torch.float32
        assert d["masks"].shape[-2:] == image.shape[-2:]
    metrics = evaluate(engine, val_set, batch_size=2, workers=0)
    assert metrics is not None and metrics["images"] == 4
    assert {"bbox_AP", "segm_AP"} <= set(metrics)


def test_box_decoding_and_losses_stay_fp32_under_autocast(tiny_coco, tmp_path):
    """torchvision casts anchors and proposals to the regression output's dtype: with bf16 head outputs
    the boxes would be rounded to multiples of 4 px at 800 px. The fp32 output hooks prevent it."""
    cfg = fast_config(tiny_coco, tmp_path, amp=True)
    train_set, _ = load_datasets(cfg)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=train_set.num_classes)
    seen: dict[str, torch.dtype] = {}

    def record(name: str, pick):  # a forward hook that returns None leaves the output alone
        return lambda module, inputs, output: seen.__setitem__(name, pick(output))

    model.rpn.register_forward_hook(record("proposals", lambda o: o[0][0].dtype))
    model.backbone.register_forward_hook(record("features", lambda o: next(iter(o.values())).dtype))
    images, targets = zip(*(train_set[i] for i in range(2)))
    model.train()
    with autocast_context(torch.device("cpu"), True):
        losses = model(list(images), list(targets))
    assert seen == {"features": torch.bfloat16, "proposals": torch.float32}
    assert all(v.dtype == torch.float32 for v in losses.values())
    model.eval()
    with torch.no_grad(), autocast_context(torch.device("cpu"), True):
        detections = model(list(images))
    assert all(d["boxes"].dtype == d["masks"].dtype == torch.float32 for d in detections)


def test_channels_last_reaches_backbone_and_rpn_only(tiny_coco, tmp_path):
    cfg = fast_config(tiny_coco, tmp_path)
    model = build_model(cfg.model, num_classes=3)
    assert model.backbone.body.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert model.backbone.fpn.layer_blocks[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model.rpn.head.conv[0][0].weight.is_contiguous(memory_format=torch.channels_last)
    assert model.roi_heads.mask_head[0][0].weight.is_contiguous()
    cfg.model.channels_last = False
    assert build_model(cfg.model, num_classes=3).backbone.body.conv1.weight.is_contiguous()


def test_amp_dtype_choice_and_scaler():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert amp_dtype(cpu) == torch.bfloat16 and amp_dtype(cuda) == torch.float16
    assert amp_dtype(cuda, "bfloat16") == torch.bfloat16
    # Dynamic loss scaling only for fp16 (its gradients could underflow); every other step keeps a scaler at
    # a fixed scale of 1 for its finite check (a step with non-finite gradients skipped on the device).
    assert grad_scaler(cpu, True).get_scale() == grad_scaler(cpu, False).get_scale() == 1.0
    assert grad_scaler(cpu, True, "float16").get_scale() == 2.0**16
    cfg = build_config(None, {"amp": True, "amp-dtype": "bfloat16", "channels-last": False})
    assert cfg.amp and cfg.amp_dtype == "bfloat16" and not cfg.model.channels_last
    with pytest.raises(Exception, match="--amp-dtype"):
        build_config(None, {"amp-dtype": "fp8"})


def test_flush_denormal_flag_reaches_torch():
    """With one intra-op thread the calling thread does all the arithmetic: the switch shows directly."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        setup_process(build_config(None, {"flush-denormal": False}))
        # Made after the switch: with flushing on (as earlier tests leave it) the literal itself is 0.
        denormal = torch.tensor([1e-39])
        assert (denormal * 1.0).item() != 0.0
        setup_process(build_config(None, {}))  # the default: on
        assert (denormal * 1.0).item() == 0.0
    finally:
        set_flush_denormal(True)
        torch.set_num_threads(threads)


@pytest.mark.parametrize("flag", ["--flush-denormal", "--no-flush-denormal"])
def test_flush_denormal_reaches_every_intra_op_thread(flag):
    """A fresh process, as the CLI starts one: the flag must reach the worker threads too (each thread
    has its own flag; they copy it from the main thread when they start)."""
    script = textwrap.dedent(
        f"""
        import torch
        from maskrcnn_dist.config import build_config
        from maskrcnn_dist.modeling.perf import setup_process
        setup_process(build_config(None, {{"threads": 2, "flush-denormal": {flag == "--flush-denormal"}}}))
        values = torch.full((1 << 20,), 1e-39) * 1.0
        print(int(torch.count_nonzero(values)), values.numel())
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    nonzero, total = map(int, result.stdout.split())
    assert nonzero == (0 if flag == "--flush-denormal" else total)
