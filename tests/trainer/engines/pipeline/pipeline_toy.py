"""Tiny hand-made batches and the small model, shared by the pipeline tests and their processes."""

from __future__ import annotations

import torch

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run

NUM_CLASSES = 3
SIZE = 96


def small_config(peer_timeout: float = 20.0, size: int = SIZE, **pipeline: object) -> TrainConfig:
    """The small CPU run at `size` px: batch-statistics BatchNorm, no warm-up, global gradient clipping at 5
    (a random model's mask loss starts near 9 and diverges at lr 0.01 without it), one thread."""
    flags = small_cpu_run(
        size,
        engine="pipeline",
        seed=0,
        threads=1,
        lr=0.01,
        warmup_iters=0,
        lr_steps="100",
        clip_grad_norm=5.0,
        rpc_timeout=peer_timeout,
        # trainer/conftest.py's TEST_HEADS (a process of these tests reads this file alone)
        box_batch_size_per_image=32,
        detections_per_image=20,
        **{"micro_batches": 1, **pipeline},
    )
    return apply_overrides(TrainConfig(), flags, "pipeline tests")


def make_batch(num_images: int, seed: int = 0, size: int = SIZE) -> tuple[list[torch.Tensor], list[dict]]:
    """Random images with one or two filled rectangles each: their boxes, labels and masks."""
    gen = torch.Generator().manual_seed(seed)
    images, targets = [], []
    for i in range(num_images):
        height, width = size - 8 * (i % 2), size  # two shapes: padding and resizing both matter
        image = torch.rand(3, height, width, generator=gen) * 0.2
        boxes, masks, labels = [], [], []
        for j in range(1 + i % 2):
            x0, y0 = (
                int(torch.randint(0, width // 2, (1,), generator=gen)),
                int(torch.randint(0, height // 2, (1,), generator=gen)),
            )
            x1, y1 = x0 + 20 + 10 * j, y0 + 24
            mask = torch.zeros(height, width, dtype=torch.uint8)
            mask[y0:y1, x0:x1] = 1
            image[:, y0:y1, x0:x1] += 0.6 + 0.2 * j
            boxes.append([x0, y0, x1, y1])
            masks.append(mask)
            labels.append(1 + (i + j) % (NUM_CLASSES - 1))
        images.append(image.clamp(0, 1))
        targets.append(
            {
                "boxes": torch.tensor(boxes, dtype=torch.float32),
                "labels": torch.tensor(labels),
                "masks": torch.stack(masks),
            }
        )
    return images, targets
