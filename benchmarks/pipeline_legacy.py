"""The pipeline's old way of reaching its stage hosts, kept only for bench_pipeline.py to count its messages.

Before engines/pipeline/hosts.py, the master made each stage host with ``rpc.remote(worker, StageHost,
...)``, so the host was an OwnerRRef's value, and called it through that RRef's proxies
(``host.rpc_async().forward(...)``): each call carries the host's RRef to its owner (a fork the owner
confirms to the master: RREF_CHILD_ACCEPT and its ack), and each proxy asks the owner for the value's
type once. `LegacyEngine` is today's engine with that shape put back: the same hosts, the same
computation, reached through an RRef to a `LegacyHost` that forwards each call to the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed.rpc as rpc
from maskrcnn_launcher.contract import StagePlacement

from maskrcnn_dist.engines.pipeline import PipelineEngine, hosts
from maskrcnn_dist.engines.pipeline.hosts import StageClient


class LegacyHost:
    """An RRef's value on a worker, as StageHost was: each method is the registry's function of that name
    (methods of the class: an RRef proxy looks them up on the value's type)."""

    def __init__(self, run: str, stage: int) -> None:
        self.key = (run, stage)

    def create(self, *args: Any) -> Any:
        return hosts.create(*self.key, *args)

    def forward(self, *args: Any) -> Any:
        return hosts.forward(*self.key, *args)

    def reduce(self, *args: Any) -> Any:
        return hosts.reduce(*self.key, *args)

    def apply(self, *args: Any) -> Any:
        return hosts.apply(*self.key, *args)

    def state(self) -> Any:
        return hosts.state(*self.key)

    def load(self, *args: Any) -> Any:
        return hosts.load(*self.key, *args)


class LegacyClient(StageClient):
    """Calls through an RRef to the host, as the engine did before the registry."""

    def __init__(self, worker: str, run: str, stage: int, timeout: float) -> None:
        super().__init__(worker, run, stage, timeout)
        self.rref = rpc.remote(worker, LegacyHost, args=(run, stage), timeout=timeout)

    def call(self, fn: Any, *args: Any) -> torch.futures.Future:
        if fn is hosts.drop:  # the old engine dropped its RRefs; the registry must forget the host too
            return super().call(fn, *args)
        return getattr(self.rref.rpc_async(timeout=self.timeout), fn.__name__)(*args)

    def remote(self, fn: Any, *args: Any) -> rpc.RRef:
        return getattr(self.rref.remote(timeout=self.timeout), fn.__name__)(*args)


class LegacyEngine(PipelineEngine):
    def _connect(self, stages: Sequence[StagePlacement]) -> list[StageClient]:
        return [LegacyClient(s.rpc_name, self.run, i, self.timeout) for i, s in enumerate(stages)]
