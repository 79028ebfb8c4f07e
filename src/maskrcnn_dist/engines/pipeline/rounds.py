"""One round (a training step, or an evaluation or validation batch) on one stage host: the order of its
replicas' ops, what each micro-batch keeps between its forward and its backward, and what the round leaves
for the step's update (loss terms, a non-finite flag, errors).

Ordering. RPC runs requests on a thread pool, so a replica's calls arrive in any order. Each replica has
a `Turnstile` that lets its ops through one at a time in the order of its schedule (schedule.py). That
keeps BatchNorm statistics, gradient sums and therefore runs reproducible, bounds what a replica holds
(1F1B), and is what makes the pipeline overlap: stage 1 runs micro-batch k+1 while stage 2 runs k.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .schedule import Op, replica_ops, stage_ops

MODES = ("train", "eval", "validate")


@dataclass(frozen=True)
class Ticket:
    """What travels with a micro-batch from stage to stage besides its tensors: plain values only."""

    round_id: int  # the master's count of rounds: rounds never overlap
    step: int  # the optimizer step (seeding position)
    micro: int  # the micro-batch's index in the round
    micro_batches: int  # how many the round has
    mode: str  # one of MODES
    schedule: str = "1f1b"  # schedule.SCHEDULES
    loss_weight: float = 1.0  # the micro-batch's share of the batch's images (the last stage weighs its loss)
    loss_scale: float = 1.0  # fp16's loss scale (the last stage scales its loss); 1.0 otherwise

    @property
    def train(self) -> bool:
        return self.mode == "train"


class Turnstile:
    """Lets a replica's ops through one at a time in (round, position) order. Rounds never overlap: an op
    of an older round than the one begun is refused (its round was abandoned after a failure)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._round = -1
        self._next = 0

    @contextmanager
    def turn(self, round_id: int, index: int) -> Iterator[None]:
        def ready() -> bool:
            return round_id < self._round or index == (self._next if round_id == self._round else 0)

        with self._cond:
            self._cond.wait_for(ready)
            if round_id < self._round:
                raise RuntimeError(f"round {round_id} was abandoned: round {self._round} has begun")
        try:
            yield
        finally:  # advance even on error, or later ops of the round would wait forever
            with self._cond:
                self._round, self._next = round_id, index + 1
                self._cond.notify_all()

    def wait_past(self, round_id: int, count: int, timeout: float) -> bool:
        """Wait until the first `count` ops of round `round_id` have passed; False after `timeout` seconds."""
        with self._cond:
            return self._cond.wait_for(
                lambda: count == 0 or self._round > round_id or (self._round == round_id and self._next >= count),
                timeout,
            )


@dataclass
class Kept:
    """A micro-batch between its forward and its backward on one replica: the leaves its input became
    (their gradients go back to the stage before) and what its backward starts from (the tensors it sent
    on, whose gradients come back; on the last stage its scaled loss)."""

    inputs: list[Tensor]
    outputs: list[Tensor]


@dataclass
class StepMeter:
    """Per-round figures of a host (reported by the training step's update)."""

    cpu_start: float = field(default_factory=time.process_time)
    forward_s: float = 0.0
    backward_s: float = 0.0
    bytes_forward: int = 0
    bytes_backward: int = 0
    peak_in_flight: int = 0

    def report(self) -> dict[str, float]:
        # Process CPU time: forward, backward, optimizer step and RPC work, all threads together; idle
        # waiting costs none. Meaningful with one intra-op thread.
        return {
            "busy_s": time.process_time() - self.cpu_start,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "bytes_forward": float(self.bytes_forward),
            "bytes_backward": float(self.bytes_backward),
            "peak_in_flight": float(self.peak_in_flight),
        }


class Round:
    """One round on a stage host of `stages` stages, at position `stage`, with `replicas` replicas."""

    def __init__(self, ticket: Ticket, stages: int, stage: int, replicas: int) -> None:
        self.id, self.step, self.mode = ticket.round_id, ticket.step, ticket.mode
        ops = stage_ops(ticket.schedule, stages, stage, ticket.micro_batches, ticket.train)
        self.ops = [replica_ops(ops, replicas, r) for r in range(replicas)]
        self._position = [{op: i for i, op in enumerate(ops)} for ops in self.ops]
        self.kept: dict[int, Kept] = {}
        self.losses: dict[int, dict[str, Tensor]] = {}  # the last stage's loss terms per micro-batch, detached
        self.nonfinite: list[Tensor | None] = [None] * replicas  # per replica: a loss was not finite (device flag)
        self.errors: list[str] = []
        self.meter = StepMeter()
        self.log: list[tuple[int, Op]] = []  # (replica, op) in the order they ran: what the schedule did
        self._lock = threading.Lock()

    def position(self, replica: int, op: Op) -> int:
        found = self._position[replica].get(op)
        if found is None:
            raise RuntimeError(f"round {self.id}: replica {replica} has no op {op} in its schedule {self.ops[replica]}")
        return found

    def ran(self, replica: int, op: Op) -> None:
        with self._lock:
            self.log.append((replica, op))

    def keep(self, micro: int, kept: Kept) -> None:
        """Hold micro-batch `micro` until its backward; the meter counts the most the stage holds."""
        with self._lock:
            self.kept[micro] = kept
            self.meter.peak_in_flight = max(self.meter.peak_in_flight, len(self.kept))

    def release(self, micro: int) -> Kept:
        with self._lock:
            kept = self.kept.pop(micro, None)
        if kept is None:
            raise RuntimeError(f"round {self.id}: no forward of micro-batch {micro} kept for its backward")
        return kept

    def flag_nonfinite(self, replica: int, loss: Tensor) -> None:
        """Fold `loss` not being finite into the replica's flag, on the device (no host read)."""
        bad = ~torch.isfinite(loss.detach())
        previous = self.nonfinite[replica]
        self.nonfinite[replica] = bad if previous is None else previous | bad

    def fail(self, what: str) -> None:
        with self._lock:
            self.errors.append(what)

    def next_is(self, replica: int, index: int, kind: str) -> bool:
        ops = self.ops[replica]
        return index < len(ops) and ops[index].kind == kind


class Rounds:
    """A host's current round, begun by the first op of a newer round to arrive (any replica's)."""

    def __init__(self, stages: int, stage: int, replicas: int) -> None:
        self.stages, self.stage, self.replicas = stages, stage, replicas
        self.current: Round | None = None
        self._lock = threading.Lock()

    def for_ticket(self, ticket: Ticket, begin: Callable[[Round], None]) -> Round:
        """The round `ticket` belongs to; `begin(round)` runs once, when a newer round begins here."""
        if ticket.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {ticket.mode!r}")
        with self._lock:
            current = self.current
            if current is not None and ticket.round_id < current.id:
                raise RuntimeError(f"round {ticket.round_id} was abandoned: round {current.id} has begun")
            if current is None or ticket.round_id > current.id:
                current = self.current = Round(ticket, self.stages, self.stage, self.replicas)
                begin(current)
            return current

    def get(self, round_id: int) -> Round:
        current = self.current
        if current is None or current.id != round_id:
            raise RuntimeError(f"round {round_id} is not this stage's current round")
        return current


def wait_done(round_: Round, turnstiles: Sequence[Turnstile], timeout: float, what: str) -> None:
    """Wait until every replica has run its whole schedule of `round_`; RuntimeError naming what is missing."""
    for r, (gate, ops) in enumerate(zip(turnstiles, round_.ops)):
        if not gate.wait_past(round_.id, len(ops), timeout):
            done = sum(1 for replica, _ in round_.log if replica == r)
            raise RuntimeError(
                f"{what}, replica {r}: only {done} of its {len(ops)} ops ran within {timeout:g}s "
                f"(next: {ops[done] if done < len(ops) else '-'})"
            )
