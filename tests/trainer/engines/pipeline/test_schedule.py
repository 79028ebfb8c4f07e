"""The schedules on paper (engines/pipeline/schedule.py): torch.distributed.pipelining's 1F1B and GPipe per
stage, its replicas' share of it, the in-flight bound 1F1B exists for, and no combination of stages,
replicas and micro-batches that waits forever."""

from __future__ import annotations

import itertools

import pytest

from maskrcnn_dist.engines.pipeline.schedule import (
    BACKWARD,
    FORWARD,
    Op,
    in_flight,
    replica_ops,
    stage_ops,
)


def ops(text: str) -> tuple[Op, ...]:
    """ "F0 F1 B0" -> the ops."""
    return tuple(Op(word[0], int(word[1:])) for word in text.split())


@pytest.mark.parametrize(
    ("stages", "stage", "micro_batches", "expected"),
    [
        # Schedule1F1B: stage s warms up with min(M, S - s) forwards, then one backward and one forward in
        # turn, then the backwards left (torch/distributed/pipelining/schedules.py).
        (2, 0, 4, "F0 F1 B0 F2 B1 F3 B2 B3"),
        (2, 1, 4, "F0 B0 F1 B1 F2 B2 F3 B3"),
        (3, 0, 4, "F0 F1 F2 B0 F3 B1 B2 B3"),
        (3, 1, 4, "F0 F1 B0 F2 B1 F3 B2 B3"),
        (3, 2, 4, "F0 B0 F1 B1 F2 B2 F3 B3"),
        (3, 0, 2, "F0 F1 B0 B1"),  # fewer micro-batches than stages: the warm-up is all of them
        (2, 0, 1, "F0 B0"),
    ],
)
def test_1f1b_is_torchs_order(stages: int, stage: int, micro_batches: int, expected: str) -> None:
    assert stage_ops("1f1b", stages, stage, micro_batches, train=True) == ops(expected)


def test_gpipe_runs_every_forward_first_and_evaluation_only_forwards() -> None:
    assert stage_ops("gpipe", 3, 1, 3, train=True) == ops("F0 F1 F2 B0 B1 B2")
    for schedule in ("gpipe", "1f1b"):
        assert stage_ops(schedule, 3, 0, 2, train=False) == ops("F0 F1")
    with pytest.raises(ValueError, match="schedule must be one of"):
        stage_ops("zero-bubble", 2, 0, 1, train=True)


def test_replicas_take_every_rth_micro_batch_in_the_stages_order() -> None:
    stage = stage_ops("1f1b", 2, 0, 5, train=True)  # F0 F1 B0 F2 B1 F3 B2 F4 B3 B4
    assert replica_ops(stage, 2, 0) == ops("F0 B0 F2 B2 F4 B4")
    assert replica_ops(stage, 2, 1) == ops("F1 B1 F3 B3")
    assert replica_ops(stage_ops("gpipe", 2, 0, 1, train=True), 3, 2) == ()


@pytest.mark.parametrize("micro_batches", [1, 2, 3, 8, 16])
def test_1f1b_holds_at_most_the_stages_in_flight_gpipe_every_micro_batch(micro_batches: int) -> None:
    stages = 4
    for stage in range(stages):
        one = stage_ops("1f1b", stages, stage, micro_batches, train=True)
        assert in_flight(one) == min(micro_batches, stages - stage)
        assert in_flight(stage_ops("gpipe", stages, stage, micro_batches, train=True)) == micro_batches
        # Forwards and backwards each in micro-batch order: the gradients add up in GPipe's order.
        for kind in (FORWARD, BACKWARD):
            assert [o.micro for o in one if o.kind == kind] == list(range(micro_batches))


def completes(queues: dict[tuple[int, int], list[Op]]) -> bool:
    """Every (stage, replica) queue runs its ops in order, each as soon as what it needs has run: a forward
    needs the micro-batch's forward on the stage before, a backward its forward here and its backward on
    the stage after (the last stage's: nothing more). False if at some point no queue can go on."""
    stages = 1 + max(s for s, _ in queues)
    done: set[tuple[int, Op]] = set()

    def ready(s: int, op: Op) -> bool:
        if op.kind == FORWARD:
            return s == 0 or (s - 1, op) in done
        return (s, Op(FORWARD, op.micro)) in done and (s == stages - 1 or (s + 1, op) in done)

    while any(queues.values()):
        runnable = [q for (s, _), q in queues.items() if q and ready(s, q[0])]
        if not runnable:
            return False
        for (s, _), q in queues.items():
            if q and ready(s, q[0]):
                done.add((s, q.pop(0)))
    return True


def test_no_schedule_waits_forever() -> None:
    for schedule in ("1f1b", "gpipe"):
        for stages in (1, 2, 3, 4):
            for replicas in itertools.product((1, 2, 3), repeat=stages):
                for micro_batches in (1, 2, 3, 5, 8):
                    queues = {
                        (s, r): list(replica_ops(stage_ops(schedule, stages, s, micro_batches, True), n, r))
                        for s, n in enumerate(replicas)
                        for r in range(n)
                    }
                    assert completes(queues), (schedule, replicas, micro_batches)


def test_the_deadlock_check_can_fail() -> None:
    """Stage 0 wanting micro-batch 0's backward before it sends micro-batch 1, which stage 1 wants first;
    and each replica scheduling its own micro-batches alone (replica_ops' docstring)."""
    assert not completes({(0, 0): list(ops("F0 B0 F1 B1")), (1, 0): list(ops("F0 F1 B0 B1"))})
    assert completes({(0, 0): list(ops("F0 F1 B0 B1")), (1, 0): list(ops("F0 B0 F1 B1"))})
    alone = {(0, 0): list(stage_ops("1f1b", 3, 0, 5, True)), (2, 0): list(stage_ops("1f1b", 3, 2, 5, True))}
    for r, micros in enumerate(([0, 3], [1, 4], [2])):
        own = stage_ops("1f1b", 2, 0, len(micros), True)  # 1F1B over its own micro-batches, as stage 1 of 3
        alone[(1, r)] = [Op(op.kind, micros[op.micro]) for op in own]
    assert not completes(alone)
