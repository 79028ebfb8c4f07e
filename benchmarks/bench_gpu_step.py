"""Training-step throughput on one device: the kit's local engine under each setting against
torchvision's reference loop under the same settings, in interleaved rounds, and a profile of two steps.

    python benchmarks/bench_gpu_step.py [--device cuda|cpu] [--batches 2,8] [--variants ...] [--json-out F]

`make gpu-check` runs it first (checks/gpu/throughput.py). Every variant trains the same model from the
same seed on the same in-memory batch (on the device before timing, as the reference loop's batches are);
neither loop clips gradients unless the variant says so. A round runs `--steps` steps of every variant in
turn, the device synchronised around each variant's steps; a variant's figure is the median over rounds,
so a drift of the host hits every variant alike. The settings a variant can change:

- `amp`: None (fp32), "fp16" (autocast + GradScaler, the reference's --amp) or "bf16" (autocast, no scaler)
- `channels_last`: the kit's --channels-last (backbone, FPN, RPN head); torchvision's loop: the whole model
- `tf32`: TF32 for fp32 matrix products and convolutions (False: both off, strict fp32; None: torch's
  defaults, convolutions in TF32 and matrix products not)
- `cudnn_benchmark`: cuDNN's autotuner (the batch's shape is fixed here, so it tunes once)
- `fused_sgd`: torch.optim.SGD(fused=True) instead of the foreach implementation

Peak memory is the step's own (the most allocated during a step above what was allocated before it) plus
what the variant keeps between steps (weights, gradients, momenta). After the rounds, two steps of
`--profile` variants run under torch.profiler: the top CUDA kernels, the host reads (`aten::_local_scalar_dense`,
what `.item()`, `float()` and `.tolist()` of a device tensor run) and synchronisations, and the GPU's busy
fraction (kernel time over the steps' wall time).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script's module, not a package)

NUM_CLASSES = 4  # the synthetic set's 3 shapes and the background


@dataclass(frozen=True)
class Variant:
    name: str
    loop: str  # "kit" or "torchvision"
    amp: str | None = None
    channels_last: bool = False
    tf32: bool | None = None
    cudnn_benchmark: bool = False
    fused_sgd: bool = False
    clip: float | None = None


def kit(name: str, **settings: Any) -> Variant:
    """The kit's local engine; today's defaults are channels_last on, torch's TF32 defaults, foreach SGD."""
    return Variant(name, "kit", **{"channels_last": True, **settings})


def reference(name: str, **settings: Any) -> Variant:
    return Variant(name, "torchvision", **settings)


# In the order of what they tell: today's defaults against the reference, then one setting at a time.
VARIANTS: tuple[Variant, ...] = (
    reference("tv_fp32"),
    reference("tv_amp_fp16", amp="fp16"),
    kit("kit_fp32"),
    kit("kit_amp_fp16", amp="fp16"),
    kit("kit_fp32_nchw", channels_last=False),
    kit("kit_fp32_nchw_tf32", channels_last=False, tf32=True),
    reference("tv_fp32_tf32", tf32=True),
    kit("kit_amp_bf16", amp="bf16"),
    kit("kit_amp_bf16_nchw", amp="bf16", channels_last=False),
    reference("tv_amp_bf16", amp="bf16"),
    kit("kit_amp_bf16_cudnn", amp="bf16", cudnn_benchmark=True),
    kit("kit_amp_bf16_fused", amp="bf16", fused_sgd=True),
    kit("kit_amp_bf16_all", amp="bf16", tf32=True, cudnn_benchmark=True, fused_sgd=True),
    reference("tv_amp_bf16_all", amp="bf16", tf32=True, cudnn_benchmark=True, fused_sgd=True),
    kit("kit_amp_fp16_clip", amp="fp16", clip=10.0),
    reference("tv_amp_fp16_clip", amp="fp16", clip=10.0),
)
CPU_VARIANTS = ("tv_fp32", "kit_fp32", "kit_amp_bf16", "tv_amp_bf16")
PROFILED = ("kit_amp_fp16", "tv_amp_fp16", "kit_amp_bf16_all")


@dataclass(frozen=True)
class Shape:
    """The model and the batch every variant of a run trains on."""

    model: str
    min_size: int
    max_size: int
    image_hw: tuple[int, int]


SHAPES = {
    "cuda": Shape("maskrcnn_resnet50_fpn", 800, 1333, (600, 800)),
    "cpu": Shape("maskrcnn_resnet18_fpn", 64, 64, (48, 64)),
}


@dataclass
class Measured:
    variant: str
    batch: int
    round_images_per_s: list[float] = field(default_factory=list)
    images_per_s: float = 0.0
    step_peak_mib: float | None = None
    resident_mib: float | None = None


# -- one variant's step ---------------------------------------------------------------------------


@contextlib.contextmanager
def settings(variant: Variant, device: torch.device) -> Iterator[None]:
    """The process-wide switches of `variant` for the body, restored afterwards."""
    if device.type != "cuda":
        yield
        return
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    if variant.tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = variant.tf32
    torch.backends.cudnn.benchmark = variant.cudnn_benchmark
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved


def synthetic_batch(
    batch: int, shape: Shape, seed: int = 0
) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    """`batch` images of shape.image_hw with 3 boxes and masks each, from the synthetic set's generator
    rules (shapes on noise) but made in memory: the benchmark times the step, not the loader."""
    g = torch.Generator().manual_seed(seed)
    h, w = shape.image_hw
    images, targets = [], []
    for _ in range(batch):
        images.append(torch.rand(3, h, w, generator=g))
        corners = torch.rand(3, 2, generator=g) * torch.tensor([w * 0.6, h * 0.6])
        sizes = 8 + torch.rand(3, 2, generator=g) * torch.tensor([w * 0.35, h * 0.35])
        boxes = torch.cat([corners, corners + sizes], dim=1)
        masks = torch.zeros(3, h, w, dtype=torch.uint8)
        for i, (x0, y0, x1, y1) in enumerate(boxes.round().int().tolist()):
            masks[i, y0:y1, x0:x1] = 1
        labels = torch.randint(1, NUM_CLASSES, (3,), generator=g)
        targets.append({"boxes": boxes, "labels": labels, "masks": masks})
    return images, targets


def kit_config(variant: Variant, shape: Shape, device: torch.device):
    from maskrcnn_dist.config import TrainConfig, apply_overrides

    values = {
        "model": shape.model,
        "min-size": shape.min_size,
        "max-size": shape.max_size,
        "device": device.type,
        "lr": 0.005,
        "warmup-iters": 10,
        "channels-last": variant.channels_last,
        "amp": variant.amp is not None,
        "amp-dtype": {"fp16": "float16", "bf16": "bfloat16", None: "auto"}[variant.amp],
    }
    if variant.clip:
        values["clip-grad-norm"] = variant.clip
    cfg = apply_overrides(TrainConfig(), values, "bench_gpu_step")
    cfg.validate()
    return cfg


def fused(optimizer: torch.optim.SGD) -> torch.optim.SGD:
    """The same parameter groups and settings in torch's fused SGD (one kernel per step on CUDA)."""
    groups = [{**g, "foreach": False, "fused": True} for g in optimizer.param_groups]
    return torch.optim.SGD(groups, lr=optimizer.defaults["lr"], fused=True)


def kit_step(variant: Variant, shape: Shape, device: torch.device, batch) -> tuple[Callable[[int], None], Any]:
    from maskrcnn_dist.engines.base import to_device
    from maskrcnn_dist.engines.torch_engine import TorchEngine
    from maskrcnn_dist.modeling.optim import build_scheduler

    cfg = kit_config(variant, shape, device)
    engine = TorchEngine(cfg, NUM_CLASSES, iters_per_epoch=1000)
    if variant.fused_sgd:
        engine.optimizer = fused(engine.optimizer)
        engine.scheduler = build_scheduler(engine.optimizer, cfg.optim, 1000, 1000)
    images, targets = to_device(*batch, device)
    return (lambda step: engine.train_step(step, images, targets) and None), engine


def reference_step(variant: Variant, shape: Shape, device: torch.device, batch) -> tuple[Callable[[int], None], Any]:
    """torchvision's references/detection train_one_epoch, one iteration: autocast + GradScaler under
    its --amp (bf16 here without a scaler, as autocast's bf16 needs none), `losses.item()` every step."""
    from maskrcnn_dist.engines.base import to_device

    torch.manual_seed(0)
    model = reference_model(shape).to(device)
    if variant.channels_last:
        model = model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.005, momentum=0.9, weight_decay=1e-4, fused=variant.fused_sgd or None)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(variant.amp or "")
    scaler = torch.amp.GradScaler(device.type) if variant.amp == "fp16" else None
    images, targets = to_device(*batch, device)
    model.train()

    def step(_: int) -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss_dict = model(images, targets)
            losses = sum(loss for loss in loss_dict.values())
        losses.item()  # the reference logs loss_value every step
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(losses).backward()
            if variant.clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, variant.clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            losses.backward()
            if variant.clip:
                torch.nn.utils.clip_grad_norm_(params, variant.clip)
            optimizer.step()

    return step, (model, optimizer)


def reference_model(shape: Shape) -> torch.nn.Module:
    """torchvision's own builder for R50-FPN (no weights: every layer trains, BatchNorm included, as the
    kit's default without weights); the small CPU model has no torchvision builder, so the kit's with
    channels_last off."""
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    from maskrcnn_dist.config import ModelConfig
    from maskrcnn_dist.modeling.model import build_model

    if shape.model == "maskrcnn_resnet50_fpn":
        return maskrcnn_resnet50_fpn(
            weights=None,
            weights_backbone=None,
            num_classes=NUM_CLASSES,
            min_size=shape.min_size,
            max_size=shape.max_size,
        )
    cfg = ModelConfig(name=shape.model, min_size=shape.min_size, max_size=shape.max_size, channels_last=False)
    return build_model(cfg, NUM_CLASSES)


def make_step(variant: Variant, shape: Shape, device: torch.device, batch) -> tuple[Callable[[int], None], Any]:
    with settings(variant, device):
        build = kit_step if variant.loop == "kit" else reference_step
        return build(variant, shape, device, batch)


# -- timing ---------------------------------------------------------------------------------------


def sync_for(device: torch.device) -> Callable[[], None] | None:
    return torch.cuda.synchronize if device.type == "cuda" else None


def resident_mib(device: torch.device) -> float | None:
    return torch.cuda.memory_allocated() / 2**20 if device.type == "cuda" else None


def warm_up(variant: Variant, step: Callable[[int], None], device: torch.device, steps: int, row: Measured) -> None:
    """`steps` untimed steps; the last one's peak above what was allocated before it is the step's memory."""
    with settings(variant, device):
        for i in range(steps):
            if device.type == "cuda" and i == steps - 1:
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            step(i)
        if device.type == "cuda":
            torch.cuda.synchronize()
            row.step_peak_mib = round((torch.cuda.max_memory_allocated() - before) / 2**20)


def measure_batch(
    variants: list[Variant], shape: Shape, device: torch.device, batch: int, args: argparse.Namespace
) -> tuple[list[Measured], dict[str, Any]]:
    data = synthetic_batch(batch, shape)
    steps: dict[str, tuple[Callable[[int], None], Any]] = {}
    rows = {v.name: Measured(v.name, batch) for v in variants}
    for v in variants:
        before = resident_mib(device)
        steps[v.name] = make_step(v, shape, device, data)
        warm_up(v, steps[v.name][0], device, args.warmup, rows[v.name])
        if before is not None:
            rows[v.name].resident_mib = round(resident_mib(device) - before)
    sync = sync_for(device)
    for r in range(args.rounds):
        first = args.warmup + r * args.steps  # step indices go on: the LR warm-up and seeding advance
        for v in variants:
            with settings(v, device):
                seconds = common.seconds_per_call(steps_from(steps[v.name][0], first, args.steps), 1, sync=sync)
            rows[v.name].round_images_per_s.append(round(batch * args.steps / seconds, 2))
    for row in rows.values():
        row.images_per_s = round(statistics.median(row.round_images_per_s), 2)
    profiles = {}
    for name in args.profile if device.type == "cuda" else ():
        if name in steps:
            try:
                profiles[name] = profile_steps(next(v for v in variants if v.name == name), steps[name][0], device)
            except Exception as exc:  # the profiler's API moves between torch versions: keep the timings
                profiles[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    steps.clear()
    gc.collect()  # the engines' modules hold reference cycles: free them before the next batch size
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return list(rows.values()), profiles


def steps_from(step: Callable[[int], None], first: int, count: int) -> Callable[[], None]:
    def run() -> None:
        for i in range(first, first + count):
            step(i)

    return run


# -- profile --------------------------------------------------------------------------------------

HOST_READS = ("aten::_local_scalar_dense",)
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def profile_steps(
    variant: Variant, step: Callable[[int], None], device: torch.device, steps: int = 2
) -> dict[str, Any]:
    """Two steps under torch.profiler: top kernels, host reads and syncs per step, GPU busy fraction."""
    from torch.profiler import ProfilerActivity, profile

    with settings(variant, device):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            for i in range(steps):
                step(10_000 + i)
            torch.cuda.synchronize()
            wall = time.perf_counter() - started
    averages = prof.key_averages()
    kernels = sorted(
        (e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0),
        key=lambda e: e.self_device_time_total,
        reverse=True,
    )
    busy_us = sum(e.self_device_time_total for e in kernels)
    counts = {e.key: e.count for e in averages}
    return {
        "wall_ms_per_step": round(wall * 1e3 / steps, 1),
        "gpu_busy_fraction": round(busy_us / 1e6 / wall, 3),
        "host_reads_per_step": sum(counts.get(k, 0) for k in HOST_READS) / steps,
        "syncs_per_step": sum(counts.get(k, 0) for k in SYNCS) / steps,
        "kernels_per_step": sum(e.count for e in kernels) / steps,
        "top_kernels": [
            {
                "name": e.key[:90],
                "ms_per_step": round(e.self_device_time_total / 1e3 / steps, 2),
                "calls": e.count // steps,
            }
            for e in kernels[:10]
        ],
    }


# -- report ---------------------------------------------------------------------------------------


def render(rows: list[Measured], profiles: dict[str, dict[str, Any]], host: dict[str, Any]) -> str:
    by_batch: dict[int, dict[str, Measured]] = {}
    for r in rows:
        by_batch.setdefault(r.batch, {})[r.variant] = r
    batches = sorted(by_batch)
    names = list(dict.fromkeys(r.variant for r in rows))
    header = ["variant", *(f"b{b} img/s" for b in batches), *(f"b{b} MiB" for b in batches), "vs tv (same precision)"]
    body = []
    for name in names:
        cells = [by_batch[b][name].images_per_s if name in by_batch[b] else "-" for b in batches]
        mem = [_mem(by_batch[b].get(name)) for b in batches]
        body.append([name, *cells, *mem, _ratios(name, by_batch, batches)])
    lines = [f"{host.get('gpu') or host['cpu']['model']}; torch {host['torch']}", common.render_markdown(header, body)]
    for name, p in profiles.items():
        if "error" in p:
            lines.append(f"\nprofile {name}: {p['error']}")
            continue
        lines.append(
            f"\nprofile {name}: {p['wall_ms_per_step']} ms/step, GPU busy {p['gpu_busy_fraction']:.0%}, "
            f"host reads {p['host_reads_per_step']:g}/step, syncs {p['syncs_per_step']:g}/step, "
            f"{p['kernels_per_step']:g} kernels/step; top: "
            + "; ".join(f"{k['name'][:48]} {k['ms_per_step']} ms" for k in p["top_kernels"][:4])
        )
    return "\n".join(lines)


def _mem(row: Measured | None) -> str:
    if row is None or row.step_peak_mib is None:
        return "-"
    return f"{row.step_peak_mib + (row.resident_mib or 0):.0f}"


def _ratios(name: str, by_batch: dict[int, dict[str, Measured]], batches: list[int]) -> str:
    """The kit variant over torchvision's loop at the same precision and settings where one exists,
    else at the same precision with torch's defaults."""
    if not name.startswith("kit_"):
        return ""
    base = "tv_" + name.removeprefix("kit_")
    precision = "tv_amp_fp16" if "fp16" in name else "tv_amp_bf16" if "bf16" in name else "tv_fp32"
    cells = []
    for b in batches:
        rows = by_batch[b]
        ref = rows.get(base) or rows.get(precision)
        if ref and name in rows and ref.images_per_s:
            cells.append(f"b{b} {rows[name].images_per_s / ref.images_per_s:.2f}x {ref.variant}")
    return ", ".join(cells)


def host_facts(device: torch.device) -> dict[str, Any]:
    facts: dict[str, Any] = {"torch": torch.__version__, "cpu": common.cpu_isa()}
    if device.type == "cuda":
        facts |= {
            "gpu": torch.cuda.get_device_name(0),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "bf16": torch.cuda.is_bf16_supported(),
        }
    return facts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--batches", default=None, help="comma separated batch sizes (default: 2,8 on CUDA, 2 on CPU)")
    parser.add_argument(
        "--variants", default=None, help="comma separated subset of: " + ",".join(v.name for v in VARIANTS)
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="steps per variant per round (default 4 CUDA, 1 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per variant (default 2 CUDA, 1 CPU)")
    parser.add_argument("--profile", default=",".join(PROFILED), help="variants profiled for two steps (CUDA)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds: batch sizes left are skipped")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to this process")
    cuda = args.device == "cuda"
    args.batches = [int(b) for b in (args.batches or ("2,8" if cuda else "2")).split(",") if b]
    known = {v.name: v for v in VARIANTS}
    wanted = (args.variants or ",".join(known if cuda else CPU_VARIANTS)).split(",")
    if unknown := [w for w in wanted if w not in known]:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    args.variants = [known[w] for w in wanted if w]
    args.steps = args.steps or (4 if cuda else 1)
    args.warmup = args.warmup or (2 if cuda else 1)
    args.profile = [p for p in args.profile.split(",") if p]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    shape = SHAPES[device.type]
    if device.type == "cpu":
        torch.set_flush_denormal(True)  # as the trainer's process setup does: denormals slow a CPU step 3-6x
        args.variants = [replace(v, tf32=None, cudnn_benchmark=False, fused_sgd=False) for v in args.variants]
    deadline = time.monotonic() + (args.time_budget or float("inf"))
    rows: list[Measured] = []
    profiles: dict[str, Any] = {}
    skipped = []
    for batch in args.batches:
        if time.monotonic() > deadline:
            skipped.append(batch)
            continue
        measured, profiled = measure_batch(args.variants, shape, device, batch, args)
        rows += measured
        profiles |= {f"{name}_b{batch}": p for name, p in profiled.items()}
        print(
            f"batch {batch}: " + ", ".join(f"{r.variant} {r.images_per_s}" for r in measured),
            file=sys.stderr,
            flush=True,
        )
    host = host_facts(device)
    report = {
        "host": host,
        "shape": asdict(shape),
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "variants": [asdict(v) for v in args.variants],
        "results": [asdict(r) for r in rows],
        "profiles": profiles,
        "skipped_batches": skipped,
    }
    common.emit(render(rows, profiles, host), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
