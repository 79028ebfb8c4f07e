"""Measure each movable module of Mask R-CNN on this device: forward and backward time, the bytes
that actually cross each possible cut, activation memory, parameter bytes, optimizer step time.

Each module runs as its own pipeline stage (stages.StageModule), so what crosses a cut is the real
MicroBatchState the pipeline would send: its tensors are counted with the transport's own
`wire_bytes` (forward) and `gradient_bytes` (backward). A stage's input tensors that require grad
are cut from the graph and made leaves, as the pipeline's RPC boundary does, so each module's
backward is timed on its own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from maskrcnn_launcher.contract import MODULES
from torch import Tensor

from ..config import TrainConfig
from ..data.transforms.augment import augment_batch, build_augmentation
from ..engines.base import resolve_device
from ..engines.pipeline.stages import MicroBatchState, StageModule, build_stages
from ..engines.pipeline.transport import Route, gradient_bytes, map_tensors, tensors_in, to_wire, wire_bytes
from ..modeling.model import build_model
from ..modeling.optim import build_optimizer
from ..modeling.perf import autocast_context

#: Background + the synthetic set's classes: the class count changes only the heads' last layers.
NUM_CLASSES = 4


@dataclass(frozen=True)
class ModuleCost:
    """One module on one micro-batch (medians over the measured iterations)."""

    name: str
    forward_s: float
    backward_s: float
    optimizer_s: float  # one SGD step over the module's trainable parameters (once per batch)
    param_bytes: int  # all parameters (each process holds them)
    trainable_bytes: int  # gradients and momentum exist only for these
    activation_bytes: int  # peak held for backward: CUDA allocator peak, or saved-tensor bytes on CPU


@dataclass(frozen=True)
class CutCost:
    """The boundary after `after` (MODULES order); "input" is the master -> first stage link."""

    after: str
    forward_bytes: int
    backward_bytes: int


@dataclass(frozen=True)
class Measurements:
    device: str  # e.g. "cpu: AMD EPYC" or "cuda: NVIDIA H100"
    device_type: str  # cpu or cuda
    threads: int  # intra-op threads the timings ran with
    micro_batch_images: int
    image_size: tuple[int, int]
    instances_per_image: int
    modules: tuple[ModuleCost, ...]
    cuts: tuple[CutCost, ...]  # input, then after each module but the last
    data: str = "synthetic"  # where the micro-batches came from, for the limits line

    def module(self, name: str) -> ModuleCost:
        return next(m for m in self.modules if m.name == name)

    def cut_after(self, name: str) -> CutCost:
        return next(c for c in self.cuts if c.after == name)


def synthetic_batch(
    num_images: int, size: tuple[int, int], instances: int, seed: int = 0
) -> tuple[list[Tensor], list[dict[str, Tensor]]]:
    """Random images with `instances` filled rectangles each (boxes, labels, masks)."""
    gen = torch.Generator().manual_seed(seed)
    height, width = size
    images, targets = [], []
    for _ in range(num_images):
        image = torch.rand(3, height, width, generator=gen) * 0.2
        boxes, masks = [], []
        for _ in range(instances):
            h = int(torch.randint(max(height // 8, 2), max(height // 3, 3), (1,), generator=gen))
            w = int(torch.randint(max(width // 8, 2), max(width // 3, 3), (1,), generator=gen))
            y0 = int(torch.randint(0, height - h, (1,), generator=gen))
            x0 = int(torch.randint(0, width - w, (1,), generator=gen))
            mask = torch.zeros(height, width, dtype=torch.uint8)
            mask[y0 : y0 + h, x0 : x0 + w] = 1
            image[:, y0 : y0 + h, x0 : x0 + w] += 0.6
            boxes.append([x0, y0, x0 + w, y0 + h])
            masks.append(mask)
        images.append(image.clamp(0, 1))
        targets.append(
            {
                "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                "labels": torch.randint(1, NUM_CLASSES, (instances,), generator=gen),
                "masks": torch.stack(masks) if masks else torch.zeros(0, height, width, dtype=torch.uint8),
            }
        )
    return images, targets


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> tuple[float, object]:
    """Seconds `fn` takes on `device`: wall time on a GPU; on a CPU the process's CPU time per
    intra-op thread, so that other work on a shared host does not leak into the profile (the model
    adds core sharing back explicitly). Exact for one thread; assumes perfect scaling for more."""
    _sync(device)
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    started = clock()
    result = fn()
    _sync(device)
    elapsed = clock() - started
    return (elapsed if device.type == "cuda" else elapsed / torch.get_num_threads()), result


def _as_leaves(state: MicroBatchState) -> MicroBatchState:
    """The state as the next stage receives it over RPC: tensors that carry grad become leaves."""
    return map_tensors(state, lambda t: t.detach().requires_grad_() if t.requires_grad else t.detach())


class _SavedBytes:
    """Bytes autograd saves for backward inside the context (each storage once): on CPU, the
    activation memory a module holds between its forward and backward."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def pack(self, t: Tensor) -> Tensor:
        if t.device.type != "meta":
            storage = t.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def _one_pass(
    stages: list[StageModule], inputs: MicroBatchState, device: torch.device, cfg: TrainConfig
) -> tuple[list[float], list[float], list[int], list[tuple[int, int]]]:
    """Forward every stage, then backward in reverse: per-module times, activation bytes and
    (forward, backward) bytes leaving each stage."""
    fwd_s, act, sent = [], [], []
    # Tensor lists taken at the moment of sending/receiving: stages rewrite their state in place.
    received: list[list[Tensor]] = []
    produced: list[list[Tensor]] = []
    losses: list[Tensor] = []
    state = map_tensors(inputs, lambda t: t.to(device))
    for stage in stages:
        state = _as_leaves(state)
        received.append(tensors_in(state))
        saved = _SavedBytes()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
            with autocast_context(device, cfg.amp, cfg.amp_dtype):
                seconds, state = _timed(lambda s=stage, st=state: s(st), device)
        fwd_s.append(seconds)
        act.append(torch.cuda.max_memory_allocated(device) - base if device.type == "cuda" else saved.total)
        if not stage.is_last:
            state = to_wire(state, cfg.pipeline.bf16_transport, Route(str(device)))  # as a device map sends it
            sent.append((wire_bytes(state), gradient_bytes(state)))
        else:
            losses = list(state.losses.values())
        produced.append(tensors_in(state))
    bwd_s = [0.0] * len(stages)
    for i in reversed(range(len(stages))):
        if i == len(stages) - 1:
            loss = sum(losses)
            bwd_s[i], _ = _timed(lambda loss=loss: loss.backward(), device)
            continue
        pairs = [
            (o, r.grad)
            for o, r in zip(produced[i], received[i + 1], strict=True)
            if o.requires_grad and r.grad is not None
        ]
        if pairs:
            outs, grads = zip(*pairs, strict=True)
            bwd_s[i], _ = _timed(lambda o=outs, g=grads: torch.autograd.backward(o, g), device)
    return fwd_s, bwd_s, act, sent


Batch = tuple[list[Tensor], list[dict[str, Tensor]]]


def measure(
    cfg: TrainConfig,
    image_size: tuple[int, int],
    instances_per_image: int,
    iterations: int = 3,
    device: torch.device | None = None,
    batches: Sequence[Batch] = (),
    num_classes: int = NUM_CLASSES,
    data: str = "synthetic",
) -> Measurements:
    """Profile every module at `cfg`'s model, micro-batch size (batch / micro-batches), precision and
    device; `iterations` measured passes after one warm-up pass, averaged (the mean is what a run's
    throughput sees). Pass i runs `batches[i % len(batches)]` (micro-batches of a real data set: the
    RoI heads' cost depends on its instances), or else synthetic images of `image_size` with
    `instances_per_image` rectangles each. Either goes through --data-augmentation first, as in training
    (lsj's fixed squares, multiscale's sizes, which the model then keeps)."""
    device = device or resolve_device(cfg.device)  # as the engines resolve it: no silent CPU for --device cuda
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, num_classes, keep_data_sizes=cfg.data.sized_by_data()).to(device).train()
    stages = build_stages(model, [[name] for name in MODULES], trained=False)  # timed, not trained as stages
    optimizers = [build_optimizer(stage, cfg.optim) if _trainable(stage) else None for stage in stages]
    micro = max(1, cfg.data.batch_size // max(1, cfg.pipeline.micro_batches))
    batches = list(batches) or [synthetic_batch(micro, image_size, instances_per_image, seed=cfg.seed)]
    augmentation = build_augmentation(cfg.data.data_augmentation, cfg.model.min_size, cfg.model.max_size)
    batches = [augment_batch(augmentation, images, targets, cfg.seed) for images, targets in batches]
    inputs = [MicroBatchState.from_inputs(images, targets) for images, targets in batches]

    runs, opt_runs, input_bytes = [], [], []
    for i in range(1 + iterations):  # the first pass warms caches and allocators up
        for opt in optimizers:
            if opt is not None:
                opt.zero_grad(set_to_none=True)
        state = inputs[max(0, i - 1) % len(inputs)]
        input_bytes.append(wire_bytes(state))
        runs.append(_one_pass(stages, state, device, cfg))
        opt_runs.append([_timed(opt.step, device)[0] if opt is not None else 0.0 for opt in optimizers])
    runs, opt_runs, input_bytes = runs[1:], opt_runs[1:], input_bytes[1:]

    def med(values: list[float]) -> float:
        return float(statistics.mean(values))

    modules = tuple(
        ModuleCost(
            name=name,
            forward_s=med([r[0][i] for r in runs]),
            backward_s=med([r[1][i] for r in runs]),
            optimizer_s=med([o[i] for o in opt_runs]),
            param_bytes=sum(p.numel() * p.element_size() for p in stage.parameters()),
            trainable_bytes=sum(p.numel() * p.element_size() for p in stage.parameters() if p.requires_grad),
            activation_bytes=max(r[2][i] for r in runs),
        )
        for i, (name, stage) in enumerate(zip(MODULES, stages, strict=True))
    )
    cuts = (CutCost("input", round(statistics.mean(input_bytes)), 0),) + tuple(
        CutCost(
            name, round(statistics.mean(r[3][i][0] for r in runs)), round(statistics.mean(r[3][i][1] for r in runs))
        )
        for i, name in enumerate(MODULES[:-1])
    )
    return Measurements(
        device=_device_name(device),
        device_type=device.type,
        threads=torch.get_num_threads(),
        micro_batch_images=micro,
        image_size=image_size,
        instances_per_image=instances_per_image,
        modules=modules,
        cuts=cuts,
        data=data,
    )


def _trainable(stage: StageModule) -> bool:
    return any(p.requires_grad for p in stage.parameters())


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        model = ""
    return f"cpu: {model or 'unknown'}"
