"""One command that proves the GPU paths: correctness, ddp, the pipeline and throughput, in ~10 minutes.

    .venv/bin/python benchmarks/gpu_check.py [--device cuda|cpu] [--json-out FILE] [--time-budget 600]

`make gpu-check` runs it on a GPU machine (R50-FPN, short side 800 px). With `--device cpu` it is
a quick self-test of the same checks (ResNet-18 FPN, tiny images, 1-3 steps) that the test suite runs
(tests/trainer/test_gpu_check.py), so the script cannot rot between GPU sessions.

Every check runs in its own process (`--child NAME`) with a time budget: a check that raises, crashes
the interpreter or runs past its budget ends as "fail" with one line saying why, and the run goes on
to the next. A check that cannot run here ends as "skipped" with the reason ("needs 2 GPUs"). The
run prints a table (check, result, key figures, seconds) and writes the JSON report. Checks:

- local_fp32, local_amp_fp16, local_amp_bf16: the local engine from the same seed and weights for a
  few steps at lr 0.005; the amp curves within perf.AMP_CURVE_TOLERANCE of fp32 (the CPU amp tests'
  bound). fp16 runs with the GradScaler (CUDA only).
- eval_amp: COCO AP of the fp32 run's weights in fp32 and under --amp: finite, and within 0.05.
- checkpoint_devices: a checkpoint saved on the GPU loads on CPU, and the reverse (checkpoint.py's
  map_location="cpu" and the engines' load_state_dict), weights equal, a step runs after each.
- ddp: 2 processes under torchrun; nccl with >= 2 GPUs, gloo with CUDA tensors on one GPU, gloo on CPU
  (contract.process_group_backend); the backend used is read back from the trainer's log.
- pipeline_cpu, pipeline_device_maps, pipeline_replicas: `maskrcnn-launch local` (master + 2 stage
  workers on loopback) with transport cpu, device_maps (stages on the GPUs), and 2 replicas of stage
  2 on 2 GPUs; at M=1 the losses and final weights equal the local engine's (float tolerance), and
  the master's gathered checkpoint loads into the local engine.
- throughput_b2, _b4, _b8: images/s and peak GPU memory of the local engine (fp32 and --amp, its
  defaults: channels_last) and of the same model trained by torchvision's reference loop
  (references/detection train_one_epoch: default memory format, torch.autocast fp16 + GradScaler
  under --amp), on the same in-memory batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_engines  # noqa: E402  (a sibling script, not a package)
import bench_throughput  # noqa: E402
from maskrcnn_launcher.peers import free_port  # noqa: E402

RESULTS = ("pass", "fail", "skipped")
DEFAULT_JSON = Path("runs/gpu-check/gpu_check.json")
CURVE_LR = 0.005  # tests/trainer/test_amp.py: fp32 is stable under reordering at this rate
EVAL_AP_TOLERANCE = 0.05
INJECTED = "injected_failure"
INJECTED_HANG = "injected_hang"


@dataclass(frozen=True)
class Profile:
    """Model, sizes and step counts of one device kind."""

    model: str
    image_size: int  # short side of the model's resize, and the largest side of the synthetic images
    max_size: int
    batch_size: int
    curve_steps: int
    run_steps: int  # ddp and pipeline runs
    throughput_batches: tuple[int, ...]
    throughput_warmup: int
    throughput_steps: int
    train_images: int
    val_images: int
    # Equivalence of the pipeline at M=1 to the local engine: float summation order only on CPU; on
    # CUDA also the non-deterministic atomics of RoIAlign's backward.
    equal_tolerance: float


PROFILES = {
    "cuda": Profile("maskrcnn_resnet50_fpn", 800, 1333, 2, 6, 2, (2, 4, 8), 3, 10, 16, 4, 1e-3),
    "cpu": Profile("maskrcnn_resnet18_fpn", 64, 64, 2, 3, 2, (2,), 1, 1, 8, 2, 1e-5),
}


@dataclass(frozen=True)
class Env:
    """What every check's process gets from the runner (JSON through --plan)."""

    device: str  # "cuda" or "cpu"
    gpus: int
    work: str
    inject_failure: bool = False

    @property
    def profile(self) -> Profile:
        return PROFILES[self.device]

    @property
    def data(self) -> Path:
        return Path(self.work) / "data"  # train split only: no validation or COCO AP inside runs

    @property
    def eval_data(self) -> Path:
        return Path(self.work) / "data-eval"  # train (linked) + val


class Skip(Exception):
    """The check cannot run on this machine; the message says why."""


@dataclass
class CheckResult:
    name: str
    result: str  # one of RESULTS
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # the error line of a failure, or why it was skipped


@dataclass(frozen=True)
class Check:
    name: str
    budget_s: float
    run: Callable[[Env], dict[str, Any]]
    # Why it cannot run here, or None; decided by the runner, without starting a process.
    needs: Callable[[Env], str | None] = lambda env: None


# -- helpers shared by the checks ----------------------------------------------------------------


def needs_cuda(env: Env) -> str | None:
    return None if env.device == "cuda" else "needs CUDA (--device cpu)"


def needs_two_gpus(env: Env) -> str | None:
    return None if env.gpus >= 2 else f"needs 2 GPUs ({env.gpus} here)"


def base_flags(env: Env, data: Path, output_dir: Path, **flags: Any) -> dict[str, Any]:
    """The run every check starts from: bench_engines.train_flags at this profile's model and size."""
    p = env.profile
    cfg = bench_engines.BenchConfig(p.model, p.image_size, p.batch_size, p.run_steps, 0, 0, 0, 0.0)
    values = {
        **bench_engines.train_flags(cfg, data, output_dir),
        "max-size": p.max_size,
        "device": env.device,
        "max-steps": p.run_steps,
        "print-freq": 1,
        "warmup-iters": 10,
        "threads": 2 if env.device == "cpu" else None,
    }
    values.update({k.replace("_", "-"): v for k, v in flags.items()})
    return {k: v for k, v in values.items() if v is not None}


def train_config(values: dict[str, Any]):
    from maskrcnn_dist.config import TrainConfig, apply_overrides

    cfg = apply_overrides(TrainConfig(), values, "gpu-check")
    cfg.validate()
    return cfg


def loss_curve(cfg, steps: int):
    """Total loss of each of the first `steps` steps of the local engine, and the engine."""
    from maskrcnn_dist.data import build_train_loader, load_datasets
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    train_set, _ = load_datasets(cfg)
    engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=steps)
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        for images, targets in build_train_loader(train_set, cfg.data.batch_size, epoch=epoch, seed=cfg.seed):
            losses.append(sum(engine.train_step(len(losses), images, targets).values()))
            if len(losses) == steps:
                break
        epoch += 1
    return losses, engine


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest absolute difference between the floating tensors of two state dicts with the same keys."""
    if set(a) != set(b):
        raise AssertionError(f"state dicts differ in keys: {sorted(set(a) ^ set(b))[:4]}")
    return max(
        (float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a if a[k].is_floating_point()),
        default=0.0,
    )


def train_losses(metrics_file: Path) -> dict[int, float]:
    from maskrcnn_dist.training.metrics import read_metrics

    return {r["step"]: float(r["loss"]) for r in read_metrics(metrics_file) if r["kind"] == "train"}


def run_logged(command: list[str], log_file: Path, timeout_s: float, threads: int) -> str:
    """Run a process tree to completion (bench_engines.run_group: own session, ended afterwards); its log."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    bench_engines.run_group(command, env, log_file, timeout_s)
    return log_file.read_text()


def train_local_run(env: Env, values: dict[str, Any]) -> Path:
    """The local engine in this process through the library (train.train), as `maskrcnn-dist train` runs it."""
    from maskrcnn_dist.train import train

    cfg = train_config({**values, "engine": "local"})
    train(cfg)
    return Path(values["output-dir"])


def final_checkpoint(output_dir: Path) -> dict[str, Any]:
    from maskrcnn_dist.checkpoint import load_checkpoint

    return load_checkpoint(output_dir / "checkpoints")


# -- the checks -----------------------------------------------------------------------------------


def check_local(env: Env, precision: str) -> dict[str, Any]:
    """A loss curve at CURVE_LR; fp32 keeps its curve and weights for the amp checks and eval_amp."""
    from maskrcnn_dist.checkpoint import save_checkpoint
    from maskrcnn_dist.modeling.perf import AMP_CURVE_TOLERANCE

    work = Path(env.work)
    amp = {"fp32": {}, "fp16": {"amp": True, "amp-dtype": "float16"}, "bf16": {"amp": True, "amp-dtype": "bfloat16"}}
    values = base_flags(env, env.data, work / f"local-{precision}", lr=CURVE_LR, **amp[precision])
    losses, engine = loss_curve(train_config(values), env.profile.curve_steps)
    figures: dict[str, Any] = {"losses": [round(x, 5) for x in losses]}
    if not all(map(math.isfinite, losses)):
        raise AssertionError(f"non-finite loss in {losses}")
    if precision == "fp32":
        (work / "curve-fp32.json").write_text(json.dumps(losses))
        save_checkpoint({**engine.state_dict(), "step": len(losses)}, work / "fp32-weights", len(losses), keep=1)
        return figures
    reference = work / "curve-fp32.json"
    if not reference.is_file():
        raise AssertionError("no fp32 curve to compare with (local_fp32 did not pass)")
    fp32 = json.loads(reference.read_text())
    figures["max_rel_dev"] = round(max(abs(a - f) / abs(f) for a, f in zip(losses, fp32, strict=True)), 4)
    if precision == "fp16":
        figures["scaler_scale"] = float(engine.scaler.get_scale())
        if not engine.scaler.is_enabled():
            raise AssertionError("the GradScaler is not active under fp16 on CUDA")
    problems = AMP_CURVE_TOLERANCE.problems(losses, fp32)
    if problems:
        raise AssertionError(f"{precision} curve vs fp32: {'; '.join(problems)}")
    return figures


def needs_bf16(env: Env) -> str | None:
    if env.device != "cuda":
        return None
    import torch

    return None if torch.cuda.is_bf16_supported() else "needs a GPU with bfloat16"


def check_eval_amp(env: Env) -> dict[str, Any]:
    from maskrcnn_dist.checkpoint import load_checkpoint
    from maskrcnn_dist.data import load_datasets
    from maskrcnn_dist.engines.torch_engine import TorchEngine
    from maskrcnn_dist.evaluation import evaluate

    state = load_checkpoint(Path(env.work) / "fp32-weights")
    figures: dict[str, Any] = {}
    for name, amp in (("fp32", False), ("amp", True)):
        cfg = train_config(base_flags(env, env.eval_data, Path(env.work) / f"eval-{name}", amp=amp))
        train_set, val_set = load_datasets(cfg)
        engine = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=1)
        engine.load_state_dict(state)
        metrics = evaluate(engine, val_set, batch_size=cfg.data.val_batch_size, workers=0)
        assert metrics is not None
        figures[f"{name}_bbox_AP"], figures[f"{name}_segm_AP"] = (round(metrics[k], 4) for k in ("bbox_AP", "segm_AP"))
    for kind in ("bbox", "segm"):
        fp32, amp = figures[f"fp32_{kind}_AP"], figures[f"amp_{kind}_AP"]
        if not (math.isfinite(fp32) and math.isfinite(amp)) or abs(fp32 - amp) > EVAL_AP_TOLERANCE:
            raise AssertionError(f"{kind} AP under amp {amp:.4f} vs fp32 {fp32:.4f} (tolerance {EVAL_AP_TOLERANCE})")
    return figures


def check_checkpoint_devices(env: Env) -> dict[str, Any]:
    """Saved on one device kind, loaded on the other, through checkpoint.py; weights equal, one more step."""
    from maskrcnn_dist.checkpoint import load_checkpoint, save_checkpoint
    from maskrcnn_dist.data import build_train_loader, load_datasets
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    figures: dict[str, Any] = {}
    for source, target in (("cuda", "cpu"), ("cpu", "cuda")):
        engines = {}
        for device in (source, target):
            cfg = train_config(base_flags(env, env.data, Path(env.work) / f"ckpt-{source}", device=device))
            train_set, _ = load_datasets(cfg)
            engines[device] = TorchEngine(cfg, train_set.num_classes, iters_per_epoch=4)
        images, targets = next(iter(build_train_loader(train_set, 2, epoch=0, seed=0)))
        engines[source].train_step(0, images, targets)
        path = save_checkpoint(
            {**engines[source].state_dict(), "step": 1}, Path(env.work) / f"ckpt-{source}", 1, keep=1
        )
        state = load_checkpoint(path)
        engines[target].load_state_dict(state)
        diff = max_abs_diff(engines[target].model.state_dict(), engines[source].model.state_dict())
        if diff != 0.0:
            raise AssertionError(f"{source} -> {target}: weights differ by {diff:g} after loading")
        losses = engines[target].train_step(1, images, targets)
        if not all(map(math.isfinite, losses.values())):
            raise AssertionError(f"{source} -> {target}: non-finite loss after loading: {losses}")
        figures[f"{source}_to_{target}_loss"] = round(sum(losses.values()), 5)
    return figures


def check_ddp(env: Env) -> dict[str, Any]:
    """2 ranks under torchrun; the backend the trainer chose, from its log line."""
    from maskrcnn_launcher.contract import process_group_backend

    out = Path(env.work) / "ddp"
    flags = base_flags(env, env.data, out, engine="ddp", threads=1 if env.device == "cpu" else None)
    log = run_logged(bench_engines.torchrun_command(2, flags), out / "torchrun.log", 240, threads=1)
    used = sorted(set(re.findall(r"ddp rank \d+ of 2 on \S+ \((\w+)\)", log)))
    expected = process_group_backend(env.device == "cuda", shares_gpu=env.device == "cuda" and env.gpus < 2)
    if used != [expected]:
        raise AssertionError(f"backend {used or 'not logged'}, expected {expected}")
    losses = train_losses(out / "metrics.jsonl")
    if sorted(losses) != list(range(1, env.profile.run_steps + 1)) or not all(map(math.isfinite, losses.values())):
        raise AssertionError(f"train records {losses}")
    return {"backend": expected, "gpus": env.gpus, "losses": [round(v, 5) for v in losses.values()]}


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
    port = free_port()
    command = [sys.executable, "-m", "maskrcnn_launcher", "local", "--topology", str(topology_file)]
    command += ["--master-port", str(port), "--wait-timeout", "60", "--grace", "5", "--", *to_argv(flags)]
    run_logged(command, work / "launch.log", 300, threads=1)
    # On CPU with the stage workers' one thread: the same summation order, so M=1 matches to float precision.
    local_threads = 1 if env.device == "cpu" else None
    local_dir = train_local_run(env, base_flags(env, env.data, work / "local", threads=local_threads))
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
    if micro == 1:
        if loss_diff > env.profile.equal_tolerance or state_diff > env.profile.equal_tolerance:
            raise AssertionError(
                f"M=1 differs from the local engine: losses by {loss_diff:.3g}, weights by {state_diff:.3g} "
                f"(tolerance {env.profile.equal_tolerance:g})"
            )
    else:
        first = min(pipe)
        if abs(pipe[first] - local[first]) > max(0.25 * abs(local[first]), 0.05):
            raise AssertionError(f"first loss {pipe[first]:.4f} vs local {local[first]:.4f} (M>1 tolerance)")
    return figures


def needs_device_maps(env: Env) -> str | None:
    return needs_cuda(env)


def check_throughput(env: Env, batch: int) -> dict[str, Any]:
    """images/s and peak memory of the local engine and of torchvision's reference loop, fp32 and amp."""
    import torch

    from maskrcnn_dist.data import build_train_loader, load_datasets

    p = env.profile
    cfg = train_config(base_flags(env, env.data, Path(env.work) / f"throughput-{batch}", batch_size=batch))
    train_set, _ = load_datasets(cfg)
    batch_data = next(iter(build_train_loader(train_set, batch, epoch=0, seed=0)))
    rows = {}
    for loop in ("local", "torchvision"):
        for amp in (False, True):
            variant = f"{loop}_{'amp' if amp else 'fp32'}"
            step = make_step(loop, env, cfg, amp, train_set.num_classes, batch_data)
            rows[variant] = time_steps(step, p.throughput_warmup, p.throughput_steps, batch, env.device)
            del step
            gc.collect()  # the engine's modules hold reference cycles: free them before the next peak
            if env.device == "cuda":
                torch.cuda.empty_cache()
    return rows


def make_step(loop: str, env: Env, cfg, amp: bool, num_classes: int, batch) -> Callable[[int], None]:
    """One training step on the same batch: the kit's local engine (its defaults, channels_last), or
    torchvision's references/detection train_one_epoch (default memory format; torch.autocast fp16 and
    a GradScaler where its --amp uses them)."""
    import torch

    from maskrcnn_dist.engines.base import to_device
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    if loop == "local":
        cfg.amp = amp
        engine = TorchEngine(cfg, num_classes, iters_per_epoch=100)
        images, targets = to_device(*batch, engine.device)  # on the device already, as for the reference loop
        return lambda step: engine.train_step(step, images, targets) and None
    device = torch.device(env.device)
    model = reference_model(cfg, num_classes).to(device)
    params = [q for q in model.parameters() if q.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.02, momentum=0.9, weight_decay=1e-4)
    scaler = torch.amp.GradScaler("cuda") if amp and device.type == "cuda" else None
    images, targets = to_device(*batch, device)
    model.train()

    def step(_: int) -> None:
        with torch.autocast(device.type, enabled=scaler is not None):
            loss_dict = model(images, targets)
            losses = sum(loss for loss in loss_dict.values())
        float(losses)  # the reference logs loss_value = losses.item() every step
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(losses).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            losses.backward()
            optimizer.step()

    return step


def reference_model(cfg, num_classes: int):
    """torchvision's own builder for R50-FPN (no weights: BatchNorm trains, all layers trainable, as the
    kit's "auto" without weights); the small CPU model has no torchvision builder, so the kit's with
    channels_last off."""
    from dataclasses import replace

    from torchvision.models.detection import maskrcnn_resnet50_fpn

    from maskrcnn_dist.modeling.model import build_model

    if cfg.model.name == "maskrcnn_resnet50_fpn":
        return maskrcnn_resnet50_fpn(
            weights=None,
            weights_backbone=None,
            num_classes=num_classes,
            min_size=cfg.model.min_size,
            max_size=cfg.model.max_size,
        )
    return build_model(replace(cfg.model, channels_last=False), num_classes)


def time_steps(step: Callable[[int], None], warmup: int, steps: int, batch: int, device: str) -> dict[str, Any]:
    import torch

    cuda = device == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for i in range(warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    row: dict[str, Any] = {"images_per_s": round(batch * steps / seconds, 2)}
    row["peak_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None
    return row


def check_injected(env: Env) -> dict[str, Any]:
    raise RuntimeError("injected failure (--inject-failure): the run must record it and go on")


def check_injected_hang(env: Env) -> dict[str, Any]:
    """A check that never ends, holding a process tree of its own (as ddp and the pipeline do): the
    runner must stop it at its budget, and the tree with it. The sleeper names the work folder."""
    hang = [sys.executable, "-c", "import sys, time; time.sleep(600)", env.work]
    run_logged(hang, Path(env.work) / "injected-hang.log", 600, threads=1)
    return {}


def throughput_needs(batch: int) -> Callable[[Env], str | None]:
    def needs(env: Env) -> str | None:
        if batch in env.profile.throughput_batches:
            return None
        runs = ", ".join(map(str, env.profile.throughput_batches))
        return f"batch {batch} runs on CUDA only (--device cpu: batch {runs})"

    return needs


CHECKS: tuple[Check, ...] = (
    Check("local_fp32", 120, lambda env: check_local(env, "fp32")),
    Check("local_amp_fp16", 90, lambda env: check_local(env, "fp16"), needs_cuda),
    Check("local_amp_bf16", 90, lambda env: check_local(env, "bf16"), needs_bf16),
    Check("eval_amp", 90, check_eval_amp),
    Check("checkpoint_devices", 90, check_checkpoint_devices, needs_cuda),
    Check("ddp", 180, check_ddp),
    Check("pipeline_cpu", 200, lambda env: check_pipeline(env, "pipeline_cpu", "cpu", 1)),
    Check(
        "pipeline_device_maps",
        150,
        lambda env: check_pipeline(env, "pipeline_device_maps", "device_maps", 1),
        needs_device_maps,
    ),
    Check(
        "pipeline_replicas", 150, lambda env: check_pipeline(env, "pipeline_replicas", "device_maps", 2), needs_two_gpus
    ),
    *(
        Check(f"throughput_b{b}", 120, lambda env, b=b: check_throughput(env, b), throughput_needs(b))
        for b in (2, 4, 8)
    ),
)
INJECTED_CHECKS = (Check(INJECTED, 30, check_injected), Check(INJECTED_HANG, 20, check_injected_hang))


def checks_for(env: Env) -> list[Check]:
    """The checks in run order; the injected failures (self-test) sit in the middle, before ddp."""
    checks = list(CHECKS)
    if env.inject_failure:
        at = [c.name for c in checks].index("ddp")
        checks[at:at] = INJECTED_CHECKS
    return checks


# -- the runner ------------------------------------------------------------------------------------


def run_child(name: str, plan: Path) -> int:
    """`--child NAME`: run one check in this process and write its figures, or its error line."""
    env = Env(**json.loads(plan.read_text()))
    out = Path(env.work) / "results" / f"{name}.json"
    check = {c.name: c for c in checks_for(env)}[name]
    try:
        import torch

        from maskrcnn_dist.modeling.perf import set_flush_denormal

        # What process.setup_process does for every run (--flush-denormal is on by default), before any
        # computation: without it the CPU steps of a fresh model are 3-6x slower.
        if env.device == "cpu":
            torch.set_num_threads(2)
        set_flush_denormal(True)
        figures = check.run(env)
    except Exception as exc:  # every failure becomes the one line the table shows
        traceback.print_exc()
        out.write_text(json.dumps({"error": one_line(exc)}))
        return 1
    out.write_text(json.dumps({"figures": figures}))
    return 0


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:400]


def run_check(check: Check, env: Env, plan: Path, budget_s: float) -> CheckResult:
    """One check in its own process tree, ended after `budget_s`; never raises."""
    reason = check.needs(env)
    if reason:
        return CheckResult(check.name, "skipped", 0.0, reason=reason)
    if budget_s < 5:
        return CheckResult(check.name, "skipped", 0.0, reason="out of time: the run's time budget is spent")
    results = Path(env.work) / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"{check.name}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", check.name, "--plan", str(plan)]
    started = time.monotonic()
    error = ""
    try:
        bench_engines.run_group(command, dict(os.environ), results / f"{check.name}.log", budget_s)
    except subprocess.TimeoutExpired:
        error = f"timed out after its budget of {budget_s:.0f} s"
    except RuntimeError as exc:  # non-zero exit: the child's own error line, else the log's last line
        error = str(exc).strip().splitlines()[-1]
    seconds = round(time.monotonic() - started, 1)
    report = json.loads(out.read_text()) if out.is_file() else {}
    if "error" in report:
        return CheckResult(check.name, "fail", seconds, reason=report["error"])
    if error or "figures" not in report:
        return CheckResult(check.name, "fail", seconds, reason=error or "no result written")
    return CheckResult(check.name, "pass", seconds, figures=report["figures"])


def run_all(env: Env, time_budget_s: float) -> list[CheckResult]:
    plan = Path(env.work) / "plan.json"
    plan.write_text(json.dumps(asdict(env)))
    deadline = time.monotonic() + time_budget_s
    results = []
    for check in checks_for(env):
        budget = min(check.budget_s, deadline - time.monotonic())
        result = run_check(check, env, plan, budget)
        print(f"{result.name}: {result.result} ({result.seconds:.1f} s) {result.reason}", file=sys.stderr, flush=True)
        results.append(result)
    return results


def make_data(env: Env) -> None:
    from maskrcnn_dist.data import generate_synthetic_coco

    p = env.profile
    size = (int(p.image_size * 0.75), p.image_size)
    generate_synthetic_coco(env.data / "train", num_images=p.train_images, image_size=size, seed=0)
    generate_synthetic_coco(env.eval_data / "val", num_images=p.val_images, image_size=size, seed=1)
    (env.eval_data / "train").symlink_to((env.data / "train").resolve())


def host_facts(device: str) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "cpu": bench_throughput.cpu_isa()["model"],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    if facts["gpus"]:
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["cuda"] = torch.version.cuda
    return facts


def summary(figures: dict[str, Any]) -> str:
    """Key figures in one cell."""
    parts = []
    for key, value in figures.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{v}" for v in value.values() if v is not None)
            parts.append(f"{key} {inner}")
        elif isinstance(value, list):
            parts.append(f"{key} {value[0]}..{value[-1]}" if value else key)
        else:
            parts.append(f"{key} {value}")
    return "; ".join(parts)


def render(results: list[CheckResult]) -> str:
    header = ("check", "result", "key figures", "seconds")
    body = [
        (r.name, r.result, r.reason if r.result != "pass" else summary(r.figures), f"{r.seconds:.1f}") for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *body]]
    throughput = [r for r in results if r.name.startswith("throughput_") and r.result == "pass"]
    if throughput:
        lines += ["", "throughput (images/s, peak GPU MiB)"]
        for r in throughput:
            cells = [
                f"{k} {v['images_per_s']}" + (f" ({v['peak_mem_mib']})" if v["peak_mem_mib"] else "")
                for k, v in r.figures.items()
            ]
            lines.append(f"  batch {r.name.removeprefix('throughput_b')}: " + ", ".join(cells))
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="auto: cuda when visible")
    parser.add_argument("--json-out", type=Path, default=DEFAULT_JSON, help=f"the JSON report (default {DEFAULT_JSON})")
    parser.add_argument("--time-budget", type=float, default=600.0, help="seconds for all checks together")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep data, runs and logs here")
    parser.add_argument(
        "--inject-failure", action="store_true", help="self-test: add a check that raises and one that hangs"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so run_group's cleanup ends the process tree it started: the
    # runner's check, and a check's own torchrun or launcher (its own session, out of the runner's reach).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.child:
        return run_child(args.child, args.plan)
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: --device cuda: no CUDA device is visible to this process", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = (args.work_dir or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        gpus = torch.cuda.device_count() if device == "cuda" else 0
        env = Env(device=device, gpus=gpus, work=str(work), inject_failure=args.inject_failure)
        make_data(env)
        results = run_all(env, args.time_budget)
    report = {
        "device": device,
        "host": host_facts(device),
        "profile": asdict(env.profile),
        "seconds": round(time.monotonic() - started, 1),
        "checks": [asdict(r) for r in results],
    }
    table = render(results)
    print(table)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu-check: {sum(r.result == 'fail' for r in results)} failed; report in {args.json_out}")
    return 1 if any(r.result == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
