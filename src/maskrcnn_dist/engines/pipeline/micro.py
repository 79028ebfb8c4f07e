"""The master's micro-batches: a batch split into them, their losses weighed back together, and which
precision their stages may compute in."""

from __future__ import annotations

from collections.abc import Sequence

from maskrcnn_launcher.contract import StagePlacement
from torch import Tensor

from ...config import TrainConfig
from ..base import Images, Targets


def split_batch(images: Images, targets: Targets | None, micro_batches: int) -> list[tuple[Images, Targets | None]]:
    """Up to `micro_batches` contiguous, nearly equal slices (fewer when the batch is smaller)."""
    count = min(micro_batches, len(images))
    bounds = [round(i * len(images) / count) for i in range(count + 1)]
    return [(images[a:b], None if targets is None else targets[a:b]) for a, b in zip(bounds, bounds[1:])]


def weighted_mean(losses: Sequence[dict[str, Tensor]], sizes: Sequence[int]) -> dict[str, Tensor]:
    """Mean of the micro-batches' loss dicts weighted by their image counts.

    torchvision's terms are means over the sampled anchors/RoIs of a (micro-)batch; weighting by
    image count is the closest the micro-batch terms come to the full batch's mean (exact for M=1;
    for M>1 the sampling normalisers and BatchNorm's batch statistics differ per micro-batch).
    """
    total = sum(sizes)
    return {name: sum(d[name] * (n / total) for d, n in zip(losses, sizes)) for name in losses[0]}


def fp16_on_cpu_stage(cfg: TrainConfig, stages: Sequence[StagePlacement]) -> str | None:
    """Why fp16 cannot run on these stages: one is on the CPU. The command line refuses --device cpu with
    fp16 (config.fp16_on_cpu_problem), so only a library caller that says device "cpu" gets fp16 on a CPU
    stage (the tests run GradScaler's arithmetic there, as the local engine's do)."""
    if not (cfg.amp and cfg.amp_dtype == "float16") or cfg.device == "cpu":
        return None
    cpu = [s for s in stages if any(d == "cpu" for d in s.devices)]
    if not cpu:
        return None
    return (
        f"--amp-dtype float16: stage {cpu[0].stage} ({cpu[0].rpc_name}) runs on the CPU, which has no fast fp16 "
        "kernels; use --amp-dtype bfloat16 (the CPU default), or give that stage's worker GPUs"
    )
