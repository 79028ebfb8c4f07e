"""The training loop every engine shares.

Like detectron2's train loop, `Trainer.fit` reads top to bottom: a batch, the engine's step, the
position, the hooks. Everything around the step hangs off a few hook methods: metrics, validation
loss, COCO evaluation with the best checkpoint and patience (best.py), and checkpoints. A stop request
(stop.py) is honoured at each step boundary and inside validation and evaluation; the hooks it keeps
from running are saved as pending in the checkpoint, and a resumed run runs them first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .best import BestTracker, agreed_value, restore_best_file
from .categories import Categories
from .checkpoint import (
    checkpoint_file,
    checkpoint_path,
    load_checkpoint,
    publish_best,
    resolve_resume,
    save_checkpoint,
    trial_write,
)
from .config import TrainConfig, config_to_dict
from .data import build_train_loader
from .engines.base import Engine
from .errors import CheckpointError
from .evaluation import evaluate, validation_loss
from .grace import GraceCheck
from .metrics import MetricsWriter
from .run_dir import checkpoint_dir
from .stop import Interrupted, Stopped, StopRequest

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

    def __init__(
        self,
        cfg: TrainConfig,
        engine: Engine,
        train_set,
        val_set,
        iters_per_epoch: int,
        stop: StopRequest | None = None,
        grace_s: float | None = None,
    ) -> None:
        """`stop`: the process's stop request (engine.stop, for the engine's agreement); `grace_s`: the
        pod's termination grace period, checked once against a step and a checkpoint write (grace.py)."""
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
        self.stop = stop or StopRequest()  # not installed: nothing asks
        self.grace = GraceCheck(grace_s if engine.is_main else None)
        # Hooks due at this position that a stop kept from running: saved with the checkpoint, run first on resume.
        self.pending: list[str] = []
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
        self.run_pending()
        if self.engine.agree_to_stop():  # asked while the data loaded or the group formed
            self.stop_now([])
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
        periodic = self.cfg.val_period and step % self.cfg.val_period == 0 and step < self.total_steps
        due = ["validation"] if periodic else []
        # What after_epoch runs next when this step ended the epoch: pending too if a stop comes first.
        then = self.epoch_end_hooks() if self.position.batch == 0 or step >= self.total_steps else []
        if self.engine.stop_after_step():  # the step boundary: every process of the engine agrees here
            self.stop_now(due + then)
        self.grace.after_step(seconds, self.trial_save, last=step >= self.total_steps)
        self.run_hooks(due, then)
        if self.cfg.checkpoint_period and step % self.cfg.checkpoint_period == 0:
            self.save()

    def after_epoch(self, epoch: int) -> None:
        """End of an epoch, or of training if it stops inside one: validate, evaluate, save."""
        self.run_hooks(self.epoch_end_hooks())
        self.save()

    def epoch_end_hooks(self) -> list[str]:
        if self.val_set is None:
            return []
        final = self.position.step >= self.total_steps
        return ["validation", "evaluation"] if self.cfg.eval_every_epoch or final else ["validation"]

    def run_hooks(self, hooks: list[str], then: list[str] | None = None) -> None:
        """Run `hooks` in order; a stop agreed inside one saves it, the rest and `then` (the hooks due
        after these at this step) as pending."""
        for i, name in enumerate(hooks):
            try:
                {"validation": self.run_validation, "evaluation": self.evaluate_and_judge}[name]()
            except Interrupted:
                self.stop_now(hooks[i:] + (then or []), during=name)

    def run_pending(self) -> None:
        """On resume: the hooks a stop kept from running at the checkpoint's step, then the checkpoint
        again without them (so that a later resume does not run them twice)."""
        if self.pending:
            log.info("resume: running what the stop at step %d left pending: %s", self.position.step, self.pending)
            hooks, self.pending = self.pending, []
            self.run_hooks(hooks)
            self.save(again=True)

    def evaluate_and_judge(self) -> None:
        """COCO evaluation, then best and patience (best.py), decided alike on every process; the
        checkpoint saved next holds the verdict, and is published as best.pt when this is a new best."""
        self.run_evaluation()
        value = agreed_value(self.last_eval, self.best.metric, self.engine.all_reduce_sum)
        self._new_best = self.best.update(value, self.position.step)
        self._saved_step = None  # the tracker changed: a checkpoint of this step must be written again

    def stop_early(self) -> None:
        self.stopped_early = self.best.closing_line()
        if self.engine.is_main:
            log.info("%s", self.stopped_early)

    # -- stopping -----------------------------------------------------------------------------

    def stop_now(self, pending: list[str], during: str = "") -> None:
        """Every process agreed to stop here: save this step with `pending`, then raise Stopped."""
        step = self.position.step
        log.info("%s: stopping at step %d%s", self.stop.reason, step, f" during {during}" if during else "")
        self.pending = pending
        if step == 0:
            raise Stopped.before_any_step(self.stop, during)
        path = self.save(again=True)
        # Every process waits here for the main one's checkpoint: none leaves before it is written (a
        # supervisor such as torchrun's agent ends the group as soon as one process has exited).
        self.engine.all_reduce_sum(torch.zeros(1))
        left = f" ({', '.join(pending)} pending: run on resume)" if pending else ""
        self.stop.finish(f"checkpoint of step {step}{left}: {path}")
        raise Stopped(self.stop, during)

    def trial_save(self) -> None:
        """Write this step's checkpoint to a temporary file and remove it: what a stop would cost."""
        trial_write(self.checkpoint_state(), self.checkpoint_dir)

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

    def save(self, again: bool = False) -> Path:
        """This step's checkpoint (the main process writes it; every process gets its path). `again`:
        write it even when this step has one (a stop or a resume changes what is pending)."""
        step = self.position.step
        path = checkpoint_path(self.checkpoint_dir, step)
        if not self.engine.is_main or (not again and self._saved_step == step):
            return path  # already saved at this step (periodic save on the epoch's last step)
        save_checkpoint(self.checkpoint_state(), self.checkpoint_dir, step, self.cfg.keep_checkpoints)
        self._saved_step = step
        log.info("saved %s", path)
        if self._new_best:
            log.info("new best %s %.4f: %s", self.best.metric, self.best.value, publish_best(path))
            self.metrics.write("best", step, self.best.record())
            self._new_best = False
        return path

    def checkpoint_state(self) -> dict:
        p = self.position
        return {
            **self.engine.state_dict(),
            "step": p.step,
            "epoch": p.epoch,
            "batch": p.batch,
            "pending_hooks": list(self.pending),
            "rng": torch.get_rng_state(),
            "engine": self.engine.name,
            "config": config_to_dict(self.cfg),
            # label -> (category id, name): predict labels its drawings without the dataset.
            "categories": Categories.of_dataset(self.train_set).to_state(),
            "best": self.best.to_state(),
        }

    def resume(self) -> None:
        """Continue from --resume (a file, a directory, "auto": the newest in this run's output, or, for
        --test-only, "best"), with the best so far, the patience count and the pending hooks the
        checkpoint holds."""
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
        self.pending = list(state.get("pending_hooks", []))
        self._saved_step = self.position.step
        self.best.restore(state.get("best"), source)
        if self.engine.is_main and not self.cfg.test_only:
            restore_best_file(self.best, source, self.position.step)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", source, *vars(self.position).values())

    def close(self) -> None:
        self.metrics.close()
