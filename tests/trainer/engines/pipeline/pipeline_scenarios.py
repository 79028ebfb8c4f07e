"""What the master process does in each multi-process test; results go to OUT/result.pt."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed.rpc as rpc
from pipeline_procs import make_plans
from pipeline_toy import NUM_CLASSES, make_batch
from reference import local_accumulating

from maskrcnn_dist.engines.base import read_losses
from maskrcnn_dist.engines.pipeline import PipelineEngine, guard, hosts, master_session
from maskrcnn_dist.engines.pipeline.stages import MicroBatchState
from maskrcnn_dist.engines.torch_engine import TorchEngine

# A schedule that changes at every step of the scheduled run: warm-up over 3 steps from a quarter of
# the rate, then x0.1 at epoch 2 = iteration 4 (2 iterations per epoch): factors 0.5, 0.75, 1, 0.1.
SCHEDULE = {"warmup_iters": 3, "warmup_factor": 0.25, "lr_steps": (2,), "lr_gamma": 0.1}
SCHEDULE_ITERS = 2
SCHEDULE_STEPS = 4


def _pipeline(
    cfg, micro_batches: int, replicas=(1, 1), iters_per_epoch: int = 10, schedule: str = "1f1b"
) -> PipelineEngine:
    master, _ = make_plans(0, replicas=replicas)
    cfg = replace(cfg, pipeline=replace(cfg.pipeline, micro_batches=micro_batches, schedule=schedule))
    stages = [replace(s, devices=("cpu",) * r) for s, r in zip(master.stages, replicas)]
    return PipelineEngine(cfg, stages, NUM_CLASSES, iters_per_epoch=iters_per_epoch)


def _stage_lrs(engine: PipelineEngine) -> list[float]:
    """Every stage's current learning rate, read from its optimizer."""
    return [h.state().wait()["optimizer"]["param_groups"][0]["lr"] for h in engine.hosts]


def _train(engine, steps: int, batch) -> list[dict[str, float]]:
    return [read_losses(engine.train_step(step, *batch)) for step in range(steps)]


def compare(args: dict, cfg) -> None:
    """Pipeline vs the local engine: M=1 equality, M=2, replicas, eval, validation, checkpoints."""
    master, _ = make_plans(args["port"])
    batch = make_batch(4, size=args["size"])
    out: dict = {}
    steps = args.get("steps", 2)
    local = TorchEngine(replace(cfg, engine="local"), NUM_CLASSES, iters_per_epoch=10)
    out["local_losses"] = _train(local, steps, batch)
    out["local_state"] = local.state_dict()
    reference = local_accumulating(cfg, steps, batch, micro_batches=2, num_classes=NUM_CLASSES)
    out["local_m2_losses"], out["local_m2_state"] = reference
    scheduled = replace(cfg, optim=replace(cfg.optim, **SCHEDULE))
    sched_batch = make_batch(2, size=args["size"])  # the rates are what is compared: the smallest batch M=1 splits fine
    local_s = TorchEngine(replace(scheduled, engine="local"), NUM_CLASSES, iters_per_epoch=SCHEDULE_ITERS)
    out["sched_local_lrs"] = []
    for step in range(SCHEDULE_STEPS):
        local_s.train_step(step, *sched_batch)
        out["sched_local_lrs"].append(local_s.lr())
    out["sched_local_state"] = local_s.state_dict()
    with master_session(cfg, master):
        one = _pipeline(cfg, 1)
        out["m1_losses"] = _train(one, steps, batch)
        out["m1_state"] = one.state_dict()
        out["metrics"] = one.extra_metrics()
        # Evaluation and validation through the pipeline on the local engine's exact weights; both
        # engines' seeding positions are at the last step, `steps - 1`.
        one.load_state_dict(out["local_state"])
        before = one.state_dict()
        images = make_batch(2, seed=5, size=args["size"])[0]
        out["local_pred"], out["pipe_pred"] = local.predict(images), one.predict(images)
        out["local_val"], out["pipe_val"] = local.validation_losses(*batch), one.validation_losses(*batch)
        out["after_val_equal"] = _same_model(before, one.state_dict())
        one.close()
        # M=2 with one and with two replicas per stage; the latter also shows the loss falling after one step
        # (seen at 96 px: 10.7, then 5.0).
        two = _pipeline(cfg, 2)
        out["m2_losses"] = _train(two, steps, batch)
        out["m2_state"] = two.state_dict()
        two.close()
        sched = _pipeline(scheduled, 1, iters_per_epoch=SCHEDULE_ITERS)
        out["sched_pipe_lrs"] = []
        for step in range(SCHEDULE_STEPS):
            sched.train_step(step, *sched_batch)
            out["sched_pipe_lrs"].append(_stage_lrs(sched))
        out["sched_pipe_state"] = sched.state_dict()
        sched.close()
        # Four micro-batches under each schedule, over real RPC: the same bits after a step (weights and
        # momenta alike decide every later step).
        for schedule in ("gpipe", "1f1b"):
            four = _pipeline(cfg, 4, schedule=schedule)
            out[f"m4_{schedule}_losses"] = _train(four, 1, batch)
            out[f"m4_{schedule}_state"] = four.state_dict()
            out[f"m4_{schedule}_metrics"] = four.extra_metrics()
            four.close()
        rep = _pipeline(cfg, 2, replicas=(2, 2))
        out["r2_losses"] = _train(rep, steps, batch)
        out["r2_state"] = rep.state_dict()
        out["r2_checksums"] = [h.state().wait()["checksums"] for h in rep.hosts]
        rep.close()
        # Every process of the session ran under the device-map guard, and closed engines left no host.
        out["guarded"] = {name: rpc.rpc_sync(name, guard.is_installed) for name in ("worker1", "worker2")}
        out["guarded"]["master"] = guard.is_installed()
        out["hosts_left"] = {name: rpc.rpc_sync(name, hosts_alive) for name in ("worker1", "worker2")}
    torch.save(out, Path(args["out"]) / "result.pt")


def hosts_alive() -> int:
    """On a worker: the stage hosts its registry holds."""
    return len(hosts.REGISTRY.keys())


def _same_model(a: dict, b: dict) -> bool:
    return all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def train_cli(args: dict, cfg) -> None:
    """train()'s pipeline master path: synthetic data, the shared Trainer, checkpoints, metrics."""
    from maskrcnn_dist.train import train

    master, _ = make_plans(args["port"])
    data = replace(
        cfg.data,
        synthetic_images=args.get("images", 8),
        synthetic_image_size=args["size"],
        batch_size=2,
        workers=0,
        val_batch_size=2,
    )
    cfg = replace(
        cfg,
        data=data,
        max_steps=args["steps"],
        epochs=100,
        print_freq=1,
        checkpoint_period=args.get("checkpoint_period", 0),
        eval_every_epoch=False,
    )
    train(cfg, master)


__all__ = ["MicroBatchState", "compare", "train_cli"]
