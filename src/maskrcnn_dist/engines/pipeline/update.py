"""A stage's part of the optimizer step, in the two phases the master drives, and of a checkpoint.

Phase 1 (`reduce_gradients`): the replicas' gradients summed, unscaled and checked. Micro-batch k ran
on replica k % R only, and the last stage backpropagated w_k x L_k (w_k: its share of the batch's
images), so replica r holds the partial sum over its own micro-batches; the sum over replicas is the
whole batch's gradient, exactly what one replica that ran every micro-batch would hold: the replicas'
average update. Summed in replica order and copied to every replica, the replicas stay bitwise equal.
The sum is unscaled by fp16's loss scale and checked for inf/nan in one pass (GradScaler's own kernel),
so every replica holds the same unscaled gradient and the check covers them all.

Phase 2 (`apply_step`), after the master has agreed across stages: clipping by the global coefficient,
then the optimizer's step on every replica unless any stage found a non-finite gradient or loss (then
no weight and no momentum changes anywhere), the scheduler's step either way (as the local engine's).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from ...modeling.optim import load_optimizer_state
from .replica import Replica
from .state import checksum

SCHEDULER_BEFORE_OPTIMIZER = r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`"


def sum_over_replicas(replicas: Sequence[Replica]) -> list[torch.Tensor | None]:
    """Every trainable parameter's gradient summed over replicas (in replica order) into the first
    replica's `.grad`; None where no replica has one (as zero_grad(set_to_none) leaves it)."""
    first, others = replicas[0], replicas[1:]
    totals: list[torch.Tensor | None] = []
    with first.lane.entered(after=[r.lane for r in others]):
        for params in zip(*(r.trainable for r in replicas)):
            grads = [p.grad for p in params if p.grad is not None]
            total = None
            if grads:
                total = grads[0].to(first.device, copy=params[0].grad is None)
                for grad in grads[1:]:
                    total += grad.to(first.device)
            params[0].grad = total
            totals.append(total)
    return totals


def reduce_gradients(
    replicas: Sequence[Replica], inv_scale: float, nonfinite: Sequence[torch.Tensor | None], want_norms: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Phase 1: (found_inf, per-parameter gradient norms or None), both on the first replica's device.
    found_inf is 1.0 where a gradient (after the sum) or one of the `nonfinite` loss flags was not finite."""
    totals = sum_over_replicas(replicas)
    first, others = replicas[0], replicas[1:]
    with first.lane.entered(incoming=[f for f in nonfinite if f is not None]):
        found_inf = torch.zeros((), dtype=torch.float32, device=first.device)
        present = [t for t in totals if t is not None]
        if present:
            scale = torch.full((), inv_scale, dtype=torch.float32, device=first.device)
            torch._amp_foreach_non_finite_check_and_unscale_(present, found_inf, scale)
        for flag in nonfinite:
            if flag is not None:
                found_inf = torch.maximum(found_inf, flag.to(first.device, torch.float32))
        norms = None
        if want_norms:
            # The same computation as torch.nn.utils.clip_grad_norm_ (per-tensor norms first).
            norms = torch.stack(torch._foreach_norm(present)) if present else torch.zeros(0, device=first.device)
    for replica in others:
        with replica.lane.entered(incoming=totals, after=[first.lane]):
            for p, total in zip(replica.trainable, totals):
                p.grad = None if total is None else total.to(p.device, copy=True)
    return found_inf, norms


def apply_step(replicas: Sequence[Replica], clip_coef: torch.Tensor | None, skip: bool) -> None:
    """Phase 2: clipping and the optimizer's step on every replica (each on its stream) unless `skip`,
    the scheduler's step, buffers made equal."""
    for replica in replicas:
        if not skip:
            with replica.lane.entered(incoming=clip_coef):
                if clip_coef is not None:
                    grads = [p.grad for p in replica.trainable if p.grad is not None]
                    torch._foreach_mul_(grads, clip_coef.to(replica.device))
                replica.optimizer.step()
        with warnings.catch_warnings():
            # A skipped first step (fp16 from 2^16) never called optimizer.step(): the schedule goes on
            # regardless, as the local engine's does (its fused step is called and skips on the device).
            warnings.filterwarnings("ignore", message=SCHEDULER_BEFORE_OPTIMIZER)
            replica.scheduler.step()  # sets the rate in the param groups: host values, no GPU work
    sync_buffers(replicas)


def sync_buffers(replicas: Sequence[Replica]) -> None:
    """BatchNorm running statistics saw different micro-batches on each replica: replace them by their
    mean over replicas (integer counters are equal already), so replicas stay identical."""
    if len(replicas) == 1:
        return
    first, others = replicas[0], replicas[1:]
    means: list[torch.Tensor | None] = []
    with first.lane.entered(after=[r.lane for r in others]):
        for buffers in zip(*(r.stage.buffers() for r in replicas)):
            if not buffers[0].is_floating_point():
                means.append(None)
                continue
            mean = buffers[0].to(first.device, copy=True)
            for b in buffers[1:]:
                mean += b.to(first.device)
            mean /= len(buffers)
            means.append(mean)
    for replica in replicas:
        with replica.lane.entered(incoming=means, after=[first.lane]):
            for b, mean in zip(replica.stage.buffers(), means):
                if mean is not None:
                    b.copy_(mean)


def stage_state(replicas: Sequence[Replica]) -> dict[str, Any]:
    """This stage's part of a checkpoint, in host memory: the first replica's weights, optimizer and
    scheduler states, and every replica's checksum (they must all be equal)."""
    checksums = []
    for replica in replicas:
        with replica.lane.entered():
            checksums.append(checksum(replica.state_tensors()))
    first = replicas[0]
    with first.lane.entered():
        return {
            "model": {k: v.detach().cpu() for k, v in first.stage.state_dict().items()},
            "optimizer": _to_cpu(first.optimizer.state_dict()),
            "scheduler": first.scheduler.state_dict(),
            "checksums": checksums,
        }


def load_stage(replicas: Sequence[Replica], model: dict, optimizer: dict | None, scheduler: dict | None) -> None:
    for replica in replicas:
        with replica.lane.entered(incoming=model):
            replica.stage.load_state_dict(model)
            if optimizer is not None:
                load_optimizer_state(replica.optimizer, optimizer)
        if scheduler is not None:
            replica.scheduler.load_state_dict(scheduler)


def _to_cpu(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj
