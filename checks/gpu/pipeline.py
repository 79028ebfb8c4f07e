"""The pipeline engine's checks: the master and two stage workers through the launcher, against the
local engine with the same flags."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .harness import Env, needs_cuda
from .runs import base_flags, final_checkpoint, max_abs_diff, run_logged, train_config, train_local_run, train_losses

# Equivalence of the pipeline at M=1 to the local engine: float summation order only on CPU; on CUDA
# also the non-deterministic atomics of RoIAlign's backward.
EQUAL_TOLERANCE = {"cpu": 1e-5, "cuda": 1e-3}


def pipeline_topology(gpus: tuple[int, int], replicas: tuple[int, int], transport: str) -> dict[str, Any]:
    return {
        "engine": "pipeline",
        "master": {"devices": 0},
        "workers": [
            {"devices": gpus[0], "stage": "stage1", "replicas": replicas[0]},
            {"devices": gpus[1], "stage": "stage2", "replicas": replicas[1]},
        ],
        "stages": [
            {"name": "stage1", "modules": ["transform", "backbone"]},
            {"name": "stage2", "modules": ["rpn", "roi_heads"]},
        ],
        "network": {"transport": transport},
    }


def check_pipeline(env: Env, name: str, transport: str, replicas: int) -> dict[str, Any]:
    """The pipeline through the launcher against the local engine with the same flags: at M=1 the same
    losses and final weights; with 2 replicas (M=2) the first loss within the M>1 tolerance of the CPU
    tests. Either way the master's gathered checkpoint must load into the local engine."""
    from maskrcnn_launcher.peers import free_port

    from maskrcnn_dist.config import to_argv
    from maskrcnn_dist.data import load_datasets
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    gpus = 1 if env.device == "cuda" else 0
    topology = pipeline_topology((gpus, gpus * replicas), (1, replicas), transport)
    work = Path(env.work) / name
    work.mkdir(parents=True, exist_ok=True)
    topology_file = work / "topology.yaml"
    topology_file.write_text(json.dumps(topology))  # JSON is YAML
    micro = replicas  # M=1 for exact equivalence; each replica needs a micro-batch
    flags = base_flags(env, env.data, work / "pipeline", micro_batches=micro, rpc_timeout=60)
    flags.pop("threads", None)  # stage workers take 1 thread each (process.setup_process)
    flags["device"] = "cpu"  # the master's: the pipeline master holds no model; stages use the topology's devices
    command = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(topology_file)]
    command += ["--master-port", str(free_port()), "--wait-timeout", "60", "--grace", "5", "--", *to_argv(flags)]
    run_logged(command, work / "launch.log", 300, threads=1)
    # On CPU with the stage workers' one thread: the same summation order, so M=1 matches to float precision.
    local_threads = 1 if env.device == "cpu" else None
    local_dir = train_local_run(base_flags(env, env.data, work / "local", threads=local_threads))
    pipe, local = train_losses(work / "pipeline" / "metrics.jsonl"), train_losses(local_dir / "metrics.jsonl")
    if sorted(pipe) != sorted(local) or not pipe:
        raise AssertionError(f"steps differ: pipeline {sorted(pipe)}, local {sorted(local)}")
    loss_diff = max(abs(pipe[s] - local[s]) / max(abs(local[s]), 1e-12) for s in pipe)
    figures: dict[str, Any] = {
        "transport": transport,
        "replicas": replicas,
        "max_rel_loss_diff": float(f"{loss_diff:.3g}"),
    }
    # Gather: the master's checkpoint (every stage's part) loads into the local engine.
    gathered, reference = final_checkpoint(work / "pipeline"), final_checkpoint(local_dir)
    cfg = train_config(base_flags(env, env.data, work / "gathered"))
    train_set, _ = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=1)
    engine.load_state_dict(gathered)
    state_diff = max_abs_diff(engine.model.state_dict(), reference["model"])
    figures["max_weight_diff"] = float(f"{state_diff:.3g}")
    tolerance = EQUAL_TOLERANCE[env.device]
    if micro == 1:
        if loss_diff > tolerance or state_diff > tolerance:
            raise AssertionError(
                f"M=1 differs from the local engine: losses by {loss_diff:.3g}, weights by {state_diff:.3g} "
                f"(tolerance {tolerance:g})"
            )
    else:
        first = min(pipe)
        if abs(pipe[first] - local[first]) > max(0.25 * abs(local[first]), 0.05):
            raise AssertionError(f"first loss {pipe[first]:.4f} vs local {local[first]:.4f} (M>1 tolerance)")
    return figures


def needs_device_maps(env: Env) -> str | None:
    return needs_cuda(env)
