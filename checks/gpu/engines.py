"""The checks of the local and ddp engines on the device: evaluation under --amp, checkpoints moved
between device kinds, and ddp's process group."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from .harness import Env
from .runs import base_flags, max_abs_diff, run_logged, torchrun_command, train_config, train_losses

EVAL_AP_TOLERANCE = 0.05
# Where the amp check leaves the fp32 weights it ended with (eval_amp evaluates them).
FP32_WEIGHTS = "fp32-weights"


def check_eval_amp(env: Env) -> dict[str, Any]:
    """COCO AP of the same weights in fp32 and under --amp: finite, and within EVAL_AP_TOLERANCE."""
    from maskrcnn_dist.checkpoint import load_checkpoint
    from maskrcnn_dist.data import load_datasets
    from maskrcnn_dist.engines.torch_engine import TorchEngine
    from maskrcnn_dist.evaluation import evaluate

    weights = Path(env.work) / FP32_WEIGHTS
    if not weights.is_dir():
        raise AssertionError("no fp32 weights to evaluate (the amp check did not leave them)")
    state = load_checkpoint(weights)
    figures: dict[str, Any] = {}
    for name, amp in (("fp32", False), ("amp", True)):
        cfg = train_config(base_flags(env, env.eval_data, Path(env.work) / f"eval-{name}", amp=amp))
        train_set, val_set = load_datasets(cfg)
        engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=1)
        engine.load_state_dict(state)
        metrics = evaluate(engine, val_set, batch_size=cfg.data.val_batch_size, workers=0)
        assert metrics is not None
        figures[f"{name}_bbox_AP"], figures[f"{name}_segm_AP"] = (round(metrics[k], 4) for k in ("bbox_AP", "segm_AP"))
    for kind in ("bbox", "segm"):
        fp32, amp = figures[f"fp32_{kind}_AP"], figures[f"amp_{kind}_AP"]
        if not (math.isfinite(fp32) and math.isfinite(amp)) or abs(fp32 - amp) > EVAL_AP_TOLERANCE:
            raise AssertionError(f"{kind} AP under amp {amp:.4f} vs fp32 {fp32:.4f} (tolerance {EVAL_AP_TOLERANCE})")
    return figures


def check_checkpoint_devices(env: Env) -> dict[str, Any]:
    """Saved on one device kind, loaded on the other, through checkpoint.py; weights equal, one more step.
    On CPU (the self-test) the same round trip runs CPU to CPU, so the code path cannot rot unseen."""
    from maskrcnn_dist.checkpoint import load_checkpoint, save_checkpoint
    from maskrcnn_dist.data import BatchLayout, build_step_loader, load_datasets
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    figures: dict[str, Any] = {}
    pairs = (("cuda", "cpu"), ("cpu", "cuda")) if env.device == "cuda" else (("cpu", "cpu"),)
    for source, target in pairs:
        engines = {}
        for device in dict.fromkeys((source, target)):
            cfg = train_config(base_flags(env, env.data, Path(env.work) / f"ckpt-{source}", device=device))
            train_set, _ = load_datasets(cfg)
            engines[device] = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=4)
        first = next(iter(build_step_loader(train_set, BatchLayout(1, 2), epoch=0, seed=0)))  # training's loader
        saver = engines[source]
        saver.train_micro_batches(0, first.micro_batches)
        # CPU to CPU: a fresh engine loads, not the one that saved.
        loader = engines[target] if source != target else TorchEngine(cfg, train_set.num_classes, iters_per_epoch=4)
        path = save_checkpoint({**saver.state_dict(), "step": 1}, Path(env.work) / f"ckpt-{source}", 1, keep=1)
        loader.load_state_dict(load_checkpoint(path))
        diff = max_abs_diff(loader.model.state_dict(), saver.model.state_dict())
        if diff != 0.0:
            raise AssertionError(f"{source} -> {target}: weights differ by {diff:g} after loading")
        losses = loader.train_micro_batches(1, first.micro_batches)
        if not all(map(math.isfinite, losses.values())):
            raise AssertionError(f"{source} -> {target}: non-finite loss after loading: {losses}")
        # The step returns device tensors (it reads nothing back): one read here, for the record.
        figures[f"{source}_to_{target}_loss"] = round(float(sum(losses.values())), 5)
    return figures


def check_ddp(env: Env) -> dict[str, Any]:
    """2 ranks under torchrun; the backend the trainer chose, from its log line."""
    from maskrcnn_launcher.contract import process_group_backend

    out = Path(env.work) / "ddp"
    flags = base_flags(env, env.data, out, engine="ddp", threads=1 if env.device == "cpu" else None)
    log = run_logged(torchrun_command(2, flags), out / "torchrun.log", 240, threads=1)
    used = sorted(set(re.findall(r"ddp rank \d+ of 2 on \S+ \((\w+)\)", log)))
    expected = process_group_backend(env.device == "cuda", shares_gpu=env.device == "cuda" and env.gpus < 2)
    if used != [expected]:
        raise AssertionError(f"backend {used or 'not logged'}, expected {expected}")
    losses = train_losses(out / "metrics.jsonl")
    if sorted(losses) != list(range(1, env.profile.run_steps + 1)) or not all(map(math.isfinite, losses.values())):
        raise AssertionError(f"train records {losses}")
    return {"backend": expected, "gpus": env.gpus, "losses": [round(v, 5) for v in losses.values()]}
