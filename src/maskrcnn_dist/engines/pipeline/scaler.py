"""The pipeline's loss scale, kept by the master: fp16's dynamic loss scaling across stages.

torch.amp.GradScaler scales a loss, unscales one optimizer's gradients and decides the step where they
all live. In the pipeline the loss lives on the last stage and the gradients on every stage, so the
work is split: the master holds the scale (this object) and sends it with each micro-batch, the last
stage multiplies its loss by it, every stage unscales its gradients by its inverse and checks them
(update.reduce_gradients, with GradScaler's own kernel), the master skips the step everywhere if any
stage found an inf or a nan, and updates the scale here with GradScaler's own update kernel. The state
dict is GradScaler's, so a checkpoint's "scaler" moves between the pipeline and the local engine.

Disabled (bf16, fp32): the scale stays 1.0 (exact), and non-finite gradients still skip the step.
"""

from __future__ import annotations

from typing import Any

import torch


class LossScaler:
    def __init__(
        self,
        enabled: bool,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        """GradScaler's defaults; `enabled` False keeps the scale at 1.0."""
        self.enabled = enabled
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self._scale = torch.full((), init_scale if enabled else 1.0, dtype=torch.float32)
        self._growth_tracker = torch.zeros((), dtype=torch.int32)

    @property
    def scale(self) -> float:
        """What the last stage multiplies its loss by."""
        return float(self._scale)

    @property
    def inv_scale(self) -> float:
        """What every stage multiplies its gradients by, computed as GradScaler computes it."""
        return float(self._scale.double().reciprocal().float())

    def update(self, found_inf: bool | None = None, new_scale: float | None = None) -> None:
        """After a step: back off when any stage found a non-finite gradient, grow after `growth_interval`
        good steps in a row (torch._amp_update_scale_, GradScaler.update's kernel); or set `new_scale`."""
        if not self.enabled:
            return
        if new_scale is not None:
            self._scale.fill_(new_scale)
            return
        found = torch.full((), 1.0 if found_inf else 0.0, dtype=torch.float32)
        torch._amp_update_scale_(
            self._scale, self._growth_tracker, found, self.growth_factor, self.backoff_factor, self.growth_interval
        )

    def state_dict(self) -> dict[str, Any]:
        """GradScaler.state_dict()'s layout; empty when disabled, as GradScaler's is."""
        if not self.enabled:
            return {}
        return {
            "scale": self.scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": int(self._growth_tracker),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A GradScaler state dict (this one's or the local engine's); an empty one (a scaler that was off)
        changes nothing."""
        if not self.enabled or not state:
            return
        self._scale.fill_(float(state["scale"]))
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self._growth_tracker.fill_(int(state["_growth_tracker"]))
