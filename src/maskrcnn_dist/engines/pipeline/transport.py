"""What crosses a stage's edges, by value: activations forward, their gradients back, and how each leaves.

A stage's output crosses to the next stage as an `Activation`: the MicroBatchState with every tensor
detached, and which of its tensors (their positions in `tensors_in` order) want a gradient back. In
training the sender keeps those tensors with their graph (`cut`); the receiver makes them leaves that
require grad (`attach`), and its backward's gradients of those leaves travel back in the same order.
Integer tensors, targets and detached proposals never want one: no gradient traffic for them.

How a tensor leaves a replica over an edge (`Route`): as it is where the caller's device map covers
the replica's device (TensorPipe moves it GPU to GPU), through a covered device of the same worker
(a local copy first) where the map leaves this replica out, or through host memory where the edge has
no map (a CPU end, or `transport: cpu`). An empty CUDA tensor always leaves as an empty host tensor:
TensorPipe aborts the process that sends one (pytorch/tensorpipe#447).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
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


# -- routes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """How one replica's tensors leave over one edge: from `via` (a device the caller's device map
    covers: the replica's own, or one of its worker's), or through host memory (`via` None)."""

    via: str | None = None

    def send(self, t: Tensor) -> Tensor:
        if t.device.type == "cpu":
            return t
        if self.via is None:
            return t.cpu()
        if t.numel() == 0:  # pytorch/tensorpipe#447; from_wire puts it back on the device
            return torch.empty(t.shape, dtype=t.dtype)
        return t.to(self.via)


HOST = Route()


def route_for(device_map: Mapping[str, str], device: str) -> Route:
    """The route of a replica on `device` over an edge whose caller-side map is `device_map` ({this
    worker's device: the callee's}, contract.edge_device_map): its own device where the map covers it,
    else a covered device of this worker (by device index, so replicas spread over them), else host memory."""
    if device in device_map:
        return Route(device)
    covered = list(device_map)
    if not covered or not device.startswith("cuda"):
        return HOST
    return Route(covered[torch.device(device).index % len(covered)])


# -- activations and gradients ------------------------------------------------------------------------


@dataclass
class Activation:
    """A micro-batch's state as it crosses to the next stage: every tensor detached (by value), and the
    positions (in `tensors_in` order) of those whose gradient the receiver sends back."""

    state: MicroBatchState
    wants_grad: tuple[int, ...] = ()

    @classmethod
    def of_inputs(cls, images: list[Tensor], targets: list[dict[str, Tensor]] | None) -> Activation:
        """What the master sends the first stage: images and targets, nothing to send a gradient to."""
        return cls(MicroBatchState.from_inputs(images, targets))


def cut(state: MicroBatchState, train: bool) -> tuple[Activation, list[Tensor]]:
    """The sender's side: `state` (as it leaves, `to_wire`) as an Activation, and in training the tensors
    whose gradients come back, with their graph (what the stage's backward starts from)."""
    tensors = tensors_in(state)
    wanted = tuple(i for i, t in enumerate(tensors) if train and t.requires_grad)
    detached = map_tensors(state, lambda t: t.detach())
    return Activation(detached, wanted), [tensors[i] for i in wanted]


def attach(activation: Activation) -> tuple[MicroBatchState, list[Tensor]]:
    """The receiver's side: the state with the tensors that want a gradient made leaves that require
    one, and those leaves, in the sender's order (their `.grad` after backward is what goes back)."""
    wanted, leaves = set(activation.wants_grad), []
    position = itertools.count()

    def leaf(t: Tensor) -> Tensor:
        if next(position) not in wanted:
            return t
        made = t.detach().requires_grad_()
        leaves.append(made)
        return made

    return map_tensors(activation.state, leaf), leaves


def to_wire(state: MicroBatchState, bf16_features: bool, route: Route = HOST) -> MicroBatchState:
    """A stage's output as it leaves for the next stage: features in bf16 on request, every tensor on
    its `route` (autograd flows through both: the gradients come back to the stage's own tensors)."""
    if bf16_features and state.features is not None:
        state.features = map_tensors(state.features, lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t)
    return map_tensors(state, route.send)


def from_wire(state: MicroBatchState, device: torch.device, keep_bf16: bool = False) -> MicroBatchState:
    """Undo to_wire on the receiving replica: its device, and fp32 features again (unless the stage
    runs under bf16 autocast, which would cast them straight back)."""
    state = map_tensors(state, lambda t: t.to(device))
    if state.features is not None and not keep_bf16:
        state.features = map_tensors(state.features, lambda t: t.float() if t.dtype == torch.bfloat16 else t)
    return state


def send_gradients(grads: list[Tensor | None], route: Route) -> list[Tensor | None]:
    """A stage's input gradients as they leave for the stage before, on `route`."""
    return [None if g is None else route.send(g) for g in grads]
