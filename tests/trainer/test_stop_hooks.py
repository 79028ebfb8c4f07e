"""What a stop inside a hook leaves pending, in-process: the Trainer with a StopRequest asked from inside
validation (no signal: the agreement and the bookkeeping are what is under test here)."""

from __future__ import annotations

from contextlib import closing

import pytest

from maskrcnn_dist.checkpoint import latest_checkpoint, load_checkpoint
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.lifetime.stop import Stopped, StopRequest
from maskrcnn_dist.trainer_parts import build_trainer, run_metrics
from maskrcnn_dist.training.loop import Trainer
from maskrcnn_dist.training.metrics import read_metrics

from .conftest import fast_config
from .stand_ins import resume

ITERS = 6  # tiny_coco: 12 training images, 2 per step


def fit(cfg, asked_in_validation: bool) -> Trainer:
    train_set, val_set = load_datasets(cfg)
    stop = StopRequest()
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=ITERS, stop=stop)
    if asked_in_validation:
        validate = engine.validation_losses

        def asked_meanwhile(images, targets):
            stop.request("a test, during validation")
            return validate(images, targets)

        engine.validation_losses = asked_meanwhile
    with closing(run_metrics(cfg, True, cfg.total_steps(ITERS))) as metrics:
        trainer = build_trainer(cfg, engine, train_set, val_set, ITERS, metrics, stop)
        resume(trainer, cfg)
        trainer.fit()
    return trainer


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stop_in_the_validation_at_an_epoch_end_that_is_also_a_val_period_step_leaves_it_pending_once(
    tiny_coco, tmp_path
):
    """Step 6 is a --val-period step and an epoch end: validation is due there once, not twice (each writing
    a `val` record), so a stop inside it leaves it pending once, and the resumed run writes one record."""
    small = {"val-period": ITERS, "min-size": 64, "max-size": 64}
    cfg = fast_config(tiny_coco, tmp_path, epochs=2, **small)
    with pytest.raises(Stopped):
        fit(cfg, asked_in_validation=True)
    state = load_checkpoint(latest_checkpoint(cfg.output_dir / "checkpoints"))
    assert (state["step"], state["pending_hooks"]) == (ITERS, ["validation"])

    # Stop there after the pending hooks: what they write is what is checked.
    resumed = fast_config(tiny_coco, tmp_path, epochs=2, **small, **{"max-steps": ITERS, "resume": "auto"})
    fit(resumed, asked_in_validation=False)
    val_steps = [r["step"] for r in read_metrics(cfg.output_dir / "metrics.jsonl") if r["kind"] == "val"]
    assert val_steps == [ITERS]  # as an uninterrupted run: one validation at a step due twice
    assert load_checkpoint(latest_checkpoint(cfg.output_dir / "checkpoints"))["pending_hooks"] == []
