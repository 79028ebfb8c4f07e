"""The leader's state to the newcomers of a generation, over its process group: one pickle, sent to each
newcomer's rank as a size and a byte tensor (gloo and NCCL alike; no object collective every member would
have to join)."""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist


def send(state: Any, ranks: Sequence[int]) -> None:
    """`state` to each of `ranks` (none: nothing is pickled)."""
    if not ranks:
        return
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
    for rank in ranks:
        dist.send(torch.tensor([data.numel()], dtype=torch.int64), rank)
        if data.numel():
            dist.send(data, rank)


def receive(src: int) -> Any:
    """What `send` sent this rank from rank `src`."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, src)
    data = torch.empty(int(size.item()), dtype=torch.uint8)
    if data.numel():
        dist.recv(data, src)
    return pickle.loads(data.numpy().tobytes())
