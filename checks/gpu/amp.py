"""Does --amp compute the step fp32 computes? One step against another from the same weights, by group.

For each of a few batches, from the same fp32 weights (the model's state restored before every run):
- the reference: an fp32 step's loss and gradients;
- the floor, measured first: an fp32 step on the same images rounded to the amp dtype (what a step moves
  when its input carries that dtype's rounding) and, on CUDA, the same fp32 step again (the device's
  non-deterministic kernels); the larger difference of the two, taken over every batch;
- the amp step: autocast in the dtype; fp16 with the GradScaler, whose overflowing steps are counted and
  reported (the batch is tried again at the reduced scale, as training would take the next one);
then the weights move by the reference's fp32 step, so later batches compare at trained weights.
The floor's and the amp step's RoI heads take the reference's proposals: the RPN's top-k and NMS are a
discrete choice, and between the near-tied scores of young weights any rounding (a CPU's summation
order, a thread count) picks other boxes, a jump in the loss that no floor measures (docs/gpu-check.md
has the figures). The RPN's own loss and gradients, and everything after the proposals, are still each
precision's own.

Differences are relative: the loss's |a - r| / |r|, and each group's gradient (backbone with its FPN,
RPN, RoI heads) ||a - r|| / ||r||, with its cosine reported beside. The amp step passes where every
difference is within `AMP_FLOOR_MULTIPLE` times the floor of the same quantity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .harness import CheckFailed, Env
from .runs import base_flags, train_config

GROUPS = {"backbone": "backbone.", "rpn": "rpn.", "heads": "roi_heads."}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_FLAGS = {"bf16": "bfloat16", "fp16": "float16"}
# How far amp may be from fp32, in multiples of the fp32 floor of the same quantity (docs/gpu-check.md has the
# ratios measured). Autocast rounds the inputs of every convolution and product, the floor only the images.
AMP_FLOOR_MULTIPLE = 16.0
RETRIES = 12  # fp16 overflows tried again at half the scale each time (from 2**16 down to 2**4)


@dataclass
class StepResult:
    loss: float
    grads: dict[str, list[torch.Tensor]]  # group -> the parameters' gradients, in parameter order
    proposals: list[torch.Tensor]  # the RPN's, one tensor per image, as the RoI heads took them
    skipped: bool = False


def differences(step: StepResult, reference: StepResult) -> dict[str, float]:
    """Relative differences of the loss and of each group's gradient, and each group's cosine."""
    out = {"loss": abs(step.loss - reference.loss) / max(abs(reference.loss), 1e-12)}
    for group in reference.grads:
        a, r = _flat(step.grads[group]), _flat(reference.grads[group])
        out[group] = float(torch.linalg.vector_norm(a - r) / torch.linalg.vector_norm(r).clamp_min(1e-30))
        out[f"cos_{group}"] = float(torch.nn.functional.cosine_similarity(a, r, dim=0))
    return out


def _flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1).double() for g in grads]) if grads else torch.zeros(1, dtype=torch.float64)


class StepRunner:
    """A TorchEngine's model stepped by hand: the engine's own seeding, autocast and scaler rules, but
    the gradients kept and compared instead of applied."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.model = engine.model
        self.named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.snapshot = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def gradients(
        self, step: int, images, targets, dtype: str | None, scaler=None, proposals: list[torch.Tensor] | None = None
    ) -> StepResult:
        """One step's loss and gradients; the RoI heads take `proposals` where given, else the RPN's own."""
        from maskrcnn_dist.modeling.perf import autocast_context

        taken: list[torch.Tensor] = []

        def fix_proposals(_rpn, _inputs, output):
            boxes, losses = output
            taken.extend(b.detach() for b in (boxes if proposals is None else proposals))
            return (taken, losses)

        self.model.load_state_dict(self.snapshot)  # BatchNorm's running statistics too
        self.model.train()
        self.engine.seeder.at(step, micro=0)
        hook = self.model.rpn.register_forward_hook(fix_proposals)
        try:
            with autocast_context(self.engine.device, dtype is not None, DTYPE_FLAGS.get(dtype or "", "auto")):
                loss = sum(self.model(images, targets).values())
        finally:
            hook.remove()
        self.model.zero_grad(set_to_none=True)
        skipped = False
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(self.engine.optimizer)
            skipped = not all(bool(torch.isfinite(p.grad).all()) for _, p in self.named if p.grad is not None)
            scaler.update()  # as a training step would: the scale halves after an overflow
        else:
            loss.backward()
        grads: dict[str, list[torch.Tensor]] = {group: [] for group in GROUPS}
        for name, p in self.named:
            group = next((g for g, prefix in GROUPS.items() if name.startswith(prefix)), None)
            if group is not None and p.grad is not None:
                grads[group].append(p.grad.detach().clone())
        return StepResult(float(loss.detach()), grads, taken, skipped)

    def advance(self, reference: StepResult) -> None:
        """The fp32 step: the reference's gradients applied, the new weights the next snapshot."""
        self.model.load_state_dict(self.snapshot)
        by_group = {g: iter(grads) for g, grads in reference.grads.items()}
        for name, p in self.named:
            group = next((g for g, prefix in GROUPS.items() if name.startswith(prefix)), None)
            p.grad = next(by_group[group]) if group is not None else None
        self.engine.optimizer.step()
        self.snapshot = {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def compare_amp(
    engine: Any, batches: Sequence[tuple[list, list]], dtype: str, repeat_floor: bool, init_scale: float = 2.0**16
) -> dict[str, Any]:
    """The report of this module's docstring for `engine` (a TorchEngine) over `batches` (on its device);
    fp16's scaler starts at `init_scale` (torch's default)."""
    runner = StepRunner(engine)
    scaler = torch.amp.GradScaler(engine.device.type, init_scale=init_scale) if dtype == "fp16" else None
    floors: list[dict[str, float]] = []
    amp: list[dict[str, float]] = []
    skipped = 0
    for step, (images, targets) in enumerate(batches):
        reference = runner.gradients(step, images, targets, None)
        chosen = reference.proposals
        rounded = [img.to(DTYPES[dtype]).to(img.dtype) for img in images]
        floor = differences(runner.gradients(step, rounded, targets, None, proposals=chosen), reference)
        if repeat_floor:
            again = differences(runner.gradients(step, images, targets, None, proposals=chosen), reference)
            floor = {k: max(v, again[k]) if not k.startswith("cos_") else min(v, again[k]) for k, v in floor.items()}
        floors.append(floor)
        for _ in range(RETRIES):
            result = runner.gradients(step, images, targets, dtype, scaler, proposals=chosen)
            if not result.skipped:
                break
            skipped += 1
        else:
            raise AssertionError(f"batch {step}: every fp16 step overflowed, down to scale {scaler.get_scale():g}")
        amp.append(differences(result, reference))
        runner.advance(reference)
    worst_floor = {k: max(f[k] for f in floors) for k in floors[0] if not k.startswith("cos_")}
    ratios = {k: max(a[k] for a in amp) / max(worst_floor[k], 1e-30) for k in worst_floor}
    report: dict[str, Any] = {
        "dtype": dtype,
        "batches": len(batches),
        "floor": {k: float(f"{v:.3g}") for k, v in worst_floor.items()},
        "amp": [{k: float(f"{v:.4g}") for k, v in a.items()} for a in amp],
        "worst_ratio_to_floor": {k: round(v, 2) for k, v in ratios.items()},
        "multiple": AMP_FLOOR_MULTIPLE,
    }
    if scaler is not None:
        report |= {"skipped_steps": skipped, "final_scale": float(scaler.get_scale())}
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """Each difference past its bound, one phrase each; empty when amp agrees."""
    found = []
    for key, ratio in report["worst_ratio_to_floor"].items():
        if not math.isfinite(ratio) or ratio > report["multiple"]:
            worst = max(a[key] for a in report["amp"])
            found.append(f"{key} off by {worst:.3g}, {ratio:.1f}x its fp32 floor {report['floor'][key]:.3g}")
    return found


def check_amp(env: Env, dtype: str) -> dict[str, Any]:
    """The comparison on the profile's model and data; leaves the fp32 weights it ended with for eval_amp."""
    from maskrcnn_dist.checkpoint import save_checkpoint
    from maskrcnn_dist.data import BatchLayout, build_step_loader, load_datasets
    from maskrcnn_dist.engines.base import to_device
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    from .engines import FP32_WEIGHTS

    p = env.profile
    cfg = train_config(base_flags(env, env.data, Path(env.work) / f"amp-{dtype}", lr=0.005))
    train_set, _ = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=100)
    loader = build_step_loader(train_set, BatchLayout(1, p.batch_size), epoch=0, seed=cfg.seed)  # training's loader
    batches = []
    for step in loader:
        (micro,) = step.micro_batches  # one rank: the whole global batch
        batches.append(to_device(micro.images, micro.targets, engine.device))
        if len(batches) == p.amp_batches:
            break
    report = compare_amp(engine, batches, dtype, repeat_floor=env.device == "cuda")
    weights = Path(env.work) / FP32_WEIGHTS
    if not weights.exists():
        save_checkpoint({**engine.state_dict(), "step": len(batches)}, weights, len(batches), keep=1)
    if found := problems(report):
        raise CheckFailed(f"{dtype} against fp32: {'; '.join(found)}", report)
    return report


def needs_bf16(env: Env) -> str | None:
    if env.device != "cuda":
        return None
    return None if torch.cuda.is_bf16_supported() else "needs a GPU with bfloat16"
