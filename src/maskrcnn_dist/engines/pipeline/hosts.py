"""The stage hosts' RPC surface: a registry on each worker, the functions called by name, the handles.

A stage host (host.py) holds a model, optimizers, locks and CUDA streams: it never crosses the wire.
It stays in its worker's `REGISTRY`, under the key (run, stage), and is reached through the
module-level functions below, which RPC names by their qualified name. Every call is a plain
`rpc_async` whose arguments and result carry tensors by value (device maps move CUDA tensors GPU to
GPU): no RRef, no distributed autograd, no distributed optimizer.

    create    build the host, return what the master must know of it (describe(): plain values)
    forward   a micro-batch's activation into the stage; the stage passes its output to the next stage
              itself (`RpcLinks.forward`), so the answer is the next stage's: async_execution chains them
    backward  the gradients of what a micro-batch sent on, from the stage after it (`RpcLinks.backward`)
    reduce    phase 1 of the step: gradients summed over replicas, unscaled and checked; norms; losses
    apply     phase 2: clipping, optimizer and scheduler steps (unless the master skips it); figures
    state     this stage's part of a checkpoint (tensors, plain values)
    load      a checkpoint's part into every replica
    drop      forget the host (the engine is closed)

`StageClient` is the master's handle on one host; `RpcLinks` a host's handle on its neighbours. The run
id is the master's own (one per PipelineEngine), so engines made one after the other in one session
never reach each other's hosts. With the device-map guard on, every request that carries tensors is
walked as the guard walks results (guard.check) before it is sent.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.rpc as rpc
from maskrcnn_launcher.contract import StagePlacement

from ...config import TrainConfig
from .guard import check_request, is_installed
from .host import StageHost
from .rounds import Ticket
from .transport import Activation


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


def send(worker: str, fn: Callable[..., Any], args: tuple, timeout: float) -> torch.futures.Future:
    """`rpc_async(worker, fn, args)`, its request walked by the device-map guard first when it is on. The
    arguments are held until the answer comes: a stage's activations or gradients on a GPU stay allocated
    (not reused by the caching allocator) at least until the callee has what it was sent."""
    if is_installed():
        check_request(f"{fn.__module__}.{fn.__qualname__}", worker, args)
    future = rpc.rpc_async(worker, fn, args=args, timeout=timeout)
    future.add_done_callback(lambda _, held=args: None)
    return future


def _future_of(work: Callable[[], torch.futures.Future]) -> torch.futures.Future:
    """`work()`'s future, or one holding the error it raised (an async_execution function's result)."""
    try:
        return work()
    except Exception as exc:
        failed: torch.futures.Future = torch.futures.Future()
        failed.set_exception(exc)
        return failed


# -- the functions called by name (each on the stage's worker) -------------------------------------------


def create(
    run: str,
    stage: int,
    cfg: TrainConfig,
    placements: Sequence[StagePlacement],
    num_classes: int,
    iters_per_epoch: int,
    transport: str,
) -> dict[str, Any]:
    links = RpcLinks(run, placements, stage, cfg.peers.timeout)
    host = StageHost(cfg, placements, stage, num_classes, iters_per_epoch, transport, links=links)
    REGISTRY.add(HostKey(run, stage), host)
    return host.describe()


@rpc.functions.async_execution
def forward(run: str, stage: int, ticket: Ticket, activation: Activation) -> torch.futures.Future:
    return _future_of(lambda: REGISTRY.get(HostKey(run, stage)).forward(ticket, activation))


def backward(run: str, stage: int, ticket: Ticket, grads: list[torch.Tensor | None]) -> None:
    REGISTRY.get(HostKey(run, stage)).backward(ticket, grads)


def reduce(run: str, stage: int, round_id: int, inv_scale: float, want_norms: bool) -> dict[str, Any]:
    return REGISTRY.get(HostKey(run, stage)).reduce(round_id, inv_scale, want_norms)


def apply(run: str, stage: int, round_id: int, clip_coef: torch.Tensor | None, skip: bool) -> dict[str, float]:
    return REGISTRY.get(HostKey(run, stage)).apply(round_id, clip_coef, skip)


def state(run: str, stage: int) -> dict[str, Any]:
    return REGISTRY.get(HostKey(run, stage)).state()


def load(run: str, stage: int, model: dict[str, torch.Tensor], optimizer: dict | None, scheduler: dict | None) -> None:
    REGISTRY.get(HostKey(run, stage)).load(model, optimizer, scheduler)


def drop(run: str, stage: int) -> None:
    REGISTRY.drop(HostKey(run, stage))


# -- the handles -------------------------------------------------------------------------------------------


class RpcLinks:
    """Stage `stage`'s calls to its neighbours in run `run`: a micro-batch's activation to the next stage
    (the future holds that stage's answer), its input gradients to the stage before."""

    def __init__(self, run: str, placements: Sequence[StagePlacement], stage: int, timeout: float) -> None:
        self.run, self.stage, self.timeout = run, stage, timeout
        self.workers = [p.rpc_name for p in placements]

    def forward(self, ticket: Ticket, activation: Activation) -> torch.futures.Future:
        args = (self.run, self.stage + 1, ticket, activation)
        return send(self.workers[self.stage + 1], forward, args, self.timeout)

    def backward(self, ticket: Ticket, grads: list[torch.Tensor | None]) -> torch.futures.Future:
        return send(self.workers[self.stage - 1], backward, (self.run, self.stage - 1, ticket, grads), self.timeout)


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


class StageClient:
    """The master's handle on stage `stage` of run `run`, hosted by `worker`: each method is one RPC to
    the function of that name above, with the key in front of its arguments; it returns the future of
    its result."""

    def __init__(self, worker: str, run: str, stage: int, timeout: float) -> None:
        self.worker, self.run, self.stage, self.timeout = worker, run, stage, timeout

    def call(self, fn: Callable[..., Any], *args: Any) -> torch.futures.Future:
        """`fn(run, stage, *args)` on the worker; the future holds its result."""
        return send(self.worker, fn, (self.run, self.stage, *args), self.timeout)

    def create(self, *args: Any) -> torch.futures.Future:
        return self.call(create, *args)

    def forward(self, ticket: Ticket, activation: Activation) -> torch.futures.Future:
        return self.call(forward, ticket, activation)

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
