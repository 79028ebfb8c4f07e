"""Batches on their way to the device while the current step runs.

`DevicePrefetcher(batches, device)` yields a rank's step batches (data/loader.py's StepBatch: its
micro-batches of a global batch) already on `device`. On a GPU each
batch's copy (pinned host memory to the device, non-blocking) and its uint8 images' conversion to
float are issued on a side stream one batch ahead; the compute stream waits for that copy only when
the batch is used, and every tensor is recorded on the compute stream so that the allocator keeps it
until the step is done with it. On the CPU it only converts.

Images may arrive as uint8 (a quarter of float32's bytes over PCIe): base.to_device makes them float32
in [0, 1] on the device, the values the loader's float path computes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch

from ..data.loader import StepBatch
from .base import to_device

Batch = StepBatch


def batch_on(batch: StepBatch, device: torch.device) -> StepBatch:
    """`batch` with every micro-batch's images (made float) and targets on `device`."""
    moved = []
    for micro in batch.micro_batches:
        images, targets = to_device(micro.images, micro.targets, device)
        moved.append(replace(micro, images=images, targets=targets))
    return replace(batch, micro_batches=moved)


class DevicePrefetcher:
    """Iterates `batches` on `device`, one batch's copy ahead on a side stream (GPU)."""

    def __init__(self, batches: Iterable[Batch], device: torch.device) -> None:
        self._batches = iter(batches)
        self._device = device
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._next = self._load()

    def _load(self) -> Batch | None:
        try:
            batch = next(self._batches)
        except StopIteration:
            return None
        if self._stream is None:
            return batch_on(batch, self._device)
        with torch.cuda.stream(self._stream):
            return batch_on(batch, self._device)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        batch = self._next
        if batch is None:
            raise StopIteration
        if self._stream is not None:
            compute = torch.cuda.current_stream(self._device)
            compute.wait_stream(self._stream)
            for tensor in _tensors(batch):
                tensor.record_stream(compute)
        self._next = self._load()
        return batch


def _tensors(batch: Batch) -> Iterator[torch.Tensor]:
    for micro in batch.micro_batches:
        yield from micro.images
        for target in micro.targets or ():
            yield from (v for v in target.values() if isinstance(v, torch.Tensor))
