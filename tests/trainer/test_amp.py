"""Mixed precision, channels_last and denormal flushing: same training, same detections, only faster.

From scratch, training is chaotic: two runs whose sums are merely reordered (channels_last) drift
apart, 1e-7 at the first update growing to 0.4% by step 6 on one CPU and 3% on another. So the
variants are compared step by step from the same weights (`forced_steps`): before each of 3 steps
every engine loads the fp32 contiguous engine's weights, then all take that step on the same batch,
seeded alike; nothing compounds, and the bounds hold on any CPU:
- channels_last vs contiguous (fp32): only the order of float32 sums differs. Each loss term within
  1e-2 relative and the step's update within 1e-3: rounding moves them by ~1e-6, a near tie in the
  RPN's proposal ranking or the RoI matching moves one RoI and a term by a few 1e-4 at most (measured
  4e-4 at worst), a wrong memory layout by whole percents (mutation: RoIAlign reading channels_last
  features as NCHW).
- --amp (bf16) vs fp32: bf16 keeps 8 significant bits (each rounded operand moves 2^-9 = 0.2%) and
  every CPU kernel accumulates in fp32, so a step's loss stays within perf.AMP_CURVE_TOLERANCE of
  fp32's (step 0 within 2%, every step within 8%, the mean within 3%; measured 1.6% at worst) and
  its update points the same way (cosine >= 0.99; measured 0.9999).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
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

from .conftest import MODEL_HEADS, fast_config
from .test_fold_bn import randomise_frozen_statistics

STEPS = 3  # from the same weights at every step: nothing compounds, so three tell what six did
LR = 0.005
DETECTIONS_PER_IMAGE = 5


def first_batches(cfg: TrainConfig, steps: int = STEPS) -> list:
    train_set, _ = load_datasets(cfg)
    batches, epoch = [], 0
    while len(batches) < steps:
        loader = build_step_loader(train_set, BatchLayout(1, cfg.data.batch_size), epoch=epoch, seed=cfg.seed)
        batches += [batch.micro_batches for batch in loader]
        epoch += 1
    return batches[:steps]


@dataclass
class ForcedSteps:
    """Each variant's loss terms and update at every step, each step taken from the reference's weights."""

    losses: dict[str, list[dict[str, float]]]
    updates: dict[str, list[torch.Tensor]]
    engines: dict[str, TorchEngine]


def forced_steps(engines: dict[str, TorchEngine], batches: list) -> ForcedSteps:
    """The first engine trains freely; before each step every other one loads its weights, then each
    takes the same step (the engines seed each step alike)."""
    reference = next(iter(engines.values()))
    losses: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    updates: dict[str, list[torch.Tensor]] = {name: [] for name in engines}
    for step, micro_batches in enumerate(batches):
        before = {k: v.clone() for k, v in reference.model.state_dict().items()}
        for name, engine in engines.items():
            engine.model.load_state_dict(before)
            losses[name].append(read_losses(engine.train_micro_batches(step, micro_batches)))
            after = engine.model.state_dict()
            updates[name].append(
                torch.cat([(after[k] - v).flatten() for k, v in before.items() if v.is_floating_point()])
            )
    return ForcedSteps(losses, updates, engines)


@pytest.fixture(scope="module")
def forced(tiny_coco: Path, tmp_path_factory: pytest.TempPathFactory) -> ForcedSteps:
    """fp32 contiguous (the reference), fp32 channels_last and amp (channels_last)."""
    runs = {
        "fp32": {"channels-last": False, "lr": LR},
        "fp32_channels_last": {"channels-last": True, "lr": LR},
        "amp": {"channels-last": True, "amp": True, "lr": LR},
    }
    engines = {}
    for name, flags in runs.items():
        cfg = fast_config(tiny_coco, tmp_path_factory.mktemp(name), **flags, **MODEL_HEADS)
        train_set, _ = load_datasets(cfg)
        engines[name] = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
    return forced_steps(engines, first_batches(cfg))


def relative_update(update: torch.Tensor, reference: torch.Tensor) -> float:
    return float((update - reference).norm() / reference.norm())


@pytest.mark.slow
def test_channels_last_takes_the_steps_of_contiguous(forced: ForcedSteps) -> None:
    for step, (mine, theirs) in enumerate(zip(forced.losses["fp32_channels_last"], forced.losses["fp32"], strict=True)):
        for term, value in theirs.items():
            assert abs(mine[term] - value) <= 1e-2 * abs(value), (step, term, mine, theirs)
    for step, (mine, theirs) in enumerate(
        zip(forced.updates["fp32_channels_last"], forced.updates["fp32"], strict=True)
    ):
        assert relative_update(mine, theirs) <= 1e-3, step


def assert_amp_within_tolerance(forced: ForcedSteps) -> None:
    fp32, amp = ([sum(terms.values()) for terms in forced.losses[name]] for name in ("fp32", "amp"))
    assert AMP_CURVE_TOLERANCE.problems(amp, fp32) == [], (amp, fp32)
    for step, (mine, theirs) in enumerate(zip(forced.updates["amp"], forced.updates["fp32"], strict=True)):
        cosine = float(torch.nn.functional.cosine_similarity(mine, theirs, dim=0))
        assert cosine >= 0.99, (step, cosine)
    assert fp32[-1] < fp32[0]  # and the reference trains


@pytest.mark.slow
def test_amp_steps_stay_within_tolerance_of_fp32(forced: ForcedSteps) -> None:
    assert_amp_within_tolerance(forced)


@pytest.mark.slow
def test_amp_with_folded_frozen_batchnorm_stays_within_tolerance_of_fp32(tiny_coco, tmp_path):
    """Fine-tuning's case: frozen BatchNorm (random statistics, as pretrained ones are), folded into its
    convolutions under --amp (--fold-frozen-bn), against fp32 without the fold: the same bounds."""
    engines = {}
    for name, flags in {"fp32": {"fold-frozen-bn": False}, "amp": {"amp": True, "fold-frozen-bn": True}}.items():
        cfg = fast_config(tiny_coco, tmp_path / name, lr=LR, **{"backbone-norm": "frozen"}, **flags, **MODEL_HEADS)
        train_set, _ = load_datasets(cfg)
        engines[name] = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=6)
        folded = any(isinstance(m, FoldedConv2d) for m in engines[name].model.modules())
        assert folded is (name == "amp")
    randomise_frozen_statistics(engines["fp32"].model)  # the others load the reference's at every step
    assert_amp_within_tolerance(forced_steps(engines, first_batches(cfg)))


def few_detections(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most DETECTIONS_PER_IMAGE detections an image in eval mode, for the test's duration: a CPU without
    bf16 or fp16 units (AVX2 only) runs the mask head's convolutions 23x slower than fp32, and the mask
    head sees every detection (torchvision's 100 an image: minutes). What the tests check of eval under
    autocast (the outputs' dtypes, masks at the image's size, an AP computed) needs only a few."""
    monkeypatch.setattr(model.roi_heads, "detections_per_img", DETECTIONS_PER_IMAGE)


@pytest.mark.slow
def test_eval_under_amp_returns_fp32_detections_and_ap(forced: ForcedSteps, monkeypatch) -> None:
    engine = forced.engines["amp"]
    few_detections(engine.model, monkeypatch)
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


@pytest.mark.slow  # no optimizer step, but the model under bf16: 7 s on a CPU without bf16 units
def test_box_decoding_and_losses_stay_fp32_under_autocast(tiny_coco, tmp_path, monkeypatch):
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
    image, target = train_set[0]
    model.train()
    with autocast_context(torch.device("cpu"), True):
        losses = model([image], [target])
    assert seen == {"features": torch.bfloat16, "proposals": torch.float32}
    assert all(v.dtype == torch.float32 for v in losses.values())
    model.eval()
    few_detections(model, monkeypatch)
    with torch.no_grad(), autocast_context(torch.device("cpu"), True):
        detections = model([image])
    assert detections[0]["boxes"].numel() > 0  # else the dtypes below would say nothing
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


@pytest.mark.slow
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
