"""The training loop every engine shares.

Like detectron2's train loop, `Trainer.fit` reads top to bottom: a batch, the engine's step, the
position, the hooks. Everything around the step hangs off a few hook methods: metrics, validation
loss, COCO evaluation and checkpoints.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .best import BestTracker, agreed_value, restore_best_file
from .categories import Categories
from .checkpoint import checkpoint_file, load_checkpoint, publish_best, resolve_resume, save_checkpoint
from .config import TrainConfig, config_to_dict
from .data import build_train_loader
from .engines.base import Engine
from .errors import CheckpointError
from .evaluation import evaluate, validation_loss
from .metrics import MetricsWriter
from .run_dir import checkpoint_dir

log = logging.getLogger(__name__)


@dataclass
class Position:
    """Where training stands: `step` optimizer steps done; the next batch is `batch` of `epoch`."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


@dataclass
class TrainResult:
    position: Position
    val: dict[str, float] | None
    eval: dict[str, float] | None
    output_dir: Path
    stopped_early: str | None = None  # the closing line of a --patience stop


class Trainer:
    """Epochs of engine steps, with validation, evaluation, checkpoints and metrics around them.

    `iters_per_epoch` is the composition root's (train.py), the same number the engine's learning-rate
    schedule was built with."""

    def __init__(self, cfg: TrainConfig, engine: Engine, train_set, val_set, iters_per_epoch: int) -> None:
        self.cfg = cfg
        self.engine = engine
        self.train_set = train_set
        self.val_set = val_set
        self.iters_per_epoch = iters_per_epoch
        planned = cfg.epochs * self.iters_per_epoch
        self.total_steps = min(planned, cfg.max_steps) if cfg.max_steps else planned
        self.checkpoint_dir = checkpoint_dir(cfg.output_dir)
        self.position = Position()
        self.metrics = MetricsWriter(cfg.output_dir, engine.is_main, self.total_steps, cfg.print_freq)
        self.last_eval: dict[str, float] | None = None
        self.last_val: dict[str, float] | None = None
        self.best = BestTracker(cfg.best_metric, cfg.patience)
        self.stopped_early: str | None = None
        self._saved_step: int | None = None  # the step of the last checkpoint written, while still current
        self._new_best = False  # the evaluation at this step beat the best: publish its checkpoint

    # -- the loop ---------------------------------------------------------------------------

    def fit(self) -> Position:
        self.resume()
        # Steps after the checkpoint are trained again: their old records would appear twice.
        if dropped := self.metrics.truncate_after(self.position.step):
            log.info("%s: dropped %d record(s) after step %d", self.metrics.path, dropped, self.position.step)
        while self.position.step < self.total_steps:
            epoch = self.position.epoch
            for images, targets in self._loader(epoch, start_batch=self.position.batch):
                started = time.perf_counter()
                losses = self.engine.train_step(self.position.step, images, targets)
                self._advance()
                self.after_step(losses, len(images), time.perf_counter() - started)
                if self.position.step >= self.total_steps:
                    break
            self.after_epoch(epoch)
            if self.best.exhausted and self.position.step < self.total_steps:
                self.stop_early()
                break
        return self.position

    def _advance(self) -> None:
        p = self.position
        p.step += 1
        p.batch += 1
        if p.batch == self.iters_per_epoch:
            p.epoch, p.batch = p.epoch + 1, 0

    def _loader(self, epoch: int, start_batch: int):
        data = self.cfg.data
        return build_train_loader(
            self.train_set,
            data.batch_size,
            epoch=epoch,
            seed=self.cfg.seed,
            rank=self.engine.data_rank,
            world_size=self.engine.data_world_size,
            group_factor=data.aspect_ratio_group_factor,
            num_workers=data.workers,
            start_batch=start_batch,
            pin_memory=self.engine.pin_memory,
        )

    # -- hooks --------------------------------------------------------------------------------

    def after_step(self, losses: dict[str, float], batch_images: int, seconds: float) -> None:
        step = self.position.step
        record = {
            **losses,
            "loss": sum(losses.values()),
            "lr": self.engine.lr(),
            "images_per_s": batch_images * self.engine.data_world_size / max(seconds, 1e-9),
            "epoch": self.position.epoch,
            **self.engine.extra_metrics(),
        }
        self.metrics.write("train", step, record)
        if self.cfg.val_period and step % self.cfg.val_period == 0 and step < self.total_steps:
            self.run_validation()
        if self.cfg.checkpoint_period and step % self.cfg.checkpoint_period == 0:
            self.save()

    def after_epoch(self, epoch: int) -> None:
        """End of an epoch, or of training if it stops inside one: validate, evaluate, save."""
        if self.val_set is not None:
            self.run_validation()
            if self.cfg.eval_every_epoch or self.position.step >= self.total_steps:
                self.run_evaluation()
                self.judge_evaluation()
        self.save()

    def judge_evaluation(self) -> None:
        """Best and patience (best.py), decided alike on every process; the checkpoint saved next holds
        the verdict, and is published as best.pt when this evaluation is a new best."""
        value = agreed_value(self.last_eval, self.best.metric, self.engine.all_reduce_sum)
        self._new_best = self.best.update(value, self.position.step)
        self._saved_step = None  # the tracker changed: a checkpoint of this step must be written again

    def stop_early(self) -> None:
        self.stopped_early = self.best.closing_line()
        if self.engine.is_main:
            log.info("%s", self.stopped_early)

    # -- around the loop ----------------------------------------------------------------------

    def run_validation(self) -> dict[str, float] | None:
        if self.val_set is None:
            return None
        data = self.cfg.data
        self.last_val = validation_loss(self.engine, self.val_set, data.val_batch_size, data.workers)
        self.metrics.write("val", self.position.step, self.last_val)
        return self.last_val

    def run_evaluation(self) -> dict[str, float] | None:
        data = self.cfg.data
        self.last_eval = evaluate(self.engine, self.val_set, data.val_batch_size, data.workers)
        if self.last_eval is not None:
            self.metrics.write("eval", self.position.step, self.last_eval)
        return self.last_eval

    def save(self) -> None:
        if not self.engine.is_main:
            return
        p = self.position
        if self._saved_step == p.step:
            return  # already saved at this step (periodic save on the epoch's last step)
        state = {
            **self.engine.state_dict(),
            "step": p.step,
            "epoch": p.epoch,
            "batch": p.batch,
            "rng": torch.get_rng_state(),
            "engine": self.engine.name,
            "config": config_to_dict(self.cfg),
            # label -> (category id, name): predict labels its drawings without the dataset.
            "categories": Categories.of_dataset(self.train_set).to_state(),
            "best": self.best.to_state(),
        }
        path = save_checkpoint(state, self.checkpoint_dir, p.step, self.cfg.keep_checkpoints)
        self._saved_step = p.step
        log.info("saved %s", path)
        if self._new_best:
            log.info("new best %s %.4f: %s", self.best.metric, self.best.value, publish_best(path))
            self.metrics.write("best", p.step, self.best.record())
            self._new_best = False

    def resume(self) -> None:
        """Continue from --resume (a file, a directory, "auto": the newest in this run's output, or, for
        --test-only, "best"), with the best so far and the patience count the checkpoint holds."""
        source = resolve_resume(self.cfg.resume, self.cfg.output_dir)
        if source is None:
            if self.cfg.resume is not None:
                log.info("resume auto: no checkpoint in %s yet, starting fresh", self.checkpoint_dir)
            return
        source = checkpoint_file(source)
        state = load_checkpoint(source)
        if state.get("engine") not in (None, self.engine.name):
            # Model and optimizer layouts are the same for every engine; only the schedule's position moves.
            log.info(
                "checkpoint %s was written by the %s engine; continuing with %s",
                source,
                state["engine"],
                self.engine.name,
            )
        try:
            self.engine.load_state_dict(state)
        except (KeyError, RuntimeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {source} does not fit this model/engine: {exc}") from exc
        torch.set_rng_state(state["rng"])
        self.position = Position(step=int(state["step"]), epoch=int(state["epoch"]), batch=int(state["batch"]))
        self._saved_step = self.position.step
        self.best.restore(state.get("best"), source)
        if self.engine.is_main and not self.cfg.test_only:
            restore_best_file(self.best, source, self.position.step)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", source, *vars(self.position).values())

    def close(self) -> None:
        self.metrics.close()
