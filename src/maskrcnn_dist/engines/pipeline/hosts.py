"""The stage hosts' RPC surface: a registry on each worker, functions called by name, the master's handle.

A stage host (host.py) holds a model, optimizers, locks and CUDA streams: it must never become an
RPC result or an RRef's value, because an agent with device maps pickles both to find their CUDA
tensors (guard.py). So the host stays in its worker's `REGISTRY`, under the key (run, stage), and
the master reaches it through the module-level functions below, which RPC names by their qualified
name (``rpc.rpc_async(worker, hosts.apply, args=(run, stage, coef))``):

    create   build the host, return what the master must know of it (describe(): plain values)
    forward  one micro-batch through the stage; via rpc.remote its MicroBatchState stays on the
             worker as an RRef's value (tensors only) that the next stage pulls
    reduce   phase 1 of the step: this backward pass's gradients summed over replicas; the norms
    apply    phase 2: clipping, optimizer and scheduler steps; the step's figures
    state    this stage's part of a checkpoint (tensors, plain values)
    load     a checkpoint's part into every replica
    drop     forget the host (the engine is closed)

Every call carries the run's key, so no RRef owns a host: no RRef type query, no fork to confirm
and no RRef to delete per stage call (benchmarks/bench_pipeline.py counts the messages).

`StageClient` is the master's handle on one host: its worker, its key, the calls. The run id is
the master's own (one per PipelineEngine), so engines made one after the other in one session
never reach each other's hosts.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from maskrcnn_launcher.contract import StagePlacement

from ...config import TrainConfig
from .host import StageHost
from .stages import MicroBatchState


@dataclass(frozen=True)
class HostKey:
    run: str  # the master's id of one PipelineEngine
    stage: int  # the stage's index in the pipeline


class HostRegistry:
    """The stage hosts living in this process, by key. RPC runs the functions below on a pool of
    threads and names them by module and name: this registry is the one place they can find a host."""

    def __init__(self) -> None:
        self._hosts: dict[HostKey, StageHost] = {}
        self._lock = threading.Lock()

    def add(self, key: HostKey, host: StageHost) -> None:
        with self._lock:
            if key in self._hosts:
                raise KeyError(f"stage {key.stage + 1} of run {key.run} exists on this worker already")
            self._hosts[key] = host

    def get(self, key: HostKey) -> StageHost:
        with self._lock:
            host = self._hosts.get(key)
        if host is None:
            raise KeyError(f"no stage {key.stage + 1} of run {key.run} on this worker (never created, or dropped)")
        return host

    def drop(self, key: HostKey) -> None:
        with self._lock:
            self._hosts.pop(key, None)

    def keys(self) -> list[HostKey]:
        with self._lock:
            return list(self._hosts)


#: This process's stage hosts.
REGISTRY = HostRegistry()


# -- the functions the master calls by name (each on the stage's worker) ------------------------


def create(
    run: str,
    stage: int,
    cfg: TrainConfig,
    placements: Sequence[StagePlacement],
    num_classes: int,
    iters_per_epoch: int,
    transport: str,
) -> dict[str, Any]:
    host = StageHost(cfg, placements, stage, num_classes, iters_per_epoch, transport)
    REGISTRY.add(HostKey(run, stage), host)
    return host.describe()


def forward(
    run: str, stage: int, round_id: int, step: int, micro: int, incoming: MicroBatchState | rpc.RRef, mode: str
) -> MicroBatchState:
    return REGISTRY.get(HostKey(run, stage)).forward(round_id, step, micro, incoming, mode)


def reduce(run: str, stage: int, context_id: int, want_norms: bool) -> torch.Tensor | None:
    grads = dist_autograd.get_gradients(context_id)
    return REGISTRY.get(HostKey(run, stage)).reduce_gradients(grads, want_norms)


def apply(run: str, stage: int, clip_coef: torch.Tensor | None) -> dict[str, float]:
    return REGISTRY.get(HostKey(run, stage)).apply_step(clip_coef)


def state(run: str, stage: int) -> dict[str, Any]:
    return REGISTRY.get(HostKey(run, stage)).state()


def load(run: str, stage: int, model: dict[str, torch.Tensor], optimizer: dict | None, scheduler: dict | None) -> None:
    REGISTRY.get(HostKey(run, stage)).load(model, optimizer, scheduler)


def drop(run: str, stage: int) -> None:
    REGISTRY.drop(HostKey(run, stage))


# -- the master's side -----------------------------------------------------------------------------


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


class StageClient:
    """The master's handle on stage `stage` of run `run`, hosted by `worker`: each method is one RPC to
    the function of that name above, with the key in front of its arguments; it returns the future of
    its result (`forward_kept`: an RRef to it, kept on the worker)."""

    def __init__(self, worker: str, run: str, stage: int, timeout: float) -> None:
        self.worker, self.run, self.stage, self.timeout = worker, run, stage, timeout

    def call(self, fn: Any, *args: Any) -> torch.futures.Future:
        """`fn(run, stage, *args)` on the worker; the future holds its result."""
        return rpc.rpc_async(self.worker, fn, args=(self.run, self.stage, *args), timeout=self.timeout)

    def remote(self, fn: Any, *args: Any) -> rpc.RRef:
        """`fn(run, stage, *args)` on the worker, its result kept there as an RRef's value."""
        return rpc.remote(self.worker, fn, args=(self.run, self.stage, *args), timeout=self.timeout)

    def create(self, *args: Any) -> torch.futures.Future:
        return self.call(create, *args)

    def forward(self, *args: Any) -> torch.futures.Future:
        return self.call(forward, *args)

    def forward_kept(self, *args: Any) -> rpc.RRef:
        return self.remote(forward, *args)

    def reduce(self, *args: Any) -> torch.futures.Future:
        return self.call(reduce, *args)

    def apply(self, *args: Any) -> torch.futures.Future:
        return self.call(apply, *args)

    def state(self) -> torch.futures.Future:
        return self.call(state)

    def load(self, *args: Any) -> torch.futures.Future:
        return self.call(load, *args)

    def drop(self) -> torch.futures.Future:
        return self.call(drop)
