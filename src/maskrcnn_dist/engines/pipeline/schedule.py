"""Pipeline schedules: the order in which one stage replica runs its micro-batches' forwards and backwards.

A stage runs micro-batch k's forward ("F", k) and, in training, its backward ("B", k), in the order its
schedule gives; each op waits for its turn (rounds.py), whenever its call arrives. Micro-batch k runs on
replica k % R of a stage with R replicas, which keeps its ops in the stage's order (`replica_ops`).

- GPipe: every forward, then every backward. A replica keeps every micro-batch's activations until
  the backwards begin: activation memory grows with the number of micro-batches.
- 1F1B (torch.distributed.pipelining's Schedule1F1B): stage s of S (from 0) runs min(M, S - s)
  forwards first (the warm-up), then one backward and one forward in turn, then the backwards left.
  At most S - s micro-batches are in flight on the stage, however many there are: activation memory
  is bounded by the number of stages.

Both run a stage's forwards in micro-batch order and its backwards in micro-batch order, so the
parameter gradients add up in the same order and the two schedules compute the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("1f1b", "gpipe")
FORWARD, BACKWARD = "F", "B"


@dataclass(frozen=True)
class Op:
    kind: str  # FORWARD or BACKWARD
    micro: int  # the micro-batch's index in the step


def stage_ops(schedule: str, stages: int, stage: int, micro_batches: int, train: bool) -> tuple[Op, ...]:
    """The ops of stage `stage` (0-based) of `stages` over micro-batches 0..micro_batches-1, in order.
    Without training (evaluation, validation) only the forwards, in order."""
    forwards = [Op(FORWARD, k) for k in range(micro_batches)]
    if not train:
        return tuple(forwards)
    backwards = [Op(BACKWARD, k) for k in range(micro_batches)]
    if schedule == "gpipe":
        return (*forwards, *backwards)
    if schedule != "1f1b":
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    warmup = min(micro_batches, stages - stage)
    ops = forwards[:warmup]
    for backward, forward in zip(backwards, forwards[warmup:]):
        ops += [backward, forward]
    ops += backwards[micro_batches - warmup :]
    return tuple(ops)


def replica_ops(ops: tuple[Op, ...], replicas: int, replica: int) -> tuple[Op, ...]:
    """The stage's ops that replica `replica` of `replicas` runs (micro-batch k on replica k % replicas),
    in the stage's order. A replica that scheduled its own micro-batches alone could wait forever: with 3
    replicas of the middle of 3 stages and 5 micro-batches, replica 0 would want micro-batch 3's forward
    while stage 1 waits for micro-batch 0's backward. Following the stage's order cannot: any run of the
    one-replica stage is a run of its replicas. It also bounds the whole stage's micro-batches in flight."""
    return tuple(op for op in ops if op.micro % replicas == replica)


def in_flight(ops: tuple[Op, ...]) -> int:
    """The most micro-batches held between their forward and their backward under `ops`."""
    held = peak = 0
    for op in ops:
        held += 1 if op.kind == FORWARD else -1
        peak = max(peak, held)
    return peak
