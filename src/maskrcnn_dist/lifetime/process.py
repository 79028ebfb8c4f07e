"""What every command that runs the model sets once per process, before any model code.

train, eval, predict, report --gallery and profile all call `setup_process`, so that a command's
numbers (threads, denormal floats, TF32 and cuDNN's autotuner on a GPU) are those of training.
"""

from __future__ import annotations

import torch

from ..config import TrainConfig
from ..modeling.perf import set_device_math, set_flush_denormal


def setup_process(cfg: TrainConfig, default_threads: int | None = None) -> None:
    """Per-process numeric settings that must precede any model code. `default_threads` applies when
    --threads is not given (a pipeline stage worker shares its machine: 1)."""
    threads = cfg.threads or default_threads
    if threads:
        torch.set_num_threads(threads)
    # A randomly initialised Mask R-CNN produces denormal floats that make some CPU iterations 3-6x
    # slower; flushing them to zero changes nothing a detector can notice. Before any computation:
    # intra-op threads copy the setting when they start (perf.set_flush_denormal checks they did).
    set_flush_denormal(cfg.flush_denormal)
    set_device_math(cfg.tf32)
