"""One rank of the sync-BN test, started by torchrun: `sync_bn_proc.py OUT_DIR`.

Rank r runs a conv + BatchNorm, converted for --sync-bn, on its rows of one fixed batch of 6 (rank 0
rows 0-1, rank 1 rows 2-5: unequal parts, so a plain mean of the ranks' means would be wrong), and
saves its output, the gradients and the running statistics to OUT_DIR/rank{r}.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from maskrcnn_dist.config import TrainConfig, apply_overrides, small_cpu_run
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.modeling.sync_bn import AllReduceBatchNorm2d, convert_sync_batchnorm

ROWS = (slice(0, 2), slice(2, 6))


def make_net() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The network, its batch and the loss weights: the same on every rank and in the test (seeded)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    return net, torch.randn(6, 3, 8, 8) * 3 + 1, torch.randn(6, 4, 6, 6)


def engine_norms() -> dict[str, int]:
    """BatchNorm layers of the ddp engine's model with --sync-bn: synchronised ones, and any left plain."""
    flags = small_cpu_run(64, engine="ddp", sync_bn=True, backbone_norm="batch", rpc_timeout=60.0)
    model = TorchEngine(apply_overrides(TrainConfig(), flags, "sync-bn test"), 3, 4, distributed=True).model
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    synced = sum(isinstance(m, AllReduceBatchNorm2d) for m in norms)
    return {"synced": synced, "plain": len(norms) - synced}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net, batch, weights = make_net()
    net = convert_sync_batchnorm(net, torch.device("cpu")).train()
    rows = batch[ROWS[rank]].clone().requires_grad_()
    output = net(rows)
    (output * weights[ROWS[rank]]).sum().backward()
    bn = net[1]
    torch.save(
        {
            "output": output.detach(),
            "input_grad": rows.grad,
            "param_grads": {name: p.grad for name, p in net.named_parameters()},
            "running": (bn.running_mean.clone(), bn.running_var.clone()),
            "kind": type(bn).__name__,
            "engine_norms": engine_norms(),
        },
        out / f"rank{rank}.pt",
    )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
