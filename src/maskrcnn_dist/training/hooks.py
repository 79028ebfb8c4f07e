"""The hooks a training run is made of (detectron2's engine/hooks.py): each is one concern around the
step, given its collaborators when it is made, with its own state in the checkpoint. The composition
root (trainer_parts.py `build_hooks`) makes them; the loop (loop.py) calls them.

No hook relies on another running before or after it: the periodic checkpoint and the evaluation that
finds a new best ask the run's checkpointer for their step's checkpoint, which the loop writes once, after
all of the boundary's work; the evaluation then publishes it as best.pt.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..engines.base import Engine
from ..errors import TrainingError
from ..evaluation import evaluate, validation_loss
from .base import Boundary, Done, HookBase, RunCheckpointer, Start
from .best import BestTracker, agreed_value, restore_best_file
from .grace import GraceCheck
from .losses import StepResult
from .metrics import MetricsWriter, non_finite

log = logging.getLogger(__name__)


class MetricsHook(HookBase):
    """One `train` record per step (the loss terms, lr, throughput, the engine's extras). On resume the
    records of steps after the checkpoint go first: those steps are trained again."""

    name = "metrics"

    def __init__(self, writer: MetricsWriter, engine: Engine) -> None:
        self.writer, self.engine = writer, engine

    def before_train(self, start: Start) -> None:
        if dropped := self.writer.truncate_after(start.step):
            log.info("%s: dropped %d record(s) after step %d", self.writer.path, dropped, start.step)

    def after_step(self, at: Boundary, result: StepResult) -> None:
        record = {
            **result.losses,
            "loss": sum(result.losses.values()),
            "lr": result.lr,
            "images_per_s": result.images * self.engine.data_world_size / max(result.seconds, 1e-9),
            "epoch": at.epoch,
            "world_size": self.engine.data_world_size,
            **({"skipped": 1} if result.skipped else {}),
            **result.extras,
        }
        self.writer.write("train", at.step, record)


class GraceHook(HookBase):
    """The termination grace period against one step plus one checkpoint write, measured once (grace.py).
    The main process only: it is the one that writes checkpoints."""

    name = "grace"

    def __init__(self, grace_s: float | None, checkpointer: RunCheckpointer) -> None:
        self.check, self.checkpointer = GraceCheck(grace_s), checkpointer

    def after_step(self, at: Boundary, result: StepResult) -> None:
        self.check.after_step(result.seconds, self.checkpointer.trial, last=at.final)


class ValidationHook(HookBase):
    """The validation loss every `period` steps and at every epoch end: once at a step that is both.
    No val split (`val_set` None): never due."""

    name = "validation"

    def __init__(
        self, engine: Engine, val_set, period: int, batch_size: int, workers: int, writer: MetricsWriter
    ) -> None:
        self.engine, self.val_set, self.period = engine, val_set, period
        self.batch_size, self.workers = batch_size, workers
        self.writer = writer

    def is_due(self, at: Boundary) -> bool:
        periodic = bool(self.period) and at.step % self.period == 0
        return self.val_set is not None and (periodic or at.epoch_end)

    def run(self, at: Boundary) -> Done:
        losses = validation_loss(self.engine, self.val_set, self.batch_size, self.workers)
        self.writer.write("val", at.step, losses)
        # Every rank holds the same (all-reduced) losses: all stop together.
        stop_if_diverged("validation loss", at.step, losses)
        return Done(losses)


class Evaluation:
    """COCO AP of the engine's model on the val split, recorded at a step (an `eval` record): what the
    evaluation hook runs at epoch ends and `eval` (--test-only) runs once. Rank 0 gets the metrics, the
    other ranks None."""

    def __init__(self, engine: Engine, val_set, batch_size: int, workers: int, writer: MetricsWriter) -> None:
        self.engine, self.val_set = engine, val_set
        self.batch_size, self.workers = batch_size, workers
        self.writer = writer

    def __call__(self, step: int) -> dict[str, float] | None:
        metrics = evaluate(self.engine, self.val_set, self.batch_size, self.workers)
        if metrics is not None:
            self.writer.write("eval", step, metrics)
            if self.engine.data_world_size == 1:  # else EvaluationHook stops every rank on the agreed value
                stop_if_diverged("evaluation", step, metrics)
        return metrics


class EvaluationHook(HookBase):
    """COCO evaluation at every epoch end (`every_epoch`) or at the last step, with the best checkpoint and
    patience (best.py): every process judges rank 0's value alike; a new best's checkpoint (this step's,
    with the verdict in it) is published as checkpoints/best.pt with a `best` record; `patience`
    evaluations in a row without one end training. No val split (`evaluation` None): never due."""

    name = "evaluation"

    def __init__(
        self,
        evaluation: Evaluation | None,
        every_epoch: bool,
        best: BestTracker,
        checkpointer: RunCheckpointer,
        engine: Engine,
        writer: MetricsWriter,
    ) -> None:
        self.evaluation, self.every_epoch, self.best = evaluation, every_epoch, best
        self.checkpointer, self.engine, self.writer = checkpointer, engine, writer

    def is_due(self, at: Boundary) -> bool:
        return self.evaluation is not None and at.epoch_end and (self.every_epoch or at.final)

    def run(self, at: Boundary) -> Done:
        assert self.evaluation is not None  # is_due
        metrics = self.evaluation(at.step)
        value = agreed_value(metrics, self.best.metric, self.engine.all_reduce_sum)
        # Before the verdict: a diverged model's evaluation never becomes best.pt.
        stop_if_diverged("evaluation", at.step, {self.best.metric: value})
        if self.best.update(value, at.step):
            self.checkpointer.request(then=self.publish_best)
        return Done(metrics, self.best.closing_line() if self.best.exhausted and not at.final else None)

    def publish_best(self, checkpoint: Path) -> None:
        """The new best's checkpoint (its step's, written with the verdict in it) as best.pt."""
        if self.engine.is_main:
            best = self.checkpointer.publish_best(checkpoint)
            log.info("new best %s %.4f: %s", self.best.metric, self.best.value, best)
            self.writer.write("best", self.best.step, self.best.record())

    def before_train(self, start: Start) -> None:
        if start.resumed_from is not None and self.engine.is_main:
            restore_best_file(self.best, start.resumed_from, start.step)

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
    """A checkpoint every `period` steps (0: none) and at every epoch end. A stop writes its own checkpoint
    of the step: this one is never left pending."""

    name = "checkpoint"
    pending_after_stop = False

    def __init__(self, period: int, checkpointer: RunCheckpointer) -> None:
        self.period, self.checkpointer = period, checkpointer

    def is_due(self, at: Boundary) -> bool:
        return at.epoch_end or (bool(self.period) and at.step % self.period == 0)

    def run(self, at: Boundary) -> None:
        self.checkpointer.request()
