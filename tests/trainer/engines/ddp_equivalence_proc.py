"""One rank of the ddp equivalence test, started by torchrun: `ddp_equivalence_proc.py OUT STEPS`.

Rank r trains on images 2r, 2r+1 of a 4-image batch; rank 0 then computes the single-process
reference on the whole batch (reference.local_accumulating) and saves both to OUT.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent / "pipeline"))
from pipeline_toy import NUM_CLASSES, make_batch  # noqa: E402
from reference import local_accumulating  # noqa: E402

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run  # noqa: E402
from maskrcnn_dist.engines.base import read_losses  # noqa: E402
from maskrcnn_dist.engines.torch_engine import TorchEngine, process_group  # noqa: E402

PER_RANK = 2


def config() -> TrainConfig:
    """The small CPU run with frozen BatchNorm (batch statistics would differ per rank by design) and
    no gradient clipping: clipping would hide a gradient of the wrong scale (seen: a doubled loss passed)."""
    flags = small_cpu_run(96, engine="ddp", seed=0, threads=1, lr=0.005, warmup_iters=0, backbone_norm="frozen")
    flags["lr-steps"] = "100"
    flags["rpc-timeout"] = 60.0
    cfg = apply_overrides(TrainConfig(), flags, "ddp equivalence test")
    return replace(cfg, optim=replace(cfg.optim, clip_grad_norm=None))


def main(out: Path, steps: int) -> None:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    cfg = config()
    images, targets = make_batch(4)
    with process_group(cfg) as world_size:
        assert world_size * PER_RANK == len(images)
        rank = dist.get_rank()
        shard = slice(PER_RANK * rank, PER_RANK * (rank + 1))
        engine = TorchEngine(cfg, NUM_CLASSES, iters_per_epoch=10, distributed=True)
        losses = [read_losses(engine.train_step(step, images[shard], targets[shard])) for step in range(steps)]
        state = engine.state_dict()["model"]
        states = [None] * world_size if rank == 0 else None
        dist.gather_object(state, states, dst=0)
        if rank == 0:
            ref_losses, ref_state = local_accumulating(cfg, steps, (images, targets), world_size, NUM_CLASSES)
            saved = {"ddp_losses": losses, "ddp_states": states, "ref_losses": ref_losses}
            torch.save({**saved, "ref_state": ref_state["model"]}, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
