"""Tripwires on what the pipeline must never use (PyTorch lists them as unsupported with CUDA tensors over
RPC): RRefs (made, sent, received, fetched or called through), distributed autograd, the distributed
optimizer. `install(record)` wraps each entry point in this process before anything uses it; every call
appends its name to `record`, which exists (empty) from the moment the tripwires are in. RPC's own
start-up (dist_autograd._init, which init_rpc calls for every agent) and shut-down are not uses."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any


def _wire(owner: Any, name: str, label: str, record: Path) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def tripped(*args: Any, **kwargs: Any) -> Any:
        with open(record, "a") as out:
            out.write(label + "\n")
        return original(*args, **kwargs)

    setattr(owner, name, tripped)


def install(record: Path) -> None:
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.optim as dist_optim
    import torch.distributed.rpc as rpc
    import torch.distributed.rpc.api as rpc_api
    import torch.distributed.rpc.internal as rpc_internal

    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text("")
    for owner in (rpc, rpc_api):
        _wire(owner, "remote", "rpc.remote", record)
    for method in ("to_here", "local_value", "rpc_sync", "rpc_async", "remote"):
        _wire(rpc.PyRRef, method, f"RRef.{method}", record)
    _wire(rpc.RRef, "__init__", "RRef()", record)
    pickler = rpc_internal._InternalRPCPickler
    for method in ("_rref_reducer", "_py_rref_reducer", "_py_rref_receiver"):
        _wire(pickler, method, f"an RRef pickled ({method})", record)
    for function in ("backward", "get_gradients", "_new_context", "_retrieve_context", "_current_context"):
        _wire(dist_autograd, function, f"dist_autograd.{function}", record)
    _wire(dist_autograd.context, "__enter__", "dist_autograd.context", record)
    _wire(dist_optim.DistributedOptimizer, "__init__", "DistributedOptimizer", record)


def tripped(folder: Path) -> dict[str, list[str]]:
    """Each process's record (by file name) -> the uses it recorded."""
    return {path.name: path.read_text().splitlines() for path in sorted(folder.glob("*.log"))}
