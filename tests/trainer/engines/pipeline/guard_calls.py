"""One RPC process ("solo") that calls itself, for test_guard.py: `python guard_calls.py`.

It joins RPC the kit's way (runtime.join_rpc: the guard is installed when MASKRCNN_DEVICE_MAP_GUARD
says so), makes each call below and prints one JSON line: call -> "ok" or "<ErrorType>: <message>".
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import torch
import torch.distributed.rpc as rpc
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))


class HostWithLambda:
    """What a stage host was: an object holding a closure (build_scheduler's lambda)."""

    def __init__(self) -> None:
        self.weights = torch.zeros(3)
        self.schedule = lambda iteration: 1.0

    def lr(self) -> float:
        return self.schedule(0)


class HostWithTurnstile:
    def __init__(self) -> None:
        from maskrcnn_dist.engines.pipeline.rounds import Turnstile

        self.turnstile = Turnstile()

    def lr(self) -> float:
        return 1.0


def tensors() -> dict:
    return {"features": {"0": torch.ones(2, 8, 4, 4)}, "sizes": [(4, 4), (4, 4)], "loss": torch.tensor(1.5)}


def nothing() -> None:
    return None


def host_with_lambda() -> HostWithLambda:
    return HostWithLambda()


def host_with_turnstile() -> HostWithTurnstile:
    return HostWithTurnstile()


def a_plain_lock() -> dict:
    return {"lock": threading.Lock()}


def a_module() -> nn.Module:
    return nn.Linear(2, 2)


def a_long_list_of_floats() -> list[float]:
    return torch.rand(100_000).tolist()


def raises() -> None:
    raise ValueError("stage failed")


@rpc.functions.async_execution
def async_value(make: str) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    threading.Timer(0.05, lambda: future.set_result(globals()[make]())).start()
    return future


@rpc.functions.async_execution
def chained(make: str) -> torch.futures.Future:
    """An async_execution function that answers with another call's future, as a pipeline stage answers
    with the next stage's (rpc_async's future is a torch._C.Future, not a torch.futures.Future)."""
    return rpc.rpc_async("solo", globals()[make], timeout=30)


def run(calls: dict) -> dict[str, str]:
    outcomes = {}
    for name, call in calls.items():
        try:
            call()
            outcomes[name] = "ok"
        except Exception as exc:
            outcomes[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
    return outcomes


def main() -> None:
    from dataclasses import replace

    from maskrcnn_launcher.peers import free_port
    from pipeline_procs import make_plans
    from pipeline_toy import small_config

    from maskrcnn_dist.engines.pipeline.runtime import _shutdown, join_rpc

    master, _ = make_plans(free_port())
    plan = replace(master, world_size=1)
    join_rpc(small_config(), plan, "solo", 0)

    def sync(fn, *args):
        return lambda: rpc.rpc_sync("solo", fn, args=args, timeout=30)

    def via_remote(cls_or_fn):
        # An RRef to the value, used through its proxy as the pipeline used its hosts.
        return lambda: rpc.remote("solo", cls_or_fn, timeout=30).rpc_sync(timeout=30).lr()

    def to_here(fn):
        return lambda: rpc.remote("solo", fn, timeout=30).to_here(timeout=30)

    outcomes = run(
        {
            "tensors": sync(tensors),
            "nothing": sync(nothing),
            "tensors via remote": to_here(tensors),
            "async tensors": sync(async_value, "tensors"),
            "chained tensors": sync(chained, "tensors"),
            "chained host with a lambda": sync(chained, "host_with_lambda"),
            "host with a lambda": sync(host_with_lambda),
            "host with a lambda via remote": via_remote(HostWithLambda),
            "host with a turnstile": sync(host_with_turnstile),
            "host with a turnstile via remote": via_remote(HostWithTurnstile),
            "a plain lock": sync(a_plain_lock),
            "a module": sync(a_module),
            "a long list of floats": sync(a_long_list_of_floats),
            "async host with a lambda": sync(async_value, "host_with_lambda"),
            "a local RRef to a host": lambda: rpc.RRef(HostWithLambda()),
            "raises": sync(raises),
        }
    )
    _shutdown(graceful=True)
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    main()
