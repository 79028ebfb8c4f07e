"""One stream per stage replica: the order of a replica's GPU work when RPC hands each request a stream.

Under device maps TensorPipe runs every request on streams from its pool, made current for the
called function (request_callback_impl.cpp `runPythonFunction`: `c10::MultiStreamGuard`) after they
waited for the request's incoming tensors; when the function returns, the agent records an event on
those streams for the result's tensors (`Future::markCompleted`) and sends them once it has passed.
So two requests for one replica (its forward of micro-batch k, then the gradient reduction, then the
optimizer step) may run on two different streams, and nothing on the GPU orders the second after
the first.

A `Lane` gives each replica one stream of its own, and every entry point of a stage host runs its
GPU work inside `lane.entered(...)`:
  1. the replica's stream waits for the caller's current stream (the request's: its incoming tensors
     are ready there) and for the lanes named in `after` (a reduction over replicas);
  2. the incoming tensors are marked as used by the replica's stream (`record_stream`), so that the
     caching allocator does not hand their memory out while the replica still reads them;
  3. the work runs with the replica's stream current;
  4. on the way out an event is recorded on the replica's stream and the caller's stream waits on it,
     so the event the agent records for the result covers the replica's work; the result's tensors
     are marked as used by the caller's stream (`Visit.hand_back`), which TensorPipe sends them from.

`CudaStreams` does this with torch.cuda streams and events. On a CPU replica the same calls go to
`NullStreams`, which does nothing; tests give a lane a recorder instead and check the order of the
calls (tests/trainer/engines/pipeline/test_streams.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

import torch

from .transport import tensors_in


class StreamOps(Protocol):
    """What a lane needs from a device's streams."""

    def new(self, device: torch.device) -> Any: ...

    def current(self, device: torch.device) -> Any: ...

    def wait_stream(self, waiter: Any, producer: Any) -> None: ...

    def record_event(self, stream: Any) -> Any: ...

    def wait_event(self, stream: Any, event: Any) -> None: ...

    def use(self, stream: Any) -> AbstractContextManager: ...

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None: ...


class NullStreams:
    """A CPU replica's streams: there is one order on a CPU, so every call does nothing."""

    def new(self, device: torch.device) -> None:
        return None

    def current(self, device: torch.device) -> None:
        return None

    def wait_stream(self, waiter: Any, producer: Any) -> None:
        return None

    def record_event(self, stream: Any) -> None:
        return None

    def wait_event(self, stream: Any, event: Any) -> None:
        return None

    def use(self, stream: Any) -> AbstractContextManager:
        return nullcontext()

    def record_stream(self, tensor: torch.Tensor, stream: Any) -> None:
        return None


class CudaStreams:
    """torch.cuda's streams and events."""

    def new(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.Stream(device)

    def current(self, device: torch.device) -> torch.cuda.Stream:
        return torch.cuda.current_stream(device)

    def wait_stream(self, waiter: torch.cuda.Stream, producer: torch.cuda.Stream) -> None:
        if waiter != producer:
            waiter.wait_stream(producer)

    def record_event(self, stream: torch.cuda.Stream) -> torch.cuda.Event:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: torch.cuda.Stream, event: torch.cuda.Event) -> None:
        stream.wait_event(event)

    def use(self, stream: torch.cuda.Stream) -> AbstractContextManager:
        return torch.cuda.stream(stream)  # also makes the stream's device current

    def record_stream(self, tensor: torch.Tensor, stream: torch.cuda.Stream) -> None:
        if tensor.is_cuda and tensor.device == stream.device:
            tensor.record_stream(stream)


def streams_for(device: torch.device) -> StreamOps:
    return CudaStreams() if device.type == "cuda" else NullStreams()


class Visit:
    """One entry point's stay on a lane: `hand_back` marks what it returns as the caller's."""

    def __init__(self, lane: Lane, caller: Any) -> None:
        self.lane, self.caller = lane, caller

    def hand_back(self, result: Any) -> Any:
        for tensor in tensors_in(result):
            self.lane.ops.record_stream(tensor, self.caller)
        return result


class Lane:
    """A replica's own stream on `device` (`ops`: that device's streams; by default `streams_for`)."""

    def __init__(self, device: torch.device, ops: StreamOps | None = None) -> None:
        self.device = device
        self.ops = ops if ops is not None else streams_for(device)
        self.stream = self.ops.new(device)

    @contextmanager
    def entered(self, incoming: Any = None, after: Sequence[Lane] = ()) -> Iterator[Visit]:
        """The body's GPU work on this lane, after the caller's stream and `after`'s lanes; the caller's
        stream waits for it when the body is done (also when it raises: the caller's stream must not
        run ahead of work that is still queued, whatever the body's outcome)."""
        ops = self.ops
        caller = ops.current(self.device)
        ops.wait_stream(self.stream, caller)
        for lane in after:
            ops.wait_stream(self.stream, lane.stream)
        for tensor in tensors_in(incoming):
            ops.record_stream(tensor, self.stream)
        try:
            with ops.use(self.stream):
                yield Visit(self, caller)
        finally:
            ops.wait_event(caller, ops.record_event(self.stream))
