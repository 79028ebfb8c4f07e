"""The training loop every engine shares, built as detectron2's is: a short loop, a step, and hooks.

`TrainerBase.train` is detectron2's loop: `before_train()`, then `run_step()` until the last step (or an
early end), then the boundary's work after each step. `Trainer.run_step` (detectron2's SimpleTrainer)
reads top to bottom: this process's share of the next global batch (batches.py, under the engine's device
prefetch), the engine's step, the position, then the boundary. A variant (elastic_loop.py) replaces the
step, never the loop. Everything around the step is a hook (base.py, hooks.py), chosen by the composition
root (train.py): metrics, the grace check, validation, evaluation with the best checkpoint and patience,
the periodic checkpoint.

After every step the loop asks each hook, once, whether its periodic work is due at this boundary
(`is_due`): that list is the one place that says what runs here. A stop request (stop.py) is honoured at
the boundary, before that work, and inside it (validation and evaluation check between batches): the
names of the due hooks that did not run are saved as pending in the stop's checkpoint, and a resumed run
runs them first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..data.loader import StepBatch
from ..engines.base import Engine
from ..lifetime.stop import Interrupted, RunOver, Stopped, StopRequest
from . import state
from .base import Boundary, Done, HookBase, RunCheckpointer, Saver, Start
from .batches import GlobalBatches, LoaderFactory
from .losses import Samples, UnreadSteps
from .state import Position

log = logging.getLogger(__name__)

__all__ = ["Boundary", "Done", "HookBase", "LoaderFactory", "RunCheckpointer", "Start", "Trainer", "TrainerBase"]


class TrainerBase:
    """The loop and its hooks (detectron2's TrainerBase). `iters_per_epoch`: the composition root's, the
    number the engine's LR schedule was built with; `run_facts`: what every checkpoint carries about the
    run; `checkpointer` (the run's checkpoints in `files`): what the hooks that write checkpoints get."""

    def __init__(
        self,
        engine: Engine,
        iters_per_epoch: int,
        total_steps: int,
        files: Saver,
        stop: StopRequest,
        run_facts: dict[str, Any],
        read_every: int = 1,
    ) -> None:
        self.engine, self.iters_per_epoch, self.total_steps = engine, iters_per_epoch, total_steps
        self.checkpointer = RunCheckpointer(files, self.checkpoint_state)
        self.stop, self.run_facts, self.position = stop, run_facts, Position()
        self.resumed_from: Path | None = None
        self.pending: list[str] = []  # names of hooks a stop kept from running at this position
        self.results: dict[str, dict[str, float] | None] = {}  # hook name -> what its latest run measured
        self.stopped_early: str | None = None  # a hook's closing line when it ended training (--patience)
        self.hooks: list[HookBase] = []
        # The steps' losses stay on the device until a record prints (every `read_every` steps, and a
        # start's first step) or the boundary has work to do: losses.py.
        self.read_every, self.unread, self.first_step = max(1, read_every), UnreadSteps(engine.skips_expected), 1

    def register_hooks(self, hooks: Sequence[HookBase]) -> None:
        for hook in hooks:
            if problem := state.name_problem(self.hooks, hook):
                raise ValueError(problem)
            self.hooks.append(hook)

    def fit(self) -> Position:
        try:
            self.train()
        except RunOver as over:  # an elastic member whose group's run ended elsewhere: nothing left here
            log.info("%s", over)
        finally:
            for hook in self.hooks:
                hook.after_train()
        if self.stopped_early and self.engine.is_main:
            log.info("%s", self.stopped_early)
        return self.position

    def train(self) -> None:
        """detectron2's loop: the start, then one step after another up to the last (or an early end)."""
        self.before_train()
        while not self.finished:
            self.run_step()

    @property
    def finished(self) -> bool:
        return self.position.step >= self.total_steps or bool(self.stopped_early)

    def before_train(self) -> None:
        start = Start(self.position.step, self.resumed_from)
        self.first_step = start.step + 1
        for hook in self.hooks:
            hook.before_train(start)
        self.catch_up()

    def catch_up(self) -> None:
        """On resume, the boundary a stop interrupted (its pending hooks, the checkpoint again without them,
        the epoch's end); then a stop asked while the data loaded or the group formed."""
        if self.pending:
            log.info("resume: running what the stop at step %d left pending: %s", self.position.step, self.pending)
            pending, self.pending = state.pending_hooks(self.hooks, self.pending), []
            self.run_hooks(pending, self.boundary())
            self.close_boundary(self.boundary(), again=True)
        if self.engine.agree_to_stop():
            self.stop_now([])

    def run_step(self) -> None:
        raise NotImplementedError  # one step and its boundary (`after_step`)

    def boundary(self) -> Boundary:
        return Boundary.after(self.position, self.total_steps)

    def after_step(self) -> None:
        at = self.boundary()
        # A start's first step is read at once (torchtitan logs step 1 so): its record says that the data,
        # the model and the loader work, and when, not --print-freq steps later.
        due = at.step == self.first_step or at.final or at.step % self.read_every == 0
        if due or any(hook.is_due(at) for hook in self.hooks):
            self.deliver_steps()
        self.boundary_work(at)

    def boundary_work(self, at: Boundary) -> None:
        """The boundary's stop check, its periodic work, its checkpoint and the epoch's end."""
        due = [hook for hook in self.hooks if hook.is_due(at)]
        # The step boundary: every process of the engine agrees here (a hook's after_step may have asked).
        if self.engine.stop_after_step():
            self.deliver_steps()
            self.stop_now(due)
        self.run_hooks(due, at)
        self.close_boundary(at)

    def close_boundary(self, at: Boundary, again: bool = False) -> None:
        """The checkpoint the boundary's work asked for (`again`: written in any case), then the epoch's end."""
        self.checkpointer.write_requested(at.step, again)
        for hook in self.hooks if at.epoch_end else ():
            hook.after_epoch(at)

    def deliver_steps(self) -> None:
        """The unread steps' results to every hook, in order, after one host read (losses.py)."""
        for at, result in self.unread.read():
            for hook in self.hooks:
                hook.after_step(at, result)

    def run_hooks(self, due: list[HookBase], at: Boundary) -> None:
        """The boundary's periodic work in order; a stop agreed inside one leaves it and the rest pending."""
        for i, hook in enumerate(due):
            try:
                done = hook.run(at)
            except Interrupted:
                self.stop_now(due[i:], during=hook.name)
            self.hook_ran(hook, done)

    def hook_ran(self, hook: HookBase, done: Done | None) -> None:
        """A hook's periodic work is done: keep what it measured, and its closing line if it ends training."""
        if done is not None:
            self.results[hook.name] = done.values
            self.stopped_early = self.stopped_early or done.ends_training

    def stop_now(self, due: list[HookBase], during: str = "") -> None:
        """Every process agreed to stop here: save this step with the due hooks pending, then raise Stopped."""
        step = self.position.step
        log.info("%s: stopping at step %d%s", self.stop.reason, step, f" during {during}" if during else "")
        self.pending = [hook.name for hook in due if hook.pending_after_stop]
        if step == 0:
            raise Stopped.before_any_step(self.stop, during)
        path = self.checkpointer.save(step, again=True)
        # Every process waits here for the main one's checkpoint: none leaves before it is written (a
        # supervisor such as torchrun's agent ends the group as soon as one process has exited).
        self.engine.all_reduce_sum(torch.zeros(1))
        left = f" ({', '.join(self.pending)} pending: run on resume)" if self.pending else ""
        self.stop.finish(f"checkpoint of step {step}{left}: {path}")
        raise Stopped(self.stop, during)

    def checkpoint_state(self) -> dict[str, Any]:
        return state.capture(self.engine, self.position, self.pending, self.hooks, self.run_facts)

    def restore(self, saved: dict[str, Any], source: Path) -> None:
        """Continue from a loaded checkpoint: the engine, RNG, position, pending hooks and every hook's state."""
        self.position, self.pending = state.restore(self.engine, self.hooks, saved, source)
        self.resumed_from = Path(source)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", source, *vars(self.position).values())


class Trainer(TrainerBase):
    """Every engine's step (detectron2's SimpleTrainer): this process's share of the next global batch
    from `loader` (batches.py, under the engine's device prefetch), the engine's step, the position,
    then the boundary. A variant (elastic_loop.py) replaces the step, never the loop."""

    samples_in_result = True  # the sample record's line of a step goes with its result (samples.py)

    def __init__(self, engine: Engine, loader: LoaderFactory, *args: Any, **kwargs: Any) -> None:
        """`loader`: (epoch, first global batch) -> the steps of that epoch (batches.py); the rest as
        TrainerBase's."""
        super().__init__(engine, *args, **kwargs)
        self.batches = GlobalBatches(loader, engine)

    @property
    def loader(self) -> LoaderFactory:
        """The steps of an epoch from a global batch on, as the data gives them (no device prefetch)."""
        return self.batches.loader

    @property
    def record_rank(self) -> int:
        """The rank whose file this process's sample record is (training/samples.py)."""
        return self.engine.data_rank

    def run_step(self) -> None:
        batch = self.batches.at(self.position)
        self.before_step(batch)
        started = time.perf_counter()
        losses = self.engine.train_micro_batches(self.position.step, batch.micro_batches)
        self.step_done(batch, started, losses)
        self.after_step()

    def before_step(self, batch: StepBatch) -> None:
        """Before the step trains on `batch` (nothing here)."""

    def step_done(self, batch: StepBatch, started: float, losses: Mapping[str, Any]) -> None:
        """The step just trained on `batch`: the position moves on, and its losses wait, unread, with what
        else the step's record needs (losses.py) until the loop reads them."""
        samples = self.samples(batch) if self.samples_in_result else None
        self.position.advance(self.iters_per_epoch)
        engine = self.engine
        facts = (engine.skipped(), batch.images, engine.lr(), engine.extra_metrics(), samples)
        self.unread.add(self.boundary(), started, dict(losses), *facts)

    def samples(self, batch: StepBatch) -> Samples:
        """The images this process trains on in the step at the position (the sample record's line)."""
        p, engine = self.position, self.engine
        return Samples(p.epoch, p.batch, batch.share.trained, engine.data_rank, engine.data_world_size)
