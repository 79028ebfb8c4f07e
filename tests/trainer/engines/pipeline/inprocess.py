"""The pipeline engine in one process: the master's engine and every stage host, their calls on threads.

Each call that RPC would carry runs on a thread of its own and answers through a torch future, its
arguments and answer copied by value (pickled, as RPC does) and walked by the device-map guard
(guard.check, as `MASKRCNN_DEVICE_MAP_GUARD=1` walks them in a real run). What is left out is only
TensorPipe itself: the multi-process tests (test_pipeline_mp.py) run the same engine over real RPC.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from maskrcnn_dist.engines.pipeline import PipelineEngine, guard
from maskrcnn_dist.engines.pipeline.host import StageHost

from .pipeline_procs import make_plans
from .pipeline_toy import NUM_CLASSES

#: What a host's own lock guards (the process-wide generator), shared: here every stage is in one process.
PROCESS_RNG = threading.RLock()


def by_value(obj: Any) -> Any:
    """`obj` as the receiving end of an RPC sees it: walked by the guard, then pickled and unpickled."""
    guard.check(obj, guard.DEFAULT_MAX_PLAIN_BYTES)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def call(work: Callable[[], Any]) -> torch.futures.Future:
    """`work()` on a thread of its own; the future holds its answer (by value), or waits for the future it
    returns (an async_execution function's), or holds its error."""
    done: torch.futures.Future = torch.futures.Future()

    def settle(value: Any) -> None:
        if isinstance(value, torch.futures.Future):
            value.add_done_callback(lambda f: settle_future(f))
        else:
            done.set_result(by_value(value))

    def settle_future(future: torch.futures.Future) -> None:
        try:
            settle(future.value())
        except Exception as exc:
            done.set_exception(exc)

    def run() -> None:
        try:
            settle(work())
        except Exception as exc:
            done.set_exception(exc)

    threading.Thread(target=run).start()
    return done


class LocalLinks:
    """A host's calls to its neighbours, inside this process."""

    def __init__(self, hosts: list[StageHost], stage: int) -> None:
        self.hosts, self.stage = hosts, stage

    def forward(self, ticket, activation) -> torch.futures.Future:
        sent = by_value(activation)
        return call(lambda: self.hosts[self.stage + 1].forward(ticket, sent))

    def backward(self, ticket, grads) -> torch.futures.Future:
        sent = by_value(grads)
        return call(lambda: self.hosts[self.stage - 1].backward(ticket, sent))


class LocalClient:
    """The master's handle on one host of this process (hosts.StageClient's methods)."""

    def __init__(self, hosts: list[StageHost], stage: int, build: Callable[..., StageHost]) -> None:
        self.hosts, self.stage, self.build = hosts, stage, build
        self.worker = f"worker{stage + 1}"

    def create(self, cfg, placements, num_classes, iters_per_epoch, transport) -> torch.futures.Future:
        def make() -> dict:
            links = LocalLinks(self.hosts, self.stage)
            with PROCESS_RNG:  # each host seeds the process-wide generator to build its weights
                host = self.build(cfg, placements, self.stage, num_classes, iters_per_epoch, transport, links=links)
            host._rng_lock = PROCESS_RNG  # stages reseed it too: in one process they share one lock
            self.hosts[self.stage] = host
            return host.describe()

        return call(make)

    def forward(self, ticket, activation) -> torch.futures.Future:
        sent = by_value(activation)
        return call(lambda: self.hosts[self.stage].forward(ticket, sent))

    def _host_call(self, name: str, *args: Any) -> torch.futures.Future:
        sent = by_value(args)
        return call(lambda: getattr(self.hosts[self.stage], name)(*sent))

    def reduce(self, *args: Any) -> torch.futures.Future:
        return self._host_call("reduce", *args)

    def apply(self, *args: Any) -> torch.futures.Future:
        return self._host_call("apply", *args)

    def state(self) -> torch.futures.Future:
        return self._host_call("state")

    def load(self, *args: Any) -> torch.futures.Future:
        return self._host_call("load", *args)

    def drop(self) -> torch.futures.Future:
        return call(lambda: None)


class InProcessEngine(PipelineEngine):
    """PipelineEngine whose stage hosts live in this process (`self.stage_hosts`). `build`: how a host is
    made (StageHost, or a test's variant of it)."""

    def __init__(self, *args: Any, build: Callable[..., StageHost] = StageHost, **kwargs: Any) -> None:
        self._build = build
        super().__init__(*args, **kwargs)

    def _connect(self, stages) -> list[LocalClient]:
        self.stage_hosts: list[StageHost | None] = [None] * len(stages)
        return [LocalClient(self.stage_hosts, i, self._build) for i in range(len(stages))]

    def _find_lost_worker(self) -> str | None:
        return None  # nothing is lost in one process: the error is raised as it is


def placements(replicas: Sequence[int] = (1, 1), placement=None):
    """The launcher's placements for CPU stages with `replicas` replicas each."""
    kwargs = {} if placement is None else {"placement": placement}
    master, _ = make_plans(0, replicas=tuple(replicas), **kwargs)
    return tuple(replace(s, devices=("cpu",) * r) for s, r in zip(master.stages, replicas))


def engine(
    cfg, replicas: Sequence[int] = (1, 1), placement=None, iters_per_epoch: int = 10, **kwargs
) -> InProcessEngine:
    return InProcessEngine(cfg, placements(replicas, placement), NUM_CLASSES, iters_per_epoch, **kwargs)


def weights_and_momenta(engine_: PipelineEngine) -> dict[str, torch.Tensor]:
    """Every stage replica's weights, buffers and momenta, by stage, replica and name."""
    found = {}
    for s, host in enumerate(engine_.stage_hosts):
        for r, replica in enumerate(host.replicas):
            for name, value in replica.stage.state_dict().items():
                found[f"stage{s + 1}/r{r}/{name}"] = value.detach().clone()
            for i, state in replica.optimizer.state_dict()["state"].items():
                if state.get("momentum_buffer") is not None:
                    found[f"stage{s + 1}/r{r}/momentum{i}"] = state["momentum_buffer"].clone()
    return found


__all__ = ["InProcessEngine", "by_value", "engine", "pickle", "placements", "weights_and_momenta"]
