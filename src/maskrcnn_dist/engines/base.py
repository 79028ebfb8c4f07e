"""The Engine interface (an optimizer step, inference, validation losses, each engine its own way) and what
every engine shares: the device --device names, a batch moved there, the finite-loss check, the weight
checksum. Engines never import the loop around them (training/), nor each other: what they share is here.
"""

from __future__ import annotations

import abc
import hashlib
import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..data.loader import MicroBatch, StepBatch
from ..errors import ConfigError, TrainingError
from ..lifetime.stop import StopRequest

Images = list[torch.Tensor]
Targets = list[dict[str, torch.Tensor]]


class Engine(abc.ABC):
    """How Mask R-CNN's steps run. The Trainer drives it; tests may drive it directly."""

    name: str
    #: This process's position among the processes that each read their own share of the data
    #: (ddp: its rank; local and the pipeline's master: 0 of 1).
    data_rank: int = 0
    data_world_size: int = 1
    #: Page-locked batches speed host-to-GPU copies; only an engine that feeds a GPU from this process wants them.
    pin_memory: bool = False
    #: This process's stop request (stop.py), given at construction; None: nothing asks.
    stop: StopRequest | None = None

    def __init__(self, stop: StopRequest | None = None) -> None:
        self.stop = stop

    @property
    def is_main(self) -> bool:
        return self.data_rank == 0

    @abc.abstractmethod
    def train_step(self, step: int, images: Images, targets: Targets) -> dict[str, torch.Tensor]:
        """One optimizer step. Returns the loss terms averaged over the data-parallel world, detached,
        where they were computed: the step reads nothing back from a GPU (the loop reads the terms of
        several steps at once, training/losses.py). A step whose loss or gradients are not finite
        changes no weight (`skipped` says so); the loop stops the run where it reads it."""

    def on_device(self, batches: Iterable[StepBatch]) -> Iterable[StepBatch]:
        """The loader's batches as this engine's step wants them: here as they are (the step moves
        them); an engine with a GPU copies the next one while the current step runs (prefetch.py)."""
        return batches

    def skipped(self) -> torch.Tensor | None:
        """Whether the last step's update was skipped (non-finite gradients), as a 0-dim tensor where it
        was decided; None where no step is ever skipped but for a non-finite loss."""
        return None

    #: fp16's dynamic loss scaling skips the steps whose scaled gradients overflow, by design: a skip
    #: is then counted, not a divergence.
    skips_expected: bool = False

    def train_micro_batches(self, step: int, micro_batches: Sequence[MicroBatch]) -> dict[str, torch.Tensor]:
        """One optimizer step over this process's share of a global batch (data/plan.py): its
        micro-batches, each weighted by its share of the global batch's images. Here: the real ones
        (fillers left out) as one batch, the engine's own step (the pipeline's master, whose own
        micro-batches weigh by their image counts, reads a whole global batch this way)."""
        real = [m for m in micro_batches if m.weight > 0]
        if len(real) == 1:
            return self.train_step(step, real[0].images, real[0].targets)
        return self.train_step(step, [i for m in real for i in m.images], [t for m in real for t in m.targets])

    @abc.abstractmethod
    def predict(self, images: Images) -> list[dict[str, torch.Tensor]]:
        """Eval-mode detections on CPU, in the original images' coordinates."""

    @abc.abstractmethod
    def validation_losses(self, images: Images, targets: Targets) -> dict[str, torch.Tensor]:
        """Training-mode losses with no gradient, no change to any model state (BatchNorm
        statistics included) and the global RNG left as it was. No collectives."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """{"model": GeneralizedRCNN state dict with torchvision's key names, on CPU, plus
        "optimizer", "scheduler" and "scaler"}. Called on the main process only."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict(); every process calls it."""

    @abc.abstractmethod
    def lr(self) -> float: ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` on rank 0 (None elsewhere)."""
        return [obj]

    def stop_after_step(self) -> bool:
        """At the boundary after train_step: whether every process of the engine stops here. Here: this
        process was asked (local; the pipeline's master, which its stage workers tell over RPC)."""
        return self.stop is not None and self.stop.requested

    def agree_to_stop(self) -> bool:
        """Outside a step (before the first, after a validation or evaluation batch): whether any process
        was asked to stop, the same answer on each. One tiny all-reduce where there are peers to agree with."""
        asked = torch.tensor([1.0 if self.stop is not None and self.stop.requested else 0.0])
        return self.agreed(bool(self.all_reduce_sum(asked).item() > 0))

    def agreed(self, stop: bool) -> bool:
        """`stop`, the processes' common answer; a process that was not asked itself learns why it stops."""
        if stop and self.stop is not None:
            self.stop.request("a stop on another rank")  # keeps this process's own reason, if it had one
        return stop

    def extra_metrics(self) -> dict[str, float]:
        """Engine-specific figures logged with each training record (bytes per link, ...)."""
        return {}

    def close(self) -> None:
        """Release process groups, RPC agents and the like."""


# ----------------------------------------------------------------------------------------------
# What every engine shares (and profile, which measures on the device an engine would use).
# ----------------------------------------------------------------------------------------------


def resolve_device(requested: str, local_rank: int = 0) -> torch.device:
    """The device --device names for the process at `local_rank` on its machine: the CPU, or a visible
    GPU (more ranks than GPUs share them); --device cuda without a GPU is a ConfigError."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible to this process")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def checksum(tensors: Iterable[torch.Tensor]) -> str:
    """A digest of the exact bytes of `tensors`, with their dtypes and shapes: equal only where they are
    bitwise equal (NaN payloads included). Replicas compare theirs to prove they never drifted apart."""
    digest = hashlib.blake2b(digest_size=16)
    for t in tensors:
        flat = t.detach().cpu().contiguous().reshape(-1)
        digest.update(str((t.dtype, tuple(t.shape))).encode())
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()


def read_losses(losses: dict[str, torch.Tensor]) -> dict[str, float]:
    """A step's loss terms as Python floats, in one read (tools and tests; the loop reads many steps at once)."""
    if not losses:
        return {}
    return dict(zip(losses, torch.stack([v.detach().reshape(()).float() for v in losses.values()]).tolist()))


def check_finite(step: int, values: dict[str, float], skipped: bool = False, read_at: int | None = None) -> None:
    """A TrainingError naming the step and every non-finite loss term (or, `skipped`, its non-finite
    gradients): the engine changed no weight at it. `read_at`: the later step where the loop read it."""
    bad = [name for name, value in values.items() if not math.isfinite(value)]
    if not bad and not skipped:
        return
    what = f"non-finite loss at step {step}: {', '.join(f'{n}={values[n]}' for n in bad)}" if bad else ""
    what = what or f"non-finite gradients at step {step} (its loss was finite)"
    later = (
        f", and training stopped at step {read_at}, where the losses were read" if read_at not in (None, step) else ""
    )
    raise TrainingError(f"{what}; that step changed no weight{later} (lower --lr or set --clip-grad-norm)")


def as_float_image(image: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1]: uint8 images divided by 255 where they are (the loader's float path computes
    x / 255 in float32 too: the same values), float images as they are."""
    return image.float().div_(255.0) if image.dtype == torch.uint8 else image


def to_device(images: Images, targets: Targets | None, device: torch.device) -> tuple[Images, Targets | None]:
    """A batch (targets' tensors too, when given) on `device`, non-blocking from pinned memory on a GPU;
    uint8 images (a quarter of the bytes to copy) become float there."""
    non_blocking = device.type == "cuda"
    images = [as_float_image(img.to(device, non_blocking=non_blocking)) for img in images]
    if targets is not None:
        targets = [
            {k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v for k, v in t.items()}
            for t in targets
        ]
    return images, targets
