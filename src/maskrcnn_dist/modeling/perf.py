"""The process's numeric settings (threads, denormal floats, CUDA math: `setup_process`) and the model's
speed settings (mixed precision, memory format), in one place: every engine and tool takes them from here,
so a pipeline stage computes exactly what the same modules compute in the local engine.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import TrainConfig

log = logging.getLogger(__name__)

AMP_DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "float16": torch.float16}

# The modules converted to channels_last by `--channels-last` (names in torchvision's GeneralizedRCNN): NHWC
# lets oneDNN use its fast bf16 convolution kernels on CPU (and tensor-core kernels on CUDA).
# The backbone (ResNet body + FPN) is where the convolutions on large maps are; the RPN head runs its
# 3x3 convolution on the same FPN maps. Measured (R50-FPN, 800 px, batch 2, forward + backward,
# 2 threads, variants interleaved on one model): fp32 16.8 s, fp32 channels_last 14.4 s (1.17x);
# bf16 autocast 9.45 s (1.78x), bf16 + channels_last backbone 8.16 s (2.06x). Adding the mask head
# (14x14 RoI crops that RoIAlign returns in NCHW) measured 8.05 s: within noise, so it stays NCHW.
CHANNELS_LAST_MODULES = ("backbone", "rpn")

# Under --amp, convolutions and linear layers run in bf16 on CPU (AMX/AVX-512 BF16 units) and in fp16
# (with a gradient scaler) or bf16 on CUDA. What needs fp32 stays fp32:
# - the losses: autocast's own fp32 list (cross entropy, BCE with logits, smooth L1) on both device kinds;
# - RoIAlign and NMS: torchvision's autocast kernels cast their inputs to fp32 (CPU and CUDA);
# - box decoding, proposal filtering, mask pasting and the losses' inputs: torchvision's BoxCoder casts the
#   anchors/proposals to the regression output's dtype, so with bf16 head outputs an 800 px image would have
#   its box corners rounded to multiples of 4 px (bf16 keeps 8 significant bits). These modules' outputs are
#   cast to fp32 (keep_head_outputs_fp32): everything downstream of them is then fp32;
# - the optimizer: parameters and gradients stay fp32 (autocast casts copies, never the weights).
FP32_OUTPUT_MODULES = ("rpn.head", "roi_heads.box_predictor", "roi_heads.mask_predictor")


@dataclass(frozen=True)
class AmpCurveTolerance:
    """How far an --amp loss curve may stray from fp32's over the same steps from the same seed and
    weights (relative): measured on CPU (tests/trainer/test_amp.py's docstring), with margin. The CPU
    amp tests and the GPU check (benchmarks/gpu_check.py) hold every precision to this one bound."""

    first_step: float = 0.02
    every_step: float = 0.08
    mean: float = 0.03

    def problems(self, amp: Sequence[float], fp32: Sequence[float]) -> list[str]:
        """What exceeds the bound, one phrase each; empty when the curves agree."""
        deviation = [abs(a - f) / abs(f) for a, f in zip(amp, fp32, strict=True)]
        mean = abs(sum(amp) - sum(fp32)) / abs(sum(fp32))
        found = []
        if deviation[0] >= self.first_step:
            found.append(f"step 0 off by {deviation[0]:.3g} (bound {self.first_step})")
        if max(deviation) >= self.every_step:
            found.append(f"a step off by {max(deviation):.3g} (bound {self.every_step})")
        if mean >= self.mean:
            found.append(f"mean off by {mean:.3g} (bound {self.mean})")
        return found


AMP_CURVE_TOLERANCE = AmpCurveTolerance()


def amp_dtype(device: torch.device, requested: str = "auto") -> torch.dtype:
    """The autocast dtype: `requested`, or by default bf16 (fp32's exponent range: no gradient scaler,
    no skipped steps) on the CPU and on GPUs with bf16 units, and fp16 with a scaler on older GPUs."""
    if requested not in AMP_DTYPES:
        raise ValueError(f"amp dtype must be one of {', '.join(AMP_DTYPES)}, got {requested!r}")
    chosen = AMP_DTYPES[requested]
    if chosen is not None:
        return chosen
    if device.type == "cuda" and not gpu_has_bf16(device):
        return torch.float16
    return torch.bfloat16


def gpu_has_bf16(device: torch.device) -> bool:
    """Native bf16 units (Ampere and later); an older GPU only emulates bf16, slower than fp32."""
    if not torch.cuda.is_available():
        return False
    with torch.cuda.device(device):
        try:
            return torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # torch before 2.3 asks the capability only
            return torch.cuda.is_bf16_supported()


def autocast_context(
    device: torch.device, enabled: bool, dtype: str = "auto"
) -> contextlib.AbstractContextManager[Any]:
    """Autocast for `device` when enabled (see `amp_dtype`), else a no-op context."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=amp_dtype(device, dtype))


def scales_loss(device: torch.device, enabled: bool, dtype: str = "auto") -> bool:
    """Whether the step scales its loss: fp16 only. bf16 has fp32's exponent range, so its gradients
    do not underflow and scaling would only cost time."""
    return enabled and amp_dtype(device, dtype) == torch.float16


def grad_scaler(device: torch.device, enabled: bool, dtype: str = "auto") -> torch.amp.GradScaler:
    """fp16: torch's dynamic loss scaling, which skips the steps whose scaled gradients overflow.
    Otherwise a scaler at scale 1 (an exact multiply) kept for its check alone: a step whose gradients
    are not finite is skipped on the device, with the fused optimizer (optim.build_optimizer), so that
    no step reads the GPU back to decide whether to update the weights. On the CPU fp16 runs only for
    a library caller that asks (the tests: the command line refuses it, config.fp16_on_cpu_problem)."""
    if scales_loss(device, enabled, dtype):
        return torch.amp.GradScaler(device.type)
    return torch.amp.GradScaler(device.type, init_scale=1.0, growth_interval=2**31 - 1)


def setup_process(cfg: TrainConfig, default_threads: int | None = None) -> None:
    """Per-process numeric settings that must precede any model code, set by every command that runs the
    model (train, eval, predict, report --gallery, profile), so that its numbers are training's.
    `default_threads` applies when --threads is not given (a pipeline stage worker shares its machine: 1)."""
    threads = cfg.threads or default_threads
    if threads:
        torch.set_num_threads(threads)
    # A randomly initialised Mask R-CNN produces denormal floats that make some CPU iterations 3-6x
    # slower; flushing them to zero changes nothing a detector can notice. Before any computation:
    # intra-op threads copy the setting when they start (set_flush_denormal checks they did).
    set_flush_denormal(cfg.flush_denormal)
    set_device_math(cfg.tf32)


def set_device_math(tf32: bool) -> None:
    """The process's CUDA math, once, before any model code (flags only: harmless without a GPU).

    TF32 for fp32 matrix products (`tf32`; torch runs convolutions in TF32 by default already). cuDNN's
    autotuner stays off: the RoI heads' convolutions see a different number of RoIs every step and it
    would tune again for each (docs/gpu-check.md measured a step 4x slower with it)."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False


def _to_fp32(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.float() if value.is_floating_point() and value.dtype != torch.float64 else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_fp32(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_fp32(v) for k, v in value.items()}
    return value


def _fp32_output_hook(module: nn.Module, args: Any, output: Any) -> Any:
    # A module-level function, not a closure: a model with hooks still deep-copies (pipeline
    # replicas) and pickles.
    return _to_fp32(output)


def keep_head_outputs_fp32(model: nn.Module) -> None:
    """Cast the RPN head's and the box and mask predictors' outputs to fp32 (a no-op outside autocast:
    `.float()` of an fp32 tensor is the tensor itself). Modules this model lacks (a pipeline stage
    holds only some) are skipped."""
    for name in FP32_OUTPUT_MODULES:
        module = _find(model, name)
        if module is not None:
            module.register_forward_hook(_fp32_output_hook)


def to_channels_last(model: nn.Module, modules: tuple[str, ...] = CHANNELS_LAST_MODULES) -> list[str]:
    """Convert the 4-D parameters and buffers of `modules` to channels_last; returns those converted.

    Activations follow the weights: a convolution with channels_last weights returns channels_last
    output whatever its input's layout, so the images batched by the transform need no conversion.
    Gradients and optimizer state take the parameters' layout. State dicts keep their values (a
    checkpoint loads into either layout)."""
    converted = []
    for name in modules:
        module = _find(model, name)
        if module is not None:
            module.to(memory_format=torch.channels_last)
            converted.append(name)
    return converted


def _find(model: nn.Module, name: str) -> nn.Module | None:
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


def set_flush_denormal(enabled: bool) -> bool:
    """Flush denormal floats to zero (or stop doing so) on CPU; returns whether every intra-op thread
    now behaves as asked.

    `torch.set_flush_denormal` sets the flag of the calling thread only. Intra-op (OpenMP) threads
    copy it when they are created, at the first parallel operation: call this before any torch
    computation of the process, or the worker threads keep the old setting (measured: half of a
    2-thread multiplication then still produced denormals). The return value checks exactly that.
    """
    if not torch.set_flush_denormal(enabled):
        if enabled:
            log.warning("this CPU cannot flush denormal floats to zero: --flush-denormal has no effect")
        return not enabled
    # Large enough to be split over every intra-op thread (ATen's grain size is 32768 elements).
    probe = torch.full((65536 * max(torch.get_num_threads(), 1),), 1e-39, dtype=torch.float32) * 1.0
    denormals = int(torch.count_nonzero(probe))
    ok = denormals == 0 if enabled else denormals == probe.numel()
    if not ok:
        log.warning(
            "flush-denormal=%s reached only some intra-op threads (%d of %d probe values): set it "
            "before the first torch computation of the process",
            enabled,
            denormals,
            probe.numel(),
        )
    return ok
