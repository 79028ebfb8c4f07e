"""What happens to a MicroBatchState at the edge of a stage: device staging, bf16 features, byte counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from maskrcnn_launcher.contract import StagePlacement, edge_device_map
from torch import Tensor

from .stages import MicroBatchState

T = TypeVar("T")


def map_tensors(obj: T, fn: Callable[[Tensor], Tensor]) -> T:
    """`obj` with every tensor inside (dataclasses, dicts, lists, tuples) replaced by fn(tensor)."""
    if isinstance(obj, Tensor):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: map_tensors(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)}
        )
    if isinstance(obj, dict):
        return type(obj)((k, map_tensors(v, fn)) for k, v in obj.items())  # keeps OrderedDict
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn) for v in obj)
    return obj


def tensors_in(obj: Any) -> list[Tensor]:
    found: list[Tensor] = []

    def collect(t: Tensor) -> Tensor:
        found.append(t)
        return t

    map_tensors(obj, collect)
    return found


def wire_bytes(obj: Any) -> int:
    """Bytes TensorPipe sends for the tensors in `obj`: whole storages (a view ships its whole
    storage), each storage once."""
    storages = {}
    for t in tensors_in(obj):
        storage = t.untyped_storage()
        storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def gradient_bytes(obj: Any) -> int:
    """Bytes of the gradients that come back over the same link in backward (one per tensor that
    requires grad, same shape and dtype)."""
    return sum(t.numel() * t.element_size() for t in tensors_in(obj) if t.requires_grad)


def sends_device_tensors(placements: Sequence[StagePlacement], index: int, transport: str) -> frozenset[str]:
    """The devices of stage `index` whose outputs may leave as device tensors: those the next stage's
    device map (contract.edge_device_map) maps. Every other output is staged through host memory:
    a CUDA tensor TensorPipe has no map for fails the RPC. The last stage answers the master, which
    has no GPU and no map."""
    if index + 1 >= len(placements):
        return frozenset()
    mapping = edge_device_map(transport, placements[index].devices, placements[index + 1].devices)
    return frozenset(mapping.values())


def to_wire(state: MicroBatchState, bf16_features: bool, to_cpu: bool) -> MicroBatchState:
    """Prepare a stage's output for the next stage: features in bf16 on request (autograd flows
    through the cast), and every tensor in host memory unless device maps move them directly; even
    then an empty device tensor goes as an empty host tensor (`empty_on_host`)."""
    if bf16_features and state.features is not None:
        state.features = map_tensors(state.features, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)
    return map_tensors(state, (lambda t: t.cpu()) if to_cpu else empty_on_host)


def empty_on_host(t: Tensor) -> Tensor:
    """`t`, or an empty host tensor of its shape and dtype when it is an empty device tensor. TensorPipe
    aborts the process that sends a CUDA tensor with no elements (its null pointer has no device:
    pytorch/tensorpipe#447, seen on an H200 with an image without objects); from_wire puts it back on
    the device. Nothing flows back through an empty tensor, so it needs no autograd link."""
    return torch.empty(t.shape, dtype=t.dtype) if t.device.type != "cpu" and t.numel() == 0 else t


def from_wire(state: MicroBatchState, device: torch.device, keep_bf16: bool = False) -> MicroBatchState:
    """Undo to_wire on the receiving replica: its device, and fp32 features again (unless the stage
    runs under bf16 autocast, which would cast them straight back)."""
    state = map_tensors(state, lambda t: t.to(device))
    if state.features is not None and not keep_bf16:
        state.features = map_tensors(state.features, lambda t: t.float() if t.dtype == torch.bfloat16 else t)
    return state
