"""Batches to the device: uint8 images become the floats the loader's float path makes, and the
prefetcher yields every batch in order, converted, with nothing dropped at the end."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from maskrcnn_dist.data.loader import MicroBatch, StepBatch
from maskrcnn_dist.data.plan import RankShare
from maskrcnn_dist.engines.base import as_float_image, to_device
from maskrcnn_dist.engines.prefetch import DevicePrefetcher


def test_uint8_images_become_the_float_paths_values():
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16).repeat(3, axis=0)
    float_path = torch.from_numpy(np.asarray(pixels, dtype=np.float32) / 255.0)  # image_file's conversion
    assert torch.equal(as_float_image(torch.from_numpy(pixels)), float_path)
    already = torch.rand(3, 4, 4)
    assert as_float_image(already) is already


def _step_batch(i: int, micro_batches: int = 2) -> StepBatch:
    micro = [
        MicroBatch(
            [torch.full((3, 2, 2), i, dtype=torch.uint8)],
            [{"boxes": torch.tensor([[0.0, 0, 1, 1]]), "id": i}],
            micro=k,
            weight=Fraction(1, micro_batches),
        )
        for k in range(micro_batches)
    ]
    return StepBatch(micro, RankShare(()))


def test_the_prefetcher_yields_every_batch_in_order_on_the_device():
    batches = [_step_batch(i) for i in range(3)]
    seen = list(DevicePrefetcher(batches, torch.device("cpu")))
    assert [b.micro_batches[0].targets[0]["id"] for b in seen] == [0, 1, 2]
    for i, batch in enumerate(seen):
        assert [m.micro for m in batch.micro_batches] == [0, 1]  # every micro-batch, in order
        for micro, source in zip(batch.micro_batches, batches[i].micro_batches, strict=True):
            image = micro.images[0]
            assert image.dtype == torch.float32 and float(image[0, 0, 0]) == float(np.float32(i) / np.float32(255))
            assert torch.equal(micro.targets[0]["boxes"], source.targets[0]["boxes"]) and micro.weight == source.weight
    images, targets = to_device([torch.zeros(3, 1, 1, dtype=torch.uint8)], None, torch.device("cpu"))
    assert targets is None and images[0].dtype == torch.float32
