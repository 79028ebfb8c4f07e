"""The stage host: the object that lives on a worker and holds one stage's replicas.

It never leaves its worker: hosts.py keeps it in the worker's registry and the master reaches it
through module-level functions called by name. What its methods return crosses the wire, so they
return tensors and small plain values only (a MicroBatchState, a norm, a dict of figures, a
checkpoint's part), never a module, an optimizer or anything holding a lock (guard.py checks).

Ordering. RPC runs requests on a thread pool, so calls arrive in any order. Each replica has a
Turnstile that lets micro-batch calls through in the master's order (round, index). That keeps
BatchNorm statistics and therefore runs reproducible, and it is what makes the pipeline overlap:
micro-batch k+1 enters stage 1 while stage 2 works on k.

Streams. Each replica runs its GPU work on a stream of its own (streams.py: `Lane`), whichever
stream RPC gave the request, so a replica's forward, gradient reduction and optimizer step keep
their order on the device.

Random numbers. StepSeeder reseeds the process-wide generator before the transform, RPN and RoI
heads run. Replicas of one stage run in threads of one process, so those modules run under a
host-wide lock (the backbone, the bulk of the work, does not need it).
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from maskrcnn_launcher.contract import StagePlacement
from torch import nn
from torch.distributed.rpc import PyRRef

from ...config import TrainConfig
from ...modeling.model import build_model, side_effect_free_losses
from ...modeling.optim import build_optimizer, build_scheduler
from ...modeling.perf import autocast_context
from ...modeling.rng import StepSeeder
from .stages import MicroBatchState, StageModule, build_stages
from .state import checksum
from .streams import Lane, StreamOps
from .transport import from_wire, gradient_bytes, sends_device_tensors, to_wire, wire_bytes

MODES = ("train", "eval", "validate")


class Turnstile:
    """Lets calls through one at a time in (round, index) order; rounds never overlap."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._round = -1
        self._next = 0

    @contextmanager
    def turn(self, round_id: int, index: int) -> Iterator[None]:
        def my_turn() -> bool:
            return index == (self._next if round_id == self._round else 0)

        with self._cond:
            self._cond.wait_for(my_turn)
        try:
            yield
        finally:  # advance even on error, or later calls of the round would wait forever
            with self._cond:
                self._round, self._next = round_id, index + 1
                self._cond.notify_all()


@dataclass
class Replica:
    stage: StageModule
    lane: Lane  # its stream: all of its GPU work runs there
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    seeder: StepSeeder
    turnstile: Turnstile = field(default_factory=Turnstile)

    @property
    def device(self) -> torch.device:
        return self.lane.device

    @property
    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.stage.parameters() if p.requires_grad]

    def state_tensors(self) -> list[torch.Tensor]:
        optimizer_state = self.optimizer.state_dict()["state"]
        momenta = [v for i in sorted(optimizer_state) for v in optimizer_state[i].values() if torch.is_tensor(v)]
        return list(self.stage.state_dict().values()) + momenta


@dataclass
class StepMeter:
    """Per-step figures of this host, reset at the first training call of each step."""

    round_id: int = -1
    cpu_start: float = 0.0
    forward_s: float = 0.0
    bytes_forward: int = 0
    bytes_backward: int = 0

    def start(self, round_id: int) -> None:
        if round_id != self.round_id:
            self.round_id, self.cpu_start = round_id, time.process_time()
            self.forward_s, self.bytes_forward, self.bytes_backward = 0.0, 0, 0

    def report(self) -> dict[str, float]:
        # Process CPU time: forward, backward (in autograd threads), optimizer step and RPC
        # work, all threads together; idle waiting costs none. Meaningful with one intra-op thread.
        return {
            "busy_s": time.process_time() - self.cpu_start,
            "forward_s": self.forward_s,
            "bytes_forward": float(self.bytes_forward),
            "bytes_backward": float(self.bytes_backward),
        }


def _fetch(incoming: MicroBatchState | PyRRef, timeout: float) -> MicroBatchState | BaseException:
    """The input state: by value from the master, or pulled from the previous stage's worker."""
    try:
        # An RRef arrives as PyRRef (RRef's base class) when unpickled.
        return incoming.to_here(timeout) if isinstance(incoming, PyRRef) else incoming
    except Exception as exc:  # re-raised in turn, after the turnstile has let this call through
        return exc


class StageHost:
    """Stage `index` of `placements` on this worker: one replica per device of its placement, each
    with its own optimizer, scheduler and stream.

    `transport`: the topology's ("cpu" or "device_maps"). Outputs go through host memory unless the
    next stage's worker maps this replica's device (`sends_device_tensors`), decided per edge and
    replica: under device_maps a GPU stage before a CPU stage still stages through host memory.
    `streams`: the replicas' stream operations (None: CUDA streams on a GPU, none on a CPU; tests
    pass a recorder)."""

    def __init__(
        self,
        cfg: TrainConfig,
        placements: Sequence[StagePlacement],
        index: int,
        num_classes: int,
        iters_per_epoch: int,
        transport: str = "cpu",
        streams: StreamOps | None = None,
    ) -> None:
        self.cfg = cfg
        self.rpc_timeout = cfg.peers.timeout
        self.iters_per_epoch = iters_per_epoch
        # Every process builds the whole model from the same seed, so stages start from exactly the
        # weights the local engine starts from (TorchEngine seeds the same way), then keeps its part.
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model, num_classes, keep_data_sizes=cfg.data.sized_by_data())
        stage = build_stages(model, [p.modules for p in placements])[index]
        self.replicas = [
            self._replica(stage if r == 0 else copy.deepcopy(stage), Lane(torch.device(device), streams))
            for r, device in enumerate(placements[index].devices)
        ]
        self.device_senders = sends_device_tensors(placements, index, transport)
        self._rng_lock = threading.Lock()
        self.meter = StepMeter()

    def _replica(self, stage: StageModule, lane: Lane) -> Replica:
        with lane.entered():  # the copy to the device is the replica's first work on its stream
            stage = stage.to(lane.device)
            optimizer = build_optimizer(stage, self.cfg.optim)
        seeder = StepSeeder(self.cfg.seed)
        seeder.attach(stage.parts())
        total_steps = self.cfg.total_steps(self.iters_per_epoch)
        scheduler = build_scheduler(optimizer, self.cfg.optim, self.iters_per_epoch, total_steps)
        return Replica(stage, lane, optimizer, scheduler, seeder)

    # -- description ----------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the master needs to know of this stage: its state dict's keys, its number of trainable
        parameters (to split an optimizer state) and its learning rate. Plain values only."""
        first = self.replicas[0]
        return {
            "keys": list(first.stage.state_dict()),
            "trainable": len(first.trainable),
            "lr": float(first.optimizer.param_groups[0]["lr"]),
        }

    # -- forward ----------------------------------------------------------------------------

    def forward(
        self, round_id: int, step: int, micro: int, incoming: MicroBatchState | PyRRef, mode: str
    ) -> MicroBatchState:
        """Run micro-batch `micro` of round `round_id` on replica micro % R, in order."""
        replica = self.replicas[micro % len(self.replicas)]
        if mode == "train":
            self.meter.start(round_id)
        fetched = _fetch(incoming, self.rpc_timeout)  # before the turn: transfer overlaps compute
        with replica.turnstile.turn(round_id, micro // len(self.replicas)):
            if isinstance(fetched, BaseException):
                raise fetched
            started = time.perf_counter()
            with replica.lane.entered(incoming=fetched) as visit:
                # Under --amp the stage computes in bf16 anyway: bf16 features stay bf16 on arrival.
                state = from_wire(fetched, replica.device, keep_bf16=self.cfg.amp)
                replica.seeder.at(step, micro)
                # Mixed precision inside the stage is bf16 only: dist_autograd has no place for fp16's scaler.
                with autocast_context(replica.device, self.cfg.amp, "bfloat16"):
                    state = self._run(replica.stage, state, mode)
                bf16_features = self.cfg.pipeline.bf16_transport and not replica.stage.is_last
                state = visit.hand_back(to_wire(state, bf16_features, str(replica.device) not in self.device_senders))
            if mode == "train":
                self.meter.forward_s += time.perf_counter() - started
                self.meter.bytes_forward += wire_bytes(state)
                self.meter.bytes_backward += gradient_bytes(state)
            return state

    def _run(self, stage: StageModule, state: MicroBatchState, mode: str) -> MicroBatchState:
        if mode == "train":
            stage.train()
            return stage(state, self._guard)
        if mode == "eval":
            stage.eval()
            with torch.no_grad():
                return stage(state, self._guard)
        if mode != "validate":
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        # Under the guard: the generator's save and restore must not interleave with another replica's draws.
        with self._guard(), side_effect_free_losses(stage, self._cuda_devices()):
            return stage(state)

    def _guard(self) -> threading.Lock:
        return self._rng_lock

    def _cuda_devices(self) -> list[torch.device]:
        return [r.device for r in self.replicas if r.device.type == "cuda"]

    # -- optimizer step, in two phases driven by the master ---------------------------------

    def reduce_gradients(self, grads: Mapping[torch.Tensor, torch.Tensor], want_norms: bool) -> torch.Tensor | None:
        """Phase 1: sum one backward pass's gradients (`grads`: parameter -> gradient, as
        dist_autograd.get_gradients gives them) over replicas and write them to every replica.

        Micro-batch k ran on replica k % R only, and the master's loss is sum_k w_k L_k, so replica
        r's gradient is the partial sum over its own micro-batches; the sum over replicas is the
        whole batch's gradient, exactly what one replica that ran every micro-batch would hold.
        Summing in replica order and copying the same result to all keeps replicas bitwise equal.
        The sum runs on the first replica's stream after every replica's (and after the device has
        finished the backward pass), each copy back on its replica's stream after the sum. Returns
        each parameter's gradient norm (for global clipping) when asked.
        """
        # dist_autograd accumulated these gradients on streams no request of ours sees (its backward syncs
        # them with the stream of the RPC that ran it, not with ours): wait for the device once, here.
        for device in self._cuda_devices():
            torch.cuda.synchronize(device)
        first, others = self.replicas[0], self.replicas[1:]
        totals: list[torch.Tensor | None] = []
        with first.lane.entered(incoming=list(grads.values()), after=[r.lane for r in others]) as visit:
            for params in zip(*(r.trainable for r in self.replicas)):
                parts = [grads[p] for p in params if p in grads]
                total = None
                if parts:
                    total = parts[0].to(first.device, copy=True)
                    for part in parts[1:]:
                        total += part.to(first.device)
                totals.append(total)
            # Parameters without a gradient keep None, as zero_grad(set_to_none) does.
            for p, total in zip(first.trainable, totals):
                p.grad = total
            norms = None
            if want_norms:
                with_grad = [t for t in totals if t is not None]
                # The same computation as torch.nn.utils.clip_grad_norm_ (per-tensor norms first).
                norms = visit.hand_back(
                    torch.stack(torch._foreach_norm(with_grad)).cpu() if with_grad else torch.zeros(0)
                )
        for replica in others:
            with replica.lane.entered(incoming=totals, after=[first.lane]):
                for p, total in zip(replica.trainable, totals):
                    p.grad = None if total is None else total.to(p.device, copy=True)
        return norms

    def apply_step(self, clip_coef: torch.Tensor | None) -> dict[str, float]:
        """Phase 2: optional clipping by the global coefficient, optimizer and scheduler steps on every
        replica (each on its stream), buffers made equal. Returns this step's figures."""
        for replica in self.replicas:
            with replica.lane.entered(incoming=clip_coef):
                if clip_coef is not None:
                    grads = [p.grad for p in replica.trainable if p.grad is not None]
                    torch._foreach_mul_(grads, clip_coef.to(replica.device))
                replica.optimizer.step()
            replica.scheduler.step()  # sets the rate in the param groups: host values, no GPU work
        self._sync_buffers()
        return {**self.meter.report(), "lr": float(self.replicas[0].optimizer.param_groups[0]["lr"])}

    def _sync_buffers(self) -> None:
        """BatchNorm running statistics saw different micro-batches on each replica: replace them by
        their mean over replicas (integer counters are equal already), so replicas stay identical."""
        if len(self.replicas) == 1:
            return
        first, others = self.replicas[0], self.replicas[1:]
        means: list[torch.Tensor | None] = []
        with first.lane.entered(after=[r.lane for r in others]):
            for buffers in zip(*(r.stage.buffers() for r in self.replicas)):
                if not buffers[0].is_floating_point():
                    means.append(None)
                    continue
                mean = buffers[0].to(first.device, copy=True)
                for b in buffers[1:]:
                    mean += b.to(first.device)
                mean /= len(buffers)
                means.append(mean)
        for replica in self.replicas:
            with replica.lane.entered(incoming=means, after=[first.lane]):
                for b, mean in zip(replica.stage.buffers(), means):
                    if mean is not None:
                        b.copy_(mean)

    # -- checkpoints -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """This stage's part of a checkpoint, in host memory: the first replica's weights, optimizer and
        scheduler states, and every replica's checksum (they must all be equal)."""
        checksums = []
        for replica in self.replicas:
            with replica.lane.entered():
                checksums.append(checksum(replica.state_tensors()))
        first = self.replicas[0]
        with first.lane.entered():
            return {
                "model": {k: v.detach().cpu() for k, v in first.stage.state_dict().items()},
                "optimizer": _to_cpu(first.optimizer.state_dict()),
                "scheduler": first.scheduler.state_dict(),
                "checksums": checksums,
            }

    def load(self, model: dict[str, torch.Tensor], optimizer: dict | None, scheduler: dict | None) -> None:
        for replica in self.replicas:
            with replica.lane.entered(incoming=model):
                replica.stage.load_state_dict(model)
                if optimizer is not None:
                    replica.optimizer.load_state_dict(copy.deepcopy(optimizer))
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
