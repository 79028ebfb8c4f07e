"""The training loop every engine shares, built as detectron2's `TrainerBase` is: a short loop and hooks.

`Trainer.fit` reads top to bottom: a batch, the engine's step, the position, then the hooks. Everything
around the step is a hook (hooks.py), chosen by the composition root (train.py): metrics, the grace
check, validation, evaluation with the best checkpoint and patience, the periodic checkpoint. A hook is
given its collaborators when it is made (the engine, the metrics writer, the run's checkpointer) and
what happened through its methods' arguments; what its periodic work measured it returns (`Done`).
No hook needs another to run before or after it. Each keeps its own state in the checkpoint, under
"hooks", by its name (state.py).

After every step the loop asks each hook, once, whether its periodic work is due at this boundary
(`is_due`): that list is the one place that says what runs here. A stop request (stop.py) is honoured at
the boundary, before that work, and inside it (validation and evaluation check between batches): the
names of the due hooks that did not run are saved as pending in the stop's checkpoint, and a resumed run
runs them first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch

from ..data.loader import StepBatch
from ..engines.base import Engine
from ..lifetime.stop import Interrupted, Stopped, StopRequest
from . import state
from .losses import Samples, StepResult, UnreadSteps
from .state import Position

log = logging.getLogger(__name__)

#: The steps of one epoch from a global batch on: (epoch, start_batch) -> this process's share of each
#: global batch (data/plan.py), its micro-batches loaded.
LoaderFactory = Callable[[int, int], Iterable[StepBatch]]


@dataclass(frozen=True)
class Start:
    """Where a fit starts: the position's step, and the checkpoint it resumed from (None: a fresh run)."""

    step: int
    resumed_from: Path | None


@dataclass(frozen=True)
class Boundary:
    """The boundary after a step, where hooks decide whether their periodic work is due."""

    step: int
    epoch: int  # the position's epoch after this step: the next batch's
    epoch_end: bool  # this step ended an epoch, or training inside one
    final: bool  # the last planned step


@dataclass(frozen=True)
class Done:
    """What a hook's periodic work gave the run: the values it measured (validation losses, COCO AP;
    None where this process holds none), and its closing line when that work ends training."""

    values: dict[str, float] | None = None
    ends_training: str | None = None


class Saver(Protocol):
    """Writes checkpoint files (checkpoint.Checkpointer): one write per step unless asked `again`, a
    trial write, and best.pt."""

    def save(self, state: Callable[[], dict[str, Any]], step: int, again: bool = False) -> Path: ...

    def trial(self, state: dict[str, Any]) -> None: ...

    def publish_best(self, checkpoint: Path) -> Path: ...


class RunCheckpointer:
    """The run's checkpoints. A hook asks for its boundary's checkpoint (`request`); the loop writes it
    once the boundary's work is done (`write_requested`), so that it holds what every hook did there,
    whatever their order, and hands it to whoever asked to see it (a new best publishes it). Each
    write captures the run as it is then (the Trainer's state, every hook's included) into `files`."""

    def __init__(self, files: Saver, capture: Callable[[], dict[str, Any]]) -> None:
        self.files, self.capture = files, capture
        self._requested = False
        self._then: list[Callable[[Path], None]] = []

    def request(self, then: Callable[[Path], None] | None = None) -> None:
        """This boundary's checkpoint, once its work is done; `then(path)` after it is written."""
        self._requested = True
        self._then += [then] if then is not None else []

    def write_requested(self, step: int, again: bool = False) -> None:
        """The loop, after a boundary's work: the checkpoint asked for, handed on (`again`: written even
        when none was asked for or the step has one: what is pending changed)."""
        if self._requested or again:
            path = self.save(step, again)
            for then in self._then:
                then(path)
        self._requested, self._then = False, []

    def save(self, step: int, again: bool = False) -> Path:
        """`step`'s checkpoint (the main process writes it; every process gets its path). `again`: write
        it even when this step has one (a stop or a resume changes what is pending)."""
        return self.files.save(self.capture, step, again)

    def trial(self) -> None:
        """What a checkpoint write costs here, without a checkpoint to show for it (grace.py)."""
        self.files.trial(self.capture())

    def publish_best(self, checkpoint: Path) -> Path:
        """`checkpoint`, one just written, as best.pt."""
        return self.files.publish_best(checkpoint)


class HookBase:
    """Something the Trainer calls around its steps (detectron2's HookBase). Every method is optional.

    - `before_train(start)`: after a resume, before any pending work and the first step;
    - `after_step(at, result)`: after every step, before the boundary's periodic work (records,
      measurements);
    - `is_due(at)` and `run(at)`: periodic work at a step boundary (validation, evaluation, a
      checkpoint), which may return what it measured and end training (`Done`). A stop before or
      inside `run` (Interrupted) leaves it pending, by `name`, unless `pending_after_stop` is False
      (the stop's own checkpoint does that work);
    - `after_epoch(at)`: at every epoch end, after the boundary's work;
    - `after_train`: once the loop ends, whichever way;
    - `state_dict` / `load_state_dict`: the hook's part of the checkpoint, under its `name`.
    """

    name: ClassVar[str] = ""
    pending_after_stop: ClassVar[bool] = True

    def before_train(self, start: Start) -> None:
        pass

    def after_step(self, at: Boundary, result: StepResult) -> None:
        pass

    def is_due(self, at: Boundary) -> bool:
        return False

    def run(self, at: Boundary) -> Done | None:
        return None

    def after_epoch(self, at: Boundary) -> None:
        pass

    def after_train(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: Any, source: Path) -> None:
        pass


class Trainer:
    """Epochs of engine steps with hooks around them. `iters_per_epoch` is the composition root's
    (train.py), the same number the engine's learning-rate schedule was built with; `run_facts` are
    what every checkpoint carries about the run (engine, config, categories). Its `checkpointer` (the
    run's checkpoints in `files`) is what the hooks that write checkpoints are given."""

    # The sample record's line of a step goes with its result to the hooks (training/samples.py).
    samples_in_result = True

    def __init__(
        self,
        engine: Engine,
        loader: LoaderFactory,
        iters_per_epoch: int,
        total_steps: int,
        files: Saver,
        stop: StopRequest,
        run_facts: dict[str, Any],
        read_every: int = 1,
    ) -> None:
        self.engine = engine
        self.loader = loader
        self.iters_per_epoch = iters_per_epoch
        self.total_steps = total_steps
        self.checkpointer = RunCheckpointer(files, self.checkpoint_state)
        self.stop = stop
        self.run_facts = run_facts
        self.position = Position()
        self.pending: list[str] = []  # names of hooks a stop kept from running at this position
        self.resumed_from: Path | None = None
        self.results: dict[str, dict[str, float] | None] = {}  # hook name -> what its latest run measured
        self.stopped_early: str | None = None  # a hook's closing line when it ended training (--patience)
        self.hooks: list[HookBase] = []
        # The steps' losses stay on the device until a record prints (every `read_every` steps) or the
        # boundary has work to do: losses.py.
        self.read_every = max(1, read_every)
        self.unread = UnreadSteps(engine.skips_expected)
        self.first_step = 1  # this fit's first step: read at once (after_step)

    @property
    def record_rank(self) -> int:
        """The rank whose file this process's sample record is (training/samples.py)."""
        return self.engine.data_rank

    def register_hooks(self, hooks: Sequence[HookBase]) -> None:
        for hook in hooks:
            if problem := state.name_problem(self.hooks, hook):
                raise ValueError(problem)
            self.hooks.append(hook)

    # -- the loop ---------------------------------------------------------------------------

    def fit(self) -> Position:
        try:
            self.train()
        finally:
            for hook in self.hooks:
                hook.after_train()
        if self.stopped_early and self.engine.is_main:
            log.info("%s", self.stopped_early)
        return self.position

    def train(self) -> None:
        """The hooks' start, what a stop left pending, then the steps up to the last (or an early end)."""
        start = Start(self.position.step, self.resumed_from)
        self.first_step = start.step + 1
        for hook in self.hooks:
            hook.before_train(start)
        self.catch_up()
        while self.position.step < self.total_steps and not self.stopped_early:
            for batch in self.engine.on_device(self.loader(self.position.epoch, self.position.batch)):
                started = time.perf_counter()
                losses = self.engine.train_micro_batches(self.position.step, batch.micro_batches)
                self.step_done(batch, started, losses)
                self.after_step()
                if self.position.step >= self.total_steps or self.stopped_early:
                    break

    def catch_up(self) -> None:
        """Before the first step: what a stop left pending, and a stop asked while the data loaded or the
        group formed."""
        self.run_pending()
        if self.engine.agree_to_stop():
            self.stop_now([])

    def step_done(self, batch: StepBatch, started: float, losses: Mapping[str, Any]) -> None:
        """The step just trained on `batch`: the position moves on, and its losses wait, unread, with what
        else the step's record needs (losses.py) until the loop reads them."""
        samples = self._samples(batch) if self.samples_in_result else None
        self._advance()
        engine = self.engine
        facts = (engine.skipped(), batch.images, engine.lr(), engine.extra_metrics(), samples)
        self.unread.add(self.boundary(), started, dict(losses), *facts)

    def _samples(self, batch: StepBatch) -> Samples:
        p, engine = self.position, self.engine
        return Samples(p.epoch, p.batch, batch.share.trained, engine.data_rank, engine.data_world_size)

    def _advance(self) -> None:
        p = self.position
        p.step += 1
        p.batch += 1
        if p.batch == self.iters_per_epoch:
            p.epoch, p.batch = p.epoch + 1, 0

    def boundary(self) -> Boundary:
        p = self.position
        final = p.step >= self.total_steps
        epoch_end = (p.batch == 0 and p.step > 0) or final
        return Boundary(step=p.step, epoch=p.epoch, epoch_end=epoch_end, final=final)

    def after_step(self) -> None:
        at = self.boundary()
        # A start's first step is read at once too (torchtitan logs step 1 so): its record is what says
        # that the data, the model and the loader work, and when, not --print-freq steps later.
        first = at.step == self.first_step
        if first or at.final or at.step % self.read_every == 0 or any(hook.is_due(at) for hook in self.hooks):
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
        self.checkpointer.write_requested(at.step)
        if at.epoch_end:
            for hook in self.hooks:
                hook.after_epoch(at)

    def deliver_steps(self) -> None:
        """The unread steps' results to every hook, in order, after one host read; a diverged step
        ends the run here (losses.py)."""
        for at, result in self.unread.read():
            for hook in self.hooks:
                hook.after_step(at, result)

    def run_hooks(self, due: list[HookBase], at: Boundary) -> None:
        """The boundary's periodic work in order, keeping what each measured; a stop agreed inside one
        leaves it and the rest pending."""
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

    def run_pending(self) -> None:
        """On resume, finish the boundary a stop interrupted: the hooks it kept from running, the checkpoint
        again without them (so that a later resume does not run them twice), and the epoch's end."""
        if not self.pending:
            return
        log.info("resume: running what the stop at step %d left pending: %s", self.position.step, self.pending)
        by_name = {hook.name: hook for hook in self.hooks}
        if unknown := [name for name in self.pending if name not in by_name]:
            log.warning("resume: %s left pending, but this run has no such hook: not run", ", ".join(unknown))
        pending, self.pending = [by_name[name] for name in self.pending if name in by_name], []
        at = self.boundary()
        self.run_hooks(pending, at)
        self.checkpointer.write_requested(at.step, again=True)
        if at.epoch_end:
            for hook in self.hooks:
                hook.after_epoch(at)

    # -- stopping -----------------------------------------------------------------------------

    def stop_now(self, due: list[HookBase], during: str = "") -> None:
        """Every process agreed to stop here: save this step with the due hooks pending, then raise Stopped."""
        step = self.position.step
        log.info("%s: stopping at step %d%s", self.stop.reason, step, f" during {during}" if during else "")
        self.pending = [hook.name for hook in due if hook.pending_after_stop]
        if step == 0:
            raise Stopped.before_any_step(self.stop, during)
        path = self.save(again=True)
        # Every process waits here for the main one's checkpoint: none leaves before it is written (a
        # supervisor such as torchrun's agent ends the group as soon as one process has exited).
        self.engine.all_reduce_sum(torch.zeros(1))
        left = f" ({', '.join(self.pending)} pending: run on resume)" if self.pending else ""
        self.stop.finish(f"checkpoint of step {step}{left}: {path}")
        raise Stopped(self.stop, during)

    # -- checkpoints --------------------------------------------------------------------------

    def save(self, again: bool = False) -> Path:
        """This step's checkpoint (the main process writes it; every process gets its path). `again`:
        write it even when this step has one (a stop or a resume changes what is pending)."""
        return self.checkpointer.save(self.position.step, again)

    def checkpoint_state(self) -> dict[str, Any]:
        return state.capture(self.engine, self.position, self.pending, self.hooks, self.run_facts)

    def restore(self, saved: dict[str, Any], source: Path) -> None:
        """Continue from a loaded checkpoint: the engine, the position, the RNG, the pending hooks and
        every hook's state."""
        self.position, self.pending = state.restore(self.engine, saved, source)
        self.resumed_from = Path(source)
        state.restore_hooks(self.hooks, saved, source)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", source, *vars(self.position).values())
