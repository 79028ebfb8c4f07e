"""What a stop inside a hook leaves pending, in-process: the Trainer with a StopRequest asked from inside
validation (no signal: the agreement and the bookkeeping are what is under test here)."""

from __future__ import annotations

import pytest

from maskrcnn_dist.checkpoint import latest_checkpoint, load_checkpoint
from maskrcnn_dist.data import load_datasets
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.loop import Trainer
from maskrcnn_dist.metrics import read_metrics
from maskrcnn_dist.stop import Stopped, StopRequest

from .conftest import fast_config

ITERS = 6  # tiny_coco: 12 training images, 2 per step


def trainer_for(cfg, asked_in_validation: bool) -> Trainer:
    train_set, val_set = load_datasets(cfg)
    stop = StopRequest()
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=ITERS, stop=stop)
    if asked_in_validation:
        validate = engine.validation_losses

        def asked_meanwhile(images, targets):
            stop.request("a test, during validation")
            return validate(images, targets)

        engine.validation_losses = asked_meanwhile
    return Trainer(cfg, engine, train_set, val_set, ITERS, stop)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stop_in_the_periodic_validation_at_an_epoch_end_leaves_the_epoch_end_pending_too(tiny_coco, tmp_path):
    """At step 6 the periodic validation runs, then the epoch end's: a stop in the first must leave both."""
    small = {"val-period": ITERS, "min-size": 64, "max-size": 64}
    cfg = fast_config(tiny_coco, tmp_path, epochs=2, **small)
    trainer = trainer_for(cfg, asked_in_validation=True)
    with pytest.raises(Stopped):
        trainer.fit()
    trainer.close()
    state = load_checkpoint(latest_checkpoint(cfg.output_dir / "checkpoints"))
    assert (state["step"], state["pending_hooks"]) == (ITERS, ["validation", "validation"])

    # Stop there after the pending hooks: what they write is what is checked.
    resumed = fast_config(tiny_coco, tmp_path, epochs=2, **small, **{"max-steps": ITERS, "resume": "auto"})
    trainer = trainer_for(resumed, asked_in_validation=False)
    trainer.fit()
    trainer.close()
    val_steps = [r["step"] for r in read_metrics(cfg.output_dir / "metrics.jsonl") if r["kind"] == "val"]
    assert val_steps == [ITERS, ITERS]  # as an uninterrupted run: the periodic validation and the epoch end's
    assert load_checkpoint(latest_checkpoint(cfg.output_dir / "checkpoints"))["pending_hooks"] == []
