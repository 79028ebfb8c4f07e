"""One member of a toy elastic job (test_elastic.py): a linear model trained on global batches that every
member slices by its rank in the current generation, driven by lifetime.elastic as the ddp engine is.

A global batch is a pure function of the step, and each member's loss is weighted by its share of the
global batch, so a step's update does not depend on the number of members: the final weights of any
run, whatever members it lost or admitted, equal an uninterrupted one-process run's (`reference`).
Each finished step appends one JSON line to <out>/member<id>.jsonl: step, generation, size, weights.
A step sleeps STEP_SECONDS until <out>/release exists: the run lasts while a test's faults (kills, starts
of replacements) happen, and once the test has written the file (its faults done) the rest of the steps
run at once. The steps and the weights are the same either way.

    python elastic_member.py HOST PORT ID LAUNCH_WORLD STEPS OUT [STEP_SECONDS]
    python elastic_member.py env STEPS OUT [STEP_SECONDS]   (under torchrun: MASTER_ADDR, MASTER_PORT, RANK,
                                                            WORLD_SIZE; the store is the agent's)
SIGTERM asks this member to leave at the next step boundary (exit 75); the leader asked stops everyone.
ELASTIC_FAIL_AFTER_REDUCE=STEP makes this member's step STEP fail after its all-reduce succeeded, as a
collective that failed on one member only: the commit point must keep the others from stepping.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from maskrcnn_dist.lifetime.elastic import ElasticGroup, StepAborted
from maskrcnn_dist.lifetime.membership import ElasticPolicy

GLOBAL_BATCH = 6
POLICY = ElasticPolicy(beat_s=0.1, dead_after_s=1.0, timeout_s=60.0, poll_s=0.01)
RELEASE = "release"  # <out>/release: the test's faults are done, stop pacing the steps


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(GLOBAL_BATCH, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1 * torch.randn(GLOBAL_BATCH, 1, generator=g)


def build() -> tuple[torch.nn.Linear, torch.optim.SGD]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def local_gradients(model: torch.nn.Linear, step: int, rank: int, size: int) -> None:
    x, y = global_batch(step)
    mine = slice(rank * GLOBAL_BATCH // size, (rank + 1) * GLOBAL_BATCH // size)  # uneven slices are fine
    model.zero_grad(set_to_none=False)
    loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine], reduction="sum") / GLOBAL_BATCH
    loss.backward()


def reference(steps: int) -> list[float]:
    """The weights after `steps` steps of one process holding every global batch."""
    model, optimizer = build()
    for step in range(steps):
        local_gradients(model, step, 0, 1)
        optimizer.step()
    return weights(model)


def weights(model: torch.nn.Module) -> list[float]:
    return [round(v, 6) for p in model.parameters() for v in p.detach().flatten().tolist()]


def main(host: str, port: int, me: int, launch_world: int, steps: int, out: Path, step_s: float) -> int:
    asked: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _: asked.append(signum))
    signal.signal(signal.SIGUSR1, lambda signum, _: asked.append(signum))  # torchrun's forwarded stop
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    (out / f"member{me}.pid").write_text(str(os.getpid()))
    group = ElasticGroup(host, port, me, launch_world, "gloo", POLICY)
    try:
        return train(group, me, steps, out, step_s, asked)
    finally:
        # Every way out closes the group, as the ddp engine's does (engines/elastic_ddp.py): the watcher's
        # daemon thread, left inside a store call when the interpreter ends, aborts the process (exit -6,
        # "terminate called without an active exception"; seen when a replacement found the run over).
        group.close()


def train(group: ElasticGroup, me: int, steps: int, out: Path, step_s: float, asked: list[int]) -> int:
    """The member's run in `group`: its exit status (0 at the end or when the run ended without it, 75 when
    it left or the leader stopped everyone)."""
    model, optimizer = build()
    if group.start() is None:
        return 0  # the run ended before this replacement was admitted
    position = {"step": 0}

    def share() -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), **position}
        received = group.share_state(state)
        if received is not state:
            model.load_state_dict(received["model"])
            optimizer.load_state_dict(received["optimizer"])
            position["step"] = received["step"]

    share()
    fail_at = int(os.environ.get("ELASTIC_FAIL_AFTER_REDUCE", "-1"))
    record = open(out / f"member{me}.jsonl", "a", buffering=1)
    while position["step"] < steps:
        step = position["step"]
        failure = None
        try:
            local_gradients(model, step, group.rank, group.size)
            if step_s and not (out / RELEASE).exists():
                time.sleep(step_s)
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            summed = torch.cat([flat, group.boundary_flags(leave=bool(asked), stop=bool(asked))])
            dist.all_reduce(summed)
            if step == fail_at:
                fail_at = -1
                raise RuntimeError(f"injected: member {me}'s step {step + 1} failed after its all-reduce")
            group.commit(step)
        except (StepAborted, RuntimeError) as exc:
            failure = str(exc)
        if failure is not None:  # outside the except block: the exception no longer holds the old group
            print(f"{time.time():.3f} member {me}: step {step + 1}: {failure[:200]}", file=sys.stderr, flush=True)
            if group.recover(failure) is None:
                return 0
            share()
            continue
        offset = 0
        for p in model.parameters():
            p.grad.copy_(summed[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        optimizer.step()
        position["step"] = step + 1
        generation = group.generation
        line = {"step": step + 1, "generation": generation.number, "size": generation.size, "weights": weights(model)}
        line["time"] = round(time.time(), 3)
        record.write(json.dumps(line) + "\n")
        decision = group.read_boundary(summed[offset:])
        if decision.stop_all:
            return 75
        if decision.regroup:
            if group.regroup(decision) is None:
                return 75
            share()
    group.close(finished=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "env":
        host, port, me, world = (os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"))
        rest = sys.argv[2:]
    else:
        host, port, me, world = sys.argv[1:5]
        rest = sys.argv[5:]
    steps, out = int(rest[0]), Path(rest[1])
    step_s = float(rest[2]) if len(rest) > 2 else 0.05
    sys.exit(main(host, int(port), int(me), int(world), steps, out, step_s))
