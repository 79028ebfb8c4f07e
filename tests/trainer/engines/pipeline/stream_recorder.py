"""CPU stand-in streams that record every call a lane makes (engines/pipeline/streams.py), for order tests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

CALLER = "caller"  # the stream RPC made current for the request


class RecordingStreams:
    """Streams are names ("lane0", "lane1", ... in creation order; the caller's is CALLER). The current
    stream is per thread, as CUDA's is. `mark(what)` logs `what` with the stream current at that moment:
    a probe in a module's forward or an optimizer's step shows where that work was queued."""

    def __init__(self) -> None:
        self.log: list[tuple[str, ...]] = []
        self._lanes = 0
        self._local = threading.local()
        self._lock = threading.Lock()

    def _add(self, *entry: str) -> None:
        with self._lock:
            self.log.append(entry)

    def new(self, device: torch.device) -> str:
        with self._lock:
            self._lanes += 1
            return f"lane{self._lanes - 1}"

    def current(self, device: torch.device | None = None) -> str:
        return getattr(self._local, "stream", CALLER)

    def wait_stream(self, waiter: str, producer: str) -> None:
        self._add("wait", waiter, producer)

    def record_event(self, stream: str) -> str:
        self._add("record", stream)
        return f"event@{stream}"

    def wait_event(self, stream: str, event: str) -> None:
        self._add("wait_event", stream, event)

    @contextmanager
    def use(self, stream: str) -> Iterator[None]:
        before = self.current()
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = before

    def record_stream(self, tensor: torch.Tensor, stream: str) -> None:
        self._add("record_stream", stream)

    def mark(self, what: str, *_: Any) -> None:
        self._add(what, self.current())
