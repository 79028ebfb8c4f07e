"""The steps' loss terms, read from the device in one transfer where the run needs their values.

An engine's step returns its loss terms where it computed them and reads nothing back (engines/base.py);
a GPU then runs ahead of the host across steps. `UnreadSteps` keeps what each step returned, and the
loop reads all of it at once where a record is printed (every --print-freq steps, and a start's first
step), before a boundary's work (validation, evaluation, a checkpoint), at a stop and at the end.
Invariant: a step is read once, in order, and no hook sees a step before it is read. A non-finite loss
(or, outside fp16's dynamic scaling, a skipped update) at any step read ends the run there
(engines.base.check_finite), naming that step: the engine changed no weight at it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ..engines.base import check_finite


@dataclass(frozen=True)
class StepResult:
    """What one step gave, once read: its loss terms (averaged over the data-parallel world), its
    batch's image count on this process, its seconds (the read window's wall time, from its first
    step's start to the read, shared evenly: a step's own time on a GPU is not known without a read),
    the learning rate it trained at, the engine's figures of it, and whether its update was skipped
    (fp16's overflowing steps)."""

    losses: dict[str, float]
    images: int
    seconds: float
    lr: float
    extras: dict[str, float]
    skipped: bool = False
    samples: Samples | None = None  # what this process trained on in the step


@dataclass(frozen=True)
class Samples:
    """The images a process trained on in a step: global batch `batch` of `epoch`, its dataset `indices`
    (weighted ones; fillers left out), on data-parallel rank `rank` of `world_size`."""

    epoch: int
    batch: int
    indices: tuple[int, ...]
    rank: int
    world_size: int


@dataclass(frozen=True)
class _Unread:
    at: Any  # the loop's Boundary after the step
    started: float  # time.perf_counter() when the step began
    losses: dict[str, torch.Tensor]
    skipped: torch.Tensor | None
    images: int
    lr: float
    extras: dict[str, float]
    samples: Samples | None


class UnreadSteps:
    """Steps done but not read yet. `skips_expected`: the engine's (a skipped update is then fp16's
    overflow, counted in the record, not a divergence)."""

    def __init__(self, skips_expected: bool) -> None:
        self.skips_expected = skips_expected
        self._steps: list[_Unread] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(
        self,
        at: Any,
        started: float,
        losses: dict[str, torch.Tensor],
        skipped: torch.Tensor | None,
        images: int,
        lr: float,
        extras: dict[str, float],
        samples: Samples | None = None,
    ) -> None:
        self._steps.append(_Unread(at, started, losses, skipped, images, lr, extras, samples))

    def read(self) -> list[tuple[Any, StepResult]]:
        """Every unread step's result, in order, from one host read; raises TrainingError at the first
        step whose loss is not finite (or whose update was skipped where skips are not expected)."""
        if not self._steps:
            return []
        steps, self._steps = self._steps, []
        seconds = (time.perf_counter() - steps[0].started) / len(steps)
        flat = [torch.as_tensor(t).reshape(()).float() for s in steps for t in _flags_and_terms(s)]
        device = next((t.device for t in flat if t.device.type != "cpu"), torch.device("cpu"))
        values = iter(torch.stack([t.to(device) for t in flat]).tolist())
        results = []
        for s in steps:
            skipped = bool(next(values)) if s.skipped is not None else False
            losses = {name: next(values) for name in s.losses}
            check_finite(s.at.step, losses, skipped and not self.skips_expected, read_at=steps[-1].at.step)
            results.append((s.at, StepResult(losses, s.images, seconds, s.lr, s.extras, skipped, s.samples)))
        return results


def _flags_and_terms(step: _Unread) -> list[torch.Tensor | float]:
    return ([step.skipped] if step.skipped is not None else []) + list(step.losses.values())
