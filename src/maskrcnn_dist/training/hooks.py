"""The hooks a training run is made of (detectron2's engine/hooks.py): each is one concern around the
step, with its own state in the checkpoint. The composition root (train.py `build_hooks`) chooses them
and their order; the loop (loop.py) calls them.

Order matters at a boundary where several are due, as in detectron2: the periodic checkpoint comes last,
so that it holds what every hook before it did at its step (the evaluation's verdict on the best among
them, which the evaluation hook then publishes as best.pt in its after_epoch).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..errors import TrainingError
from ..evaluation import evaluate, validation_loss
from .best import BestTracker, agreed_value, restore_best_file
from .grace import GraceCheck
from .loop import Boundary, HookBase
from .metrics import MetricsWriter, non_finite

log = logging.getLogger(__name__)


class MetricsHook(HookBase):
    """One `train` record per step (the loss terms, lr, throughput, the engine's extras). On resume the
    records of steps after the checkpoint go first: those steps are trained again."""

    name = "metrics"

    def __init__(self, writer: MetricsWriter) -> None:
        self.writer = writer

    def before_train(self) -> None:
        step = self.trainer.position.step
        if dropped := self.writer.truncate_after(step):
            log.info("%s: dropped %d record(s) after step %d", self.writer.path, dropped, step)

    def after_step(self) -> None:
        engine, result = self.trainer.engine, self.trainer.last_step
        assert result is not None  # after_step follows a step
        record = {
            **result.losses,
            "loss": sum(result.losses.values()),
            "lr": engine.lr(),
            "images_per_s": result.images * engine.data_world_size / max(result.seconds, 1e-9),
            "epoch": self.trainer.position.epoch,
            **engine.extra_metrics(),
        }
        self.writer.write("train", self.trainer.position.step, record)


class GraceHook(HookBase):
    """The termination grace period against one step plus one checkpoint write, measured once (grace.py).
    The main process only: it is the one that writes checkpoints."""

    name = "grace"

    def __init__(self, grace_s: float | None) -> None:
        self.check = GraceCheck(grace_s)

    def after_step(self) -> None:
        trainer = self.trainer
        assert trainer.last_step is not None

        def trial_save() -> None:
            trainer.checkpointer.trial(trainer.checkpoint_state())

        self.check.after_step(trainer.last_step.seconds, trial_save, last=trainer.position.step >= trainer.total_steps)


class ValidationHook(HookBase):
    """The validation loss every `period` steps and at every epoch end: once at a step that is both."""

    name = "validation"

    def __init__(self, val_set, period: int, batch_size: int, workers: int, writer: MetricsWriter) -> None:
        self.val_set, self.period = val_set, period
        self.batch_size, self.workers = batch_size, workers
        self.writer = writer
        self.last: dict[str, float] | None = None

    def is_due(self, at: Boundary) -> bool:
        periodic = bool(self.period) and at.step % self.period == 0
        return self.val_set is not None and (periodic or at.epoch_end)

    def run(self, at: Boundary) -> None:
        self.last = validation_loss(self.trainer.engine, self.val_set, self.batch_size, self.workers)
        self.writer.write("val", at.step, self.last)
        # Every rank holds the same (all-reduced) losses: all stop together.
        stop_if_diverged("validation loss", at.step, self.last)


class EvaluationHook(HookBase):
    """COCO evaluation at every epoch end (`every_epoch`) or at the last step, with the best checkpoint and
    patience (best.py): every process judges rank 0's value alike; a new best's checkpoint (this step's) is
    published as checkpoints/best.pt with a `best` record; `patience` evaluations in a row without one
    end training. Its state (the best so far) is the checkpoint's `best`."""

    name = "evaluation"

    def __init__(
        self, val_set, every_epoch: bool, batch_size: int, workers: int, writer: MetricsWriter, best: BestTracker
    ) -> None:
        self.val_set, self.every_epoch = val_set, every_epoch
        self.batch_size, self.workers = batch_size, workers
        self.writer = writer
        self.best = best
        self.new_best = False  # this boundary's evaluation beat the best: publish once its checkpoint is written
        self.last: dict[str, float] | None = None

    @property
    def state_key(self) -> str:
        return "best"  # the key checkpoints have always kept the best under

    def is_due(self, at: Boundary) -> bool:
        return self.val_set is not None and at.epoch_end and (self.every_epoch or at.final)

    def evaluate(self, step: int) -> dict[str, float] | None:
        """COCO AP of the model as it is now, recorded at `step` (rank 0 holds it; the others get None)."""
        self.last = evaluate(self.trainer.engine, self.val_set, self.batch_size, self.workers)
        if self.last is not None:
            self.writer.write("eval", step, self.last)
            if self.trainer.engine.data_world_size == 1:  # else run() stops every rank on the agreed value
                stop_if_diverged("evaluation", step, self.last)
        return self.last

    def run(self, at: Boundary) -> None:
        trainer = self.trainer
        value = agreed_value(self.evaluate(at.step), self.best.metric, trainer.engine.all_reduce_sum)
        # Before the verdict: a diverged model's evaluation never becomes best.pt.
        stop_if_diverged("evaluation", at.step, {self.best.metric: value})
        self.new_best = self.best.update(value, at.step)
        if self.best.exhausted and not at.final:
            trainer.stopped_early = self.best.closing_line()

    def after_epoch(self) -> None:
        """After the boundary's work, so that this step's checkpoint (the periodic checkpoint's, written after
        this hook ran) holds the verdict: publish it as best.pt."""
        if not self.new_best:
            return
        self.new_best = False
        trainer = self.trainer
        path = trainer.save()  # written by the periodic checkpoint already, where there is one
        if trainer.engine.is_main:
            best = trainer.checkpointer.publish_best(path)
            log.info("new best %s %.4f: %s", self.best.metric, self.best.value, best)
            self.writer.write("best", trainer.position.step, self.best.record())

    def before_train(self) -> None:
        trainer = self.trainer
        if trainer.resumed_from is not None and trainer.engine.is_main:
            restore_best_file(self.best, trainer.resumed_from, trainer.position.step)

    def state_dict(self) -> dict[str, Any]:
        return self.best.to_state()

    def load_state_dict(self, state: Any, source: Path) -> None:
        self.best.restore(state, source)


def stop_if_diverged(what: str, step: int, values: dict[str, float]) -> None:
    """A TrainingError (exit 1) naming the step and every non-finite value: a run whose validation loss
    or evaluation is NaN or infinite has diverged, like one whose training loss is (engines/base.py)."""
    if bad := non_finite(values):
        raise TrainingError(
            f"non-finite {what} at step {step}: {', '.join(f'{k}={v}' for k, v in bad.items())}; the run "
            "diverged and stops (no best checkpoint from it); lower --lr or set --clip-grad-norm"
        )


class PeriodicCheckpointer(HookBase):
    """A checkpoint every `period` steps (0: none) and at every epoch end. A stop writes its own
    checkpoint of the step: this one is never left pending."""

    name = "checkpoint"
    pending_after_stop = False

    def __init__(self, period: int) -> None:
        self.period = period

    def is_due(self, at: Boundary) -> bool:
        return at.epoch_end or (bool(self.period) and at.step % self.period == 0)

    def run(self, at: Boundary) -> None:
        self.trainer.save()
