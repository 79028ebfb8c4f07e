"""The backbone (ResNet body + FPN) compiled with torch.compile for training, where a compiler exists.

torch.compile's inductor fuses the elementwise work around the convolutions (BatchNorm, ReLU, residual
adds, autocast's casts) into generated kernels: C++ on the CPU, Triton on CUDA. Both need a compiler
at run time: a C++ compiler for the CPU kernels, a C compiler for Triton's launcher. The kit's image
has neither, so there (and wherever one is missing) the backbone stays eager, said in one log line.

Shapes are dynamic (`dynamic=True`): images of any size and aspect reuse one compiled graph instead of
compiling one per size. `nn.Module.compile` compiles the module in place: its parameters, state dict
keys and hooks stay those of the eager module, so checkpoints and optimizers do not see it.
"""

from __future__ import annotations

import logging
import os
import shutil

import torch
from torch import nn

log = logging.getLogger(__name__)

__all__ = ["compile_backbone", "compiler_problem", "graph_breaks"]


def compiler_problem(device: torch.device) -> str | None:
    """Why torch.compile's default backend cannot build kernels for `device` here; None when it can."""
    if device.type == "cpu":
        from torch._inductor import cpp_builder, exc  # imported late: inductor is heavy and only needed here

        try:
            cpp_builder.get_cpp_compiler()  # runs `$CXX --version` (g++ by default)
        except exc.InvalidCxxCompiler:
            return "no C++ compiler for inductor's CPU kernels (install g++ or set CXX)"
        return None
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed (inductor's CUDA kernels need it)"
        # Triton builds its launcher with $CC, else gcc, else clang (triton/runtime/build.py).
        if not (os.environ.get("CC") or shutil.which("gcc") or shutil.which("clang")):
            return "no C compiler for Triton's launcher (set CC or install gcc)"
        return None
    return f"no compile backend is set up for device {device.type!r}"


def compile_backbone(model: nn.Module, device: torch.device) -> bool:
    """Compile `model.backbone` in place (dynamic shapes) when `device` has what inductor needs; returns
    whether it did. Otherwise the backbone stays eager and one log line says why."""
    problem = compiler_problem(device)
    if problem is not None:
        log.warning("--compile: the backbone runs eagerly: %s (--no-compile silences this)", problem)
        return False
    # force_layout_optimization: inductor picks its channels-last layout for a graph with convolutions in it;
    # the backward graph has none (only convolution_backward), so without this it pins the gradients'
    # strides to the first batch's sizes and recompiles at every new image size (measured: R50, 800 px).
    model.get_submodule("backbone").compile(dynamic=True, options={"force_layout_optimization": True})
    return True


def graph_breaks() -> int:
    """Graph breaks torch.compile has met so far in this process (dynamo's own counter): each one
    splits a compiled graph in two, and the code between them runs eagerly."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())
