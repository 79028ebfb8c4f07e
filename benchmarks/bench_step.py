"""Seconds per training step of the kit against itself, with and without each speed lever, in one run.

    .venv/bin/python benchmarks/bench_step.py [--model maskrcnn_resnet50_fpn] [--min-size 800]
        [--batch-size 2] [--steps 8] [--rounds 2] [--backbone-norm frozen] [--variants ...] [--json-out FILE]

Every variant is the local engine (`TorchEngine.train_step`, the kit's own step) with some flags set, built
from the same seed and fed the same 16 images (8 sizes, both orientations: the padded batch shape changes
from step to step, as in training). A round runs `--steps` steps, each step of every variant in turn
(the rounds alternate the variants' order), so drift of a shared machine falls on all of them alike. The figure is the
median seconds per step of steps 3 to `--steps` of each round, and the speed-up is over `amp` (today's
--amp) measured in the same round. Compiling variants first run every batch shape once, untimed: that
compile time is reported apart (a run pays it once).

Variants (`VARIANTS`):
- `fp32`: no --amp, no lever; `amp`: --amp with every lever off (the kit before issue 37);
- `amp+fold`: frozen BatchNorm folded into its convolution (needs --backbone-norm frozen to fold anything);
- `amp+compile`: the backbone + FPN compiled; `amp+fold+compile`: both;
- `torchvision`: fp32, torchvision's own modules and memory layout (`build_model(exportable=True)`), SGD
  with autograd, no kit speed-up: the reference's step.

The third lever of issue 37, bf16 weight copies kept between steps, is bounded rather than built: the
benchmark times the casts autocast makes per step (every floating-point weight once, to bf16) and the
fused copy (`torch._foreach_copy_`) that kept copies would need after each optimizer step instead; the
difference is the most that lever could save. Graph breaks of the compiled backbone are dynamo's own
count over the warm-up (what the kit logs as `compile/graph_breaks`).

Where the step goes (`--no-breakdown` skips it): after the rounds, one more step of every variant on the
same batch runs under torch.profiler, which splits it into the matrix work (oneDNN's convolutions forward
and backward, `CONVOLUTION_OPS`; the dense GEMMs of the linear layers forward and backward, `GEMM_EVENTS`,
with their operands' casts) and the rest. Beside it, this host's bf16 units are timed on the step's
dominant convolution (256 -> 256 channels, 3x3, on the finest FPN level of the first batch) and on a GEMM
the size of the box head's first layer: a convolution running at the GEMM's rate is at the units' peak,
and no lever outside it makes it faster. The ceiling printed is what `amp` would gain if a lever removed
every operation but the matrix work from the fastest variant's step: no fusion of elementwise work, the
issue's levers included, can give more on this host.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from maskrcnn_dist.config import TrainConfig, build_config

try:
    from maskrcnn_dist.engines.base import read_losses
except ImportError:  # a kit before issue 46 returned plain floats (before_after.py runs both)
    read_losses = dict
from maskrcnn_dist.engines.torch_engine import TorchEngine
from maskrcnn_dist.modeling.compiled import compiler_problem, graph_breaks
from maskrcnn_dist.modeling.model import build_model
from maskrcnn_dist.modeling.perf import set_flush_denormal

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402  (a sibling script's module, not a package)

# Flags each variant sets on top of the common ones (the levers' flags: --fold-frozen-bn, --compile).
VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {"amp": False, "fold-frozen-bn": False, "compile": False},
    "amp": {"amp": True, "fold-frozen-bn": False, "compile": False},
    "amp+fold": {"amp": True, "fold-frozen-bn": True, "compile": False},
    "amp+compile": {"amp": True, "fold-frozen-bn": False, "compile": True},
    "amp+fold+compile": {"amp": True, "fold-frozen-bn": True, "compile": True},
    "torchvision": {},
}
# The profiler's names for oneDNN's convolution work (forward; backward for data, weights and bias).
CONVOLUTION_OPS = ("aten::mkldnn_convolution", "aten::convolution_backward")
# ... and for the linear layers' GEMMs: the forward (aten::linear, under autocast with its operands' casts)
# and the backward node (its two GEMMs). The sparse RoIAlign product goes through neither.
GEMM_EVENTS = ("aten::linear", "autograd::engine::evaluate_function: AddmmBackward0")
# Original image sizes (height, width) before the model's resize, both orientations.
SIZES = ((480, 640), (640, 480), (427, 640), (640, 427), (512, 512), (600, 800), (800, 600), (500, 375))
NUM_CLASSES = 5
IMAGES = 16


@dataclass
class Result:
    variant: str
    round_s: list[float]  # median s/step of each round
    speedup_over_amp: list[float]  # per round
    compile_s: float | None = None
    graph_breaks: int | None = None
    final_loss: float | None = None


def make_batches(
    batch_size: int, seed: int, one_size: bool = False
) -> list[tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]]:
    """IMAGES synthetic images (noise and one to three filled boxes with their masks), in batches; of
    SIZES in turn, or all of the first (`one_size`: one padded batch shape, one compile)."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i in range(IMAGES):
        h, w = SIZES[0 if one_size else i % len(SIZES)]
        image = torch.rand(3, h, w, generator=g) * 0.5
        count = 1 + i % 3
        x0 = (torch.rand(count, generator=g) * w * 0.5).floor()
        y0 = (torch.rand(count, generator=g) * h * 0.5).floor()
        boxes = torch.stack([x0, y0, x0 + w * 0.3, y0 + h * 0.3], dim=1)
        masks = torch.zeros(count, h, w, dtype=torch.uint8)
        for k, (a, b, c, d) in enumerate(boxes.int().tolist()):
            masks[k, b:d, a:c] = 1
            image[:, b:d, a:c] += 0.4 * (k + 1) / count
        labels = torch.tensor([1 + (i + k) % (NUM_CLASSES - 1) for k in range(count)])
        samples.append((image, {"boxes": boxes, "labels": labels, "masks": masks}))
    return [
        ([s[0] for s in samples[i : i + batch_size]], [s[1] for s in samples[i : i + batch_size]])
        for i in range(0, IMAGES, batch_size)
    ]


class Runner:
    """One variant's model and optimizer, stepping through the shared batches."""

    def __init__(self, name: str, cfg: TrainConfig) -> None:
        self.name = name
        self.steps_done = 0
        self.last_loss = float("nan")
        if name == "torchvision":
            torch.manual_seed(cfg.seed)
            self._model = build_model(cfg.model, NUM_CLASSES, exportable=True).train()
            params = [p for p in self._model.parameters() if p.requires_grad]
            self.optimizer = torch.optim.SGD(params, lr=cfg.optim.lr, momentum=0.9, weight_decay=1e-4)
            self.engine = None
        else:
            self.engine = TorchEngine(cfg, NUM_CLASSES, iters_per_epoch=1000)

    @property
    def model(self) -> torch.nn.Module:
        return self.engine.model if self.engine is not None else self._model

    def step(self, images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]]) -> float:
        """One training step; its wall seconds."""
        started = time.perf_counter()
        if self.engine is not None:
            self.last_loss = sum(read_losses(self.engine.train_step(self.steps_done, images, targets)).values())
        else:
            losses = self.model(images, targets)
            total = sum(losses.values())
            self.optimizer.zero_grad(set_to_none=True)
            total.backward()
            self.optimizer.step()
            self.last_loss = float(total.detach())
        self.steps_done += 1
        return time.perf_counter() - started


def variant_config(args: argparse.Namespace, name: str) -> TrainConfig:
    flags = {
        "model": args.model,
        "min-size": args.min_size,
        "max-size": args.max_size,
        "batch-size": args.batch_size,
        "backbone-norm": args.backbone_norm,
        "trainable-backbone-layers": args.trainable_backbone_layers,
        "device": "cpu",
        "lr": args.lr,
        "warmup-iters": 1,
        "seed": 0,
        **VARIANTS[name],
    }
    if name == "torchvision":
        flags["channels-last"] = False
    return build_config(None, flags)


def weight_cast_bound(runner: Runner, repeats: int = 5) -> dict[str, float]:
    """Seconds per step autocast spends casting the weights to bf16 (each floating-point parameter once),
    and what a fused copy into kept bf16 copies would cost instead (the third lever's saving is the gap)."""
    assert runner.engine is not None
    params = [p.detach() for p in runner.engine.model.parameters() if p.is_floating_point()]
    copies = [p.to(torch.bfloat16) for p in params]

    return {
        "parameters": float(sum(p.numel() for p in params)),
        "autocast_casts_s": common.seconds_per_call(lambda: [p.to(torch.bfloat16) for p in params], repeats),
        "kept_copies_update_s": common.seconds_per_call(lambda: torch._foreach_copy_(copies, params), repeats),
    }


def step_breakdown(
    runners: dict[str, Runner], images: list[torch.Tensor], targets: list[dict[str, torch.Tensor]]
) -> dict[str, dict[str, float]]:
    """One profiled step of every variant on the same batch: its seconds, its convolutions' seconds (self
    time of `CONVOLUTION_OPS`: the kernels themselves) and its dense GEMMs' (`GEMM_EVENTS`, whole)."""
    from torch.profiler import ProfilerActivity, profile

    found = {}
    for name, runner in runners.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            seconds = runner.step(images, targets)
        events = prof.key_averages()
        convolution_us = sum(e.self_cpu_time_total for e in events if e.key in CONVOLUTION_OPS)
        gemm_us = sum(e.cpu_time_total for e in events if e.key in GEMM_EVENTS)
        found[name] = {
            "step_s": round(seconds, 3),
            "convolution_s": round(convolution_us / 1e6, 3),
            "gemm_s": round(gemm_us / 1e6, 3),
        }
    return found


def unit_rates(feature_shape: tuple[int, ...], repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of this host's bf16 units: the step's dominant convolution (3x3, 256 -> 256 channels on
    `feature_shape`, channels_last, as the kit runs it) forward and each backward, and a bf16 GEMM of
    the box head's first layer (1024 RoIs x 12544 inputs x 1024 outputs)."""
    batch, channels, height, width = feature_shape
    x = torch.randn(feature_shape).to(torch.bfloat16, memory_format=torch.channels_last)
    weight = torch.randn(channels, channels, 3, 3).to(torch.bfloat16, memory_format=torch.channels_last)
    grad = torch.randn(feature_shape).to(torch.bfloat16, memory_format=torch.channels_last)
    a, b = torch.randn(1024, 12544, dtype=torch.bfloat16), torch.randn(12544, 1024, dtype=torch.bfloat16)

    def backward(data: bool) -> Any:
        mask = [data, not data, False]
        return lambda: torch.ops.aten.convolution_backward(
            grad, x, weight, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, mask
        )

    def rate(work: Any, flop: float) -> float:
        work()  # oneDNN builds its kernel at the first call
        started = time.perf_counter()
        for _ in range(repeats):
            work()
        return round(flop * repeats / (time.perf_counter() - started) / 1e9, 1)

    conv_flop = 2.0 * batch * height * width * channels * channels * 9
    return {
        "convolution_forward": rate(lambda: torch.nn.functional.conv2d(x, weight, padding=1), conv_flop),
        "convolution_backward_data": rate(backward(data=True), conv_flop),
        "convolution_backward_weights": rate(backward(data=False), conv_flop),
        "gemm": rate(lambda: a @ b, 2.0 * 1024 * 12544 * 1024),
    }


def calibrated_backbone(args: argparse.Namespace, images: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """A ResNet body state as a pretrained one is to frozen BatchNorm: the same seeded weights, with each
    norm's statistics those of one batch (a batch-statistics forward at momentum 1). Freshly built frozen
    norms are the identity: a deep ResNet's activations then grow without bound and training diverges."""
    flags = {**vars(args), "backbone_norm": "batch"}
    cfg = variant_config(argparse.Namespace(**flags), "fp32")
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, NUM_CLASSES, exportable=True).train()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = 1.0
    with torch.no_grad():
        model.backbone(model.transform(images)[0].tensors)
    return model.backbone.body.state_dict()


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    set_flush_denormal(True)
    batches = make_batches(args.batch_size, seed=0, one_size=args.one_size)
    wanted = args.variants.split(",")
    unknown = [v for v in wanted if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(unknown)} (known: {', '.join(VARIANTS)})")
    if any("compile" in v for v in wanted) and (problem := compiler_problem(torch.device("cpu"))):
        raise SystemExit(f"--variants: the compiling variants cannot run here: {problem}")
    runners = {name: Runner(name, variant_config(args, name)) for name in wanted}
    if args.backbone_norm == "frozen":
        state = calibrated_backbone(args, batches[0][0])
        for runner in runners.values():
            runner.model.backbone.body.load_state_dict(state)  # frozen norms drop num_batches_tracked themselves
    results = {name: Result(name, [], []) for name in wanted}
    for name, runner in runners.items():
        if VARIANTS[name].get("compile"):
            breaks_before, started = graph_breaks(), time.perf_counter()
            for images, targets in batches:  # every padded shape once: compiles (and any recompiles)
                runner.step(images, targets)
            results[name].compile_s = round(time.perf_counter() - started, 1)
            results[name].graph_breaks = graph_breaks() - breaks_before
            print(f"{name}: compiled and warmed up in {results[name].compile_s} s", file=sys.stderr, flush=True)
    for round_index in range(args.rounds):
        order = wanted if round_index % 2 == 0 else list(reversed(wanted))
        times: dict[str, list[float]] = {name: [] for name in wanted}
        for i in range(args.steps):  # step i of every variant in turn: a load change hits all of them
            for name in order:
                times[name].append(runners[name].step(*batches[i % len(batches)]))
        medians = {name: statistics.median(times[name][2:]) for name in wanted}
        for name in order:
            print(f"round {round_index + 1} {name}: {medians[name]:.3f} s/step", file=sys.stderr, flush=True)
        for name in wanted:
            results[name].round_s.append(round(medians[name], 3))
            if "amp" in medians:
                results[name].speedup_over_amp.append(round(medians["amp"] / medians[name], 3))
    for name, runner in runners.items():
        results[name].final_loss = round(runner.last_loss, 4)
    report: dict[str, Any] = {
        "config": {
            "model": args.model,
            "min_size": args.min_size,
            "max_size": args.max_size,
            "batch_size": args.batch_size,
            "backbone_norm": args.backbone_norm,
            "trainable_backbone_layers": args.trainable_backbone_layers,
            "threads": args.threads,
            "image_sizes": [list(SIZES[0])] if args.one_size else [list(s) for s in SIZES],
            "steps_per_round": args.steps,
            "measured_steps": f"3-{args.steps}",
            "rounds": args.rounds,
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        },
        "results": [asdict(r) for r in results.values()],
    }
    if "amp" in runners:
        report["weight_cast_bound"] = weight_cast_bound(runners["amp"])
    if args.breakdown:
        report["breakdown"] = step_breakdown(runners, *batches[len(batches) // 2])
        model = next(iter(runners.values())).model
        height, width = model.transform(batches[0][0])[0].tensors.shape[-2:]
        report["unit_gflops"] = unit_rates((args.batch_size, 256, height // 4, width // 4))
    return report


def render_table(report: dict[str, Any]) -> str:
    cfg = report["config"]
    rounds = cfg["rounds"]
    head = (
        f"{cfg['model']}, {cfg['min_size']} px (max {cfg['max_size']}), batch {cfg['batch_size']}, "
        f"backbone norm {cfg['backbone_norm']}, {cfg['threads']} threads: median s/step of steps "
        f"{cfg['measured_steps']}, speed-up over `amp` in the same round"
    )
    columns = " | ".join(f"round {r + 1}" for r in range(rounds))
    lines = [head, "", f"| variant | {columns} | compile s | graph breaks |", "|---" * (rounds + 3) + "|"]
    for r in report["results"]:
        cells = []
        for i, seconds in enumerate(r["round_s"]):
            ratio = f" ({r['speedup_over_amp'][i]:.2f}x)" if r["speedup_over_amp"] else ""
            cells.append(f"{seconds:.2f}{ratio}")
        extra = [r["compile_s"], r["graph_breaks"]]
        lines.append(f"| {r['variant']} | " + " | ".join(cells + ["" if e is None else str(e) for e in extra]) + " |")
    if bound := report.get("weight_cast_bound"):
        lines += [
            "",
            f"bf16 weight copies (bound): autocast casts {bound['parameters'] / 1e6:.1f} M weights per step in "
            f"{bound['autocast_casts_s'] * 1e3:.1f} ms; kept copies would be refreshed in "
            f"{bound['kept_copies_update_s'] * 1e3:.1f} ms",
        ]
    if breakdown := report.get("breakdown"):
        lines += [
            "",
            "| one profiled step | seconds | convolutions | dense GEMMs | the rest |",
            "|---|---|---|---|---|",
        ]
        for name, b in breakdown.items():
            rest = b["step_s"] - b["convolution_s"] - b["gemm_s"]
            cells = [f"{b[k]:.2f} ({b[k] / b['step_s']:.0%})" for k in ("convolution_s", "gemm_s")]
            lines.append(
                f"| {name} | {b['step_s']:.2f} | {' | '.join(cells)} | {rest:.2f} ({rest / b['step_s']:.0%}) |"
            )
        rates = report["unit_gflops"]
        lines += [
            "",
            f"bf16 GFLOP/s here: the dominant 3x3 convolution {rates['convolution_forward']:.0f} forward, "
            f"{rates['convolution_backward_data']:.0f} backward (data), {rates['convolution_backward_weights']:.0f} "
            f"backward (weights); a 1024 x 12544 x 1024 GEMM {rates['gemm']:.0f}",
        ]
        if "amp" in breakdown:
            floor = min(b["convolution_s"] + b["gemm_s"] for b in breakdown.values())
            lines.append(
                f"ceiling: with every operation but the convolutions and GEMMs gone, `amp` would be at most "
                f"{breakdown['amp']['step_s'] / floor:.2f}x faster ({floor:.2f} s of them a step)"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="maskrcnn_resnet50_fpn")
    parser.add_argument("--min-size", type=int, default=800)
    parser.add_argument("--max-size", type=int, default=1333)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--backbone-norm", default="frozen", choices=("frozen", "batch"))
    parser.add_argument("--trainable-backbone-layers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="steps per variant per round; steps 3.. are measured")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--variants", default="amp,amp+fold,amp+compile,amp+fold+compile")
    parser.add_argument("--one-size", action="store_true", help="every image the same size (compiles once)")
    parser.add_argument(
        "--no-breakdown",
        dest="breakdown",
        action="store_false",
        help="skip the profiled step and the bf16 units' rates (where the step goes)",
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error(f"--steps must be at least 3 (steps 3.. are measured), got {args.steps}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(render_table(report))
    print(json.dumps(report, indent=2))
    if (out := args.json_out) is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
