"""What the loop and its hooks agree on (detectron2's HookBase, with its collaborators passed in): where a
fit starts (`Start`), the boundary after a step (`Boundary`), what a hook's periodic work gave (`Done`),
the hook's methods (`HookBase`), and the run's checkpoints a hook asks for (`RunCheckpointer`).

A hook is given its collaborators when it is made (the engine, the metrics writer, the run's
checkpointer) and what happened through its methods' arguments; no hook needs another to run before or
after it, and each keeps its own state in the checkpoint, under "hooks", by its name (state.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from .losses import StepResult
from .state import Position


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

    @classmethod
    def after(cls, position: Position, total_steps: int) -> Boundary:
        """The boundary at `position`, the run's last at `total_steps`."""
        final = position.step >= total_steps
        epoch_end = (position.batch == 0 and position.step > 0) or final
        return cls(step=position.step, epoch=position.epoch, epoch_end=epoch_end, final=final)


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
