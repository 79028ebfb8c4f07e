"""Per-step seeding of the model's random parts.

Mask R-CNN draws random numbers inside its forward pass: the transform picks a training size, the
RPN and the RoI heads sample anchors and proposals. Reseeding the global generator right before
each of those modules runs, from (seed, step, micro-batch, module), makes the draws a function of
where we are in training rather than of everything that ran before. Three things follow:
  * the pipeline engine, whose modules live in different processes, draws exactly what a single
    process draws for the same step, so the two can be compared within tight tolerances;
  * resuming from a checkpoint reproduces an uninterrupted run's losses;
  * validation in the middle of training cannot shift the training trajectory.
"""

from __future__ import annotations

import torch
from torch import nn

from ..seeds import model_draw_seed

# The GeneralizedRCNN children that draw random numbers in training.
RANDOM_MODULES = ("transform", "rpn", "roi_heads")


class StepSeeder:
    """Owns the (step, micro-batch) position and reseeds before each random module runs."""

    def __init__(self, base_seed: int) -> None:
        self.base_seed = base_seed
        self.step = 0
        self.micro = 0
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def at(self, step: int, micro: int = 0) -> StepSeeder:
        self.step, self.micro = step, micro
        return self

    def attach(self, modules: dict[str, nn.Module]) -> None:
        """Hook the random modules among `modules` (name -> module, names as in GeneralizedRCNN)."""
        for name, module in modules.items():
            if name in RANDOM_MODULES:
                self._handles.append(module.register_forward_pre_hook(Reseed(self, name)))


class Reseed:
    """The forward pre-hook of one random module: reseed for it at its seeder's position. An object,
    not a closure, so that a hooked module pickles: with TensorPipe device maps, an RPC's result is
    pickled to find its CUDA tensors, a pipeline stage's RRef type query included (seen on a GPU)."""

    def __init__(self, seeder: StepSeeder, name: str) -> None:
        self.seeder, self.name = seeder, name

    def __call__(self, _module: nn.Module, _inputs: object) -> None:
        seeder = self.seeder
        torch.manual_seed(model_draw_seed(seeder.base_seed, seeder.step, seeder.micro, self.name))
