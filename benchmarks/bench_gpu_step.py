"""Training-step throughput and host waits on one device: the kit's local engine, batched heads and
torchvision's, against torchvision's reference loop, in interleaved rounds within a time budget.

    python benchmarks/bench_gpu_step.py [--device cuda|cpu] [--batches 2,8] [--variants ...]
        [--time-budget S] [--json-out F]

`make gpu-check` runs it first (checks/gpu/throughput.py). Every variant trains the same model from the
same seed on the same in-memory batch (on the device before timing, as the reference loop's batches are);
no loop clips gradients. A round runs `--steps` steps of every variant in turn, the device synchronised
around each variant's steps; a variant's figure is the median over rounds, so a drift of the host hits
every variant alike. What earlier runs settled is no longer a variant (docs/gpu-check.md: cudnn.benchmark
off, TF32 for matrix products changes nothing, fused SGD +11%, now the kit's default). A variant sets:

- `loop`: "kit" (the local engine, today's defaults: channels_last, fused SGD) or "torchvision" (its
  references/detection train_one_epoch: autocast + GradScaler for fp16, `losses.item()` every step)
- `amp`: "bf16" (autocast, no scaler) or "fp16" (autocast + GradScaler)
- `heads`: the kit's --heads: "batched" (rows compact: one read a step) or "torchvision"
- `rows`: the batched heads' rows, "compact" or "padded" (fixed-size: no read at all)
- `graph`: fixed canvases per orientation and the backbone + FPN replayed as CUDA graphs
  (modeling/canvas.py; CUDA only, never a default: this is where it is measured, when named in
  `--variants`, as gpu-check's `throughput_graph` names it)

Waits, per variant, on one untimed step after the warm-up: the host reads and data-dependent operators
(modeling/waits.py, any device) and, on CUDA, the synchronisations torch.cuda.set_sync_debug_mode reports.
Peak memory is the step's own plus what the variant keeps between steps. After the rounds, two steps of
the `--profile` variants run under torch.profiler (CUDA): the top kernels, the host reads
(`aten::_local_scalar_dense`) and synchronisations per step, and the GPU's busy fraction (kernel time
over the steps' wall time). With `--time-budget` every piece of work starts only if the time measured
so far says it ends in the budget (a batch size gets its share); what is left out is listed.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
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
    amp: str = "bf16"
    heads: str = "batched"
    rows: str = "compact"
    graph: bool = False


# In the order of what they tell: the kit's defaults against the reference at each precision, then the
# heads' forms, then the graphed backbone.
VARIANTS: tuple[Variant, ...] = (
    Variant("tv_amp_bf16", "torchvision"),
    Variant("kit_amp_bf16", "kit"),
    Variant("tv_amp_fp16", "torchvision", amp="fp16"),
    Variant("kit_amp_fp16", "kit", amp="fp16"),
    Variant("kit_amp_bf16_tvheads", "kit", heads="torchvision"),
    Variant("kit_amp_bf16_padded", "kit", rows="padded"),
    Variant("kit_amp_bf16_graph", "kit", rows="padded", graph=True),
)
FIXED_SHARE = 4  # a batch size's share of the budget weighs (its images + this)
CPU_VARIANTS = ("tv_amp_bf16", "kit_amp_bf16", "kit_amp_bf16_tvheads", "kit_amp_bf16_padded")
PROFILED = ("tv_amp_bf16", "kit_amp_bf16", "kit_amp_bf16_padded")


@dataclass(frozen=True)
class Shape:
    """The model and the batch every variant of a run trains on."""

    model: str
    min_size: int
    max_size: int
    image_hw: tuple[int, int]
    # --box-batch-size-per-image of every variant, torchvision's loop included; None: the model's own.
    rois_per_image: int | None = None


# The CPU shape is the gpu-check's self-test: 32 RoIs an image, because a CPU without bf16 or fp16 units runs
# the heads' half-precision convolutions on im2col's slow path (an amp step 2x faster than at 128).
SHAPES = {
    "cuda": Shape("maskrcnn_resnet50_fpn", 800, 1333, (600, 800)),
    "cpu": Shape("maskrcnn_resnet18_fpn", 64, 64, (48, 64), rois_per_image=32),
}


@dataclass
class Measured:
    variant: str
    batch: int
    round_images_per_s: list[float] = field(default_factory=list)
    images_per_s: float = 0.0
    step_peak_mib: float | None = None
    resident_mib: float | None = None
    waits: int | None = None  # modeling/waits.py's count of one step
    waits_by_name: dict[str, int] = field(default_factory=dict)
    cuda_syncs: int | None = None  # what torch.cuda.set_sync_debug_mode reports in one step
    error: str | None = None  # the variant failed to build or to step: the others still run


class Budget:
    """A deadline, and what the work so far says the next piece of work will take."""

    def __init__(self, seconds: float | None) -> None:
        self.deadline = time.monotonic() + (seconds if seconds else float("inf"))
        self.left_out: list[str] = []

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def allows(self, seconds: float, what: str, until: float | None = None) -> bool:
        """Whether work of `seconds` ends before the deadline (or before `until`); else it is left out."""
        if time.monotonic() + seconds <= min(self.deadline, until or float("inf")):
            return True
        self.left_out.append(what)
        return False


# -- one variant's step ---------------------------------------------------------------------------


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
        "amp": True,
        "amp-dtype": {"fp16": "float16", "bf16": "bfloat16"}[variant.amp],
        "heads": variant.heads,
        "box-batch-size-per-image": shape.rois_per_image,
    }
    cfg = apply_overrides(TrainConfig(), values, "bench_gpu_step")
    cfg.validate()
    return cfg


def kit_step(variant: Variant, shape: Shape, device: torch.device, batch) -> tuple[Callable[[int], None], Any]:
    from maskrcnn_dist.engines.base import to_device
    from maskrcnn_dist.engines.torch_engine import TorchEngine

    cfg = kit_config(variant, shape, device)
    engine = TorchEngine(cfg, NUM_CLASSES, iters_per_epoch=1000)
    if variant.heads == "batched":
        engine.model.roi_heads.rows = variant.rows
    if variant.graph:
        from maskrcnn_dist.modeling.canvas import capture_backbone, default_canvases, use_fixed_canvases
        from maskrcnn_dist.modeling.perf import amp_dtype

        use_fixed_canvases(engine.model, default_canvases(shape.min_size, shape.max_size))
        capture_backbone(engine.model, len(batch[0]), amp_dtype(device, cfg.amp_dtype))
    images, targets = to_device(*batch, device)
    return (lambda step: engine.train_step(step, images, targets) and None), engine


def reference_step(variant: Variant, shape: Shape, device: torch.device, batch) -> tuple[Callable[[int], None], Any]:
    """torchvision's references/detection train_one_epoch, one iteration: autocast + GradScaler under
    its --amp (bf16 here without a scaler, as autocast's bf16 needs none), `losses.item()` every step."""
    from maskrcnn_dist.engines.base import to_device

    torch.manual_seed(0)
    model = reference_model(shape).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.005, momentum=0.9, weight_decay=1e-4)
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[variant.amp]
    scaler = torch.amp.GradScaler(device.type) if variant.amp == "fp16" else None
    images, targets = to_device(*batch, device)
    model.train()

    def step(_: int) -> None:
        with torch.autocast(device.type, dtype=dtype):
            loss_dict = model(images, targets)
            losses = sum(loss for loss in loss_dict.values())
        losses.item()  # the reference logs loss_value every step
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(losses).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            losses.backward()
            optimizer.step()

    return step, (model, optimizer)


def reference_model(shape: Shape) -> torch.nn.Module:
    """torchvision's own builder for R50-FPN (no weights: every layer trains, BatchNorm included, as the
    kit's default without weights); the small CPU model has no torchvision builder, so the kit's with
    its speed-ups and batched heads off."""
    from torchvision.models.detection import maskrcnn_resnet50_fpn

    from maskrcnn_dist.config import ModelConfig
    from maskrcnn_dist.modeling.model import build_model

    rois = {} if shape.rois_per_image is None else {"box_batch_size_per_image": shape.rois_per_image}
    if shape.model == "maskrcnn_resnet50_fpn":
        return maskrcnn_resnet50_fpn(
            weights=None,
            weights_backbone=None,
            num_classes=NUM_CLASSES,
            min_size=shape.min_size,
            max_size=shape.max_size,
            **rois,
        )
    cfg = ModelConfig(name=shape.model, min_size=shape.min_size, max_size=shape.max_size, channels_last=False, **rois)
    return build_model(cfg, NUM_CLASSES, exportable=True)


def make_step(variant: Variant, shape: Shape, device: torch.device, batch) -> tuple[Callable[[int], None], Any]:
    build = kit_step if variant.loop == "kit" else reference_step
    return build(variant, shape, device, batch)


# -- timing ---------------------------------------------------------------------------------------


def sync_for(device: torch.device) -> Callable[[], None] | None:
    return torch.cuda.synchronize if device.type == "cuda" else None


def resident_mib(device: torch.device) -> float | None:
    return torch.cuda.memory_allocated() / 2**20 if device.type == "cuda" else None


def warm_up(step: Callable[[int], None], device: torch.device, steps: int, row: Measured) -> None:
    """`steps` untimed steps; the last one's peak above what was allocated before it is the step's memory."""
    for i in range(steps):
        if device.type == "cuda" and i == steps - 1:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
        row.step_peak_mib = round((torch.cuda.max_memory_allocated() - before) / 2**20)


def count_waits(step: Callable[[int], None], index: int, device: torch.device, row: Measured) -> None:
    """One step's host waits (modeling/waits.py), then, on CUDA, one step's synchronisations as
    torch.cuda.set_sync_debug_mode reports them (a warning each)."""
    from maskrcnn_dist.modeling.waits import HostWaits

    with HostWaits() as waits:
        step(index)
    row.waits, row.waits_by_name = waits.total, dict(waits.counts)
    if device.type != "cuda":
        return
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(index + 1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    row.cuda_syncs = sum("synchroniz" in str(w.message) for w in caught)


def measure_batch(
    variants: list[Variant], shape: Shape, device: torch.device, batch: int, args: argparse.Namespace, budget: Budget
) -> tuple[list[Measured], dict[str, Any]]:
    """Every variant that the budget allows, until `args.share_until` (this batch size's share)."""
    data = synthetic_batch(batch, shape)
    steps: dict[str, Callable[[int], None]] = {}
    rows: dict[str, Measured] = {}
    sync = sync_for(device)
    set_up_s = 0.0  # the longest a variant took to build, warm up and count so far
    step_s = 0.0  # the longest step so far
    for v in variants:
        if not budget.allows(set_up_s, f"b{batch} {v.name}", args.share_until):
            continue
        started = time.monotonic()
        row = rows[v.name] = Measured(v.name, batch)
        before = resident_mib(device)
        try:
            step = make_step(v, shape, device, data)[0]
            warm_up(step, device, args.warmup, row)
            if before is not None:
                row.resident_mib = round(resident_mib(device) - before)
            count_waits(step, args.warmup, device, row)
        except Exception as exc:  # e.g. a CUDA graph this torch cannot capture: keep the other variants
            row.error = f"{type(exc).__name__}: {exc}"[:300]
            print(f"batch {batch} {v.name}: {row.error}", file=sys.stderr, flush=True)
            continue
        steps[v.name] = step
        set_up_s = max(set_up_s, time.monotonic() - started)
        step_s = max(step_s, (time.monotonic() - started) / (args.warmup + 2))
    for r in range(args.rounds):
        if not budget.allows(step_s * args.steps * len(steps), f"b{batch} round {r + 1}", args.share_until):
            break
        first = args.warmup + 2 + r * args.steps  # step indices go on: the LR warm-up and seeding advance
        for name, step in steps.items():
            started = time.monotonic()
            seconds = common.seconds_per_call(steps_from(step, first, args.steps), 1, sync=sync)
            rows[name].round_images_per_s.append(round(batch * args.steps / seconds, 2))
            step_s = max(step_s, (time.monotonic() - started) / args.steps)
    for row in rows.values():
        if row.round_images_per_s:
            row.images_per_s = round(statistics.median(row.round_images_per_s), 2)
    profiles = {}
    for name in args.profile if device.type == "cuda" else ():
        if name in steps and budget.allows(step_s * 4, f"b{batch} profile {name}", args.share_until):
            try:
                profiles[name] = profile_steps(steps[name], device)
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


def profile_steps(step: Callable[[int], None], device: torch.device, steps: int = 2) -> dict[str, Any]:
    """Two steps under torch.profiler: top kernels, host reads and syncs per step, GPU busy fraction."""
    from torch.profiler import ProfilerActivity, profile

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
    header = [
        "variant",
        *(f"b{b} img/s" for b in batches),
        *(f"b{b} MiB" for b in batches),
        *(f"b{b} waits / syncs" for b in batches),
        "vs tv (same precision)",
    ]
    body = []
    for name in names:
        cells = [by_batch[b][name].images_per_s if name in by_batch[b] else "-" for b in batches]
        cells = [c or "-" for c in cells]  # 0.0: set up and counted, but no round in the budget
        mem = [_mem(by_batch[b].get(name)) for b in batches]
        waits = [_waits(by_batch[b].get(name)) for b in batches]
        body.append([name, *cells, *mem, *waits, _ratios(name, by_batch, batches)])
    lines = [f"{host.get('gpu') or host['cpu']['model']}; torch {host['torch']}", common.render_markdown(header, body)]
    lines += [f"\n{r.variant} b{r.batch}: {r.error}" for r in rows if r.error]
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


def _waits(row: Measured | None) -> str:
    if row is None or row.waits is None:
        return "-"
    return f"{row.waits} / {'-' if row.cuda_syncs is None else row.cuda_syncs}"


def _ratios(name: str, by_batch: dict[int, dict[str, Measured]], batches: list[int]) -> str:
    """The kit variant over torchvision's loop at the same precision."""
    if not name.startswith("kit_"):
        return ""
    reference = "tv_amp_fp16" if "fp16" in name else "tv_amp_bf16"
    cells = []
    for b in batches:
        rows = by_batch[b]
        ref = rows.get(reference)
        if ref and name in rows and ref.images_per_s and rows[name].images_per_s:
            cells.append(f"b{b} {rows[name].images_per_s / ref.images_per_s:.2f}x")
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
    parser.add_argument("--steps", type=int, default=None, help="steps per variant per round (default 3 CUDA, 1 CPU)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps per variant (default 2 CUDA, 1 CPU)")
    parser.add_argument("--profile", default=",".join(PROFILED), help="variants profiled for two steps (CUDA)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run (see above)")
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to this process")
    cuda = args.device == "cuda"
    args.batches = [int(b) for b in (args.batches or ("2,8" if cuda else "2")).split(",") if b]
    known = {v.name: v for v in VARIANTS}
    default = [v.name for v in VARIANTS if not v.graph] if cuda else CPU_VARIANTS  # graphs: their own check
    wanted = (args.variants or ",".join(default)).split(",")
    if unknown := [w for w in wanted if w not in known]:
        parser.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    if not cuda and (graphed := [w for w in wanted if known[w].graph]):
        parser.error(f"--variants: {', '.join(graphed)} capture CUDA graphs: --device cuda only")
    args.variants = [known[w] for w in wanted if w]
    args.steps = args.steps or (3 if cuda else 1)
    args.warmup = args.warmup or (2 if cuda else 1)
    args.profile = [p for p in args.profile.split(",") if p]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    shape = SHAPES[device.type]
    if device.type == "cpu":
        torch.set_flush_denormal(True)  # as the trainer's process setup does: denormals slow a CPU step 3-6x
    budget = Budget(args.time_budget)
    rows: list[Measured] = []
    profiles: dict[str, Any] = {}
    for i, batch in enumerate(args.batches):
        # Each batch size may use a share of what is left that grows with its images (a larger batch's
        # steps take longer) over a fixed part (building the variants, the first steps).
        weights = [b + FIXED_SHARE for b in args.batches[i:]]
        args.share_until = time.monotonic() + budget.left() * weights[0] / sum(weights)
        measured, profiled = measure_batch(args.variants, shape, device, batch, args, budget)
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
        "left_out": budget.left_out,
    }
    common.emit(render(rows, profiles, host), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
