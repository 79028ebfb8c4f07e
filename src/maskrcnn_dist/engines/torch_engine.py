"""The `local` and `ddp` engines: the whole model in this process; ddp wraps it in DistributedDataParallel
inside `process_group`'s group. Per step ddp adds one small all-reduce of the loss terms, which carries the
stop flag too: every rank sees the same non-finite loss or stop at once, and they stop together.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from fractions import Fraction
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from maskrcnn_launcher.contract import process_group_backend
from torch.nn.parallel import DistributedDataParallel

from ..config import TrainConfig, fp16_on_cpu_problem
from ..data.loader import MicroBatch, StepBatch
from ..errors import ConfigError, UserError
from ..lifetime.stop import StopRequest
from ..modeling.compiled import compile_backbone, graph_breaks
from ..modeling.model import build_model, side_effect_free_losses
from ..modeling.optim import build_optimizer, build_scheduler, load_optimizer_state
from ..modeling.perf import autocast_context, grad_scaler, scales_loss
from ..modeling.rng import StepSeeder
from ..modeling.sync_bn import convert_sync_batchnorm
from .base import Engine, Images, Targets, resolve_device, to_device
from .prefetch import DevicePrefetcher

log = logging.getLogger(__name__)
T = TypeVar("T")


def local_rank() -> int:
    """This process's index on its machine (torchrun's LOCAL_RANK; 0 outside torchrun)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size() -> int:
    """Processes of this job on this machine (torchrun's LOCAL_WORLD_SIZE; 1 outside torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def ddp_backend(cfg: TrainConfig) -> str:
    """The process group's backend for this process's device (made current here, before any group)."""
    device = resolve_device(cfg.device, local_rank())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # More ranks on this machine than GPUs (resolve_device wraps around): ranks share a GPU.
    shares_gpu = device.type == "cuda" and local_world_size() > torch.cuda.device_count()
    return process_group_backend(uses_gpu=device.type == "cuda", shares_gpu=shares_gpu)


@contextmanager
def process_group(cfg: TrainConfig) -> Iterator[int]:
    """The ddp process group for the body, from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT); yields the world size. Peers silent for --rpc-timeout seconds fail the collective."""
    backend, device = ddp_backend(cfg), resolve_device(cfg.device, local_rank())
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=cfg.peers.timeout))
    log.info("ddp rank %d of %d on %s (%s)", dist.get_rank(), dist.get_world_size(), device, backend)
    try:
        yield dist.get_world_size()
        # A run that ended well: every rank leaves together, once rank 0 has written its last checkpoint.
        # A rank that tore its group down while rank 0 still wrote was seen to abort in gloo's teardown
        # ("terminate called without an active exception", exit -6) and fail the whole run.
        dist.barrier()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def on_rank0(compute: Callable[[], T]) -> T:
    """`compute()` on rank 0 only, its result broadcast to every rank (the data check runs once).
    A user error on rank 0 is raised on every rank, so no rank waits for a result that never comes."""
    payload: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            payload = [(True, compute())]
        except UserError as exc:
            payload = [(False, exc)]
    dist.broadcast_object_list(payload, src=0)
    ok, value = payload[0]
    if not ok:
        raise value
    return value


class TorchEngine(Engine):
    """One model in this process; with `distributed=True`, one DDP replica of the process group that
    `process_group` opened."""

    def __init__(
        self,
        cfg: TrainConfig,
        num_classes: int,
        iters_per_epoch: int,
        distributed: bool = False,
        stop: StopRequest | None = None,
    ) -> None:
        """`stop`: this process's stop request (stop.py); None: nothing asks (predict, tests, benchmarks)."""
        super().__init__(stop)
        self.cfg = cfg
        self.name = "ddp" if distributed else "local"
        self.device = resolve_device(cfg.device, local_rank())
        # --device auto that found no GPU; --device cpu was refused at parse time. A library caller that
        # asks for fp16 on the CPU gets it, scaler included (the tests exercise GradScaler("cpu") so).
        auto_found_cpu = cfg.device == "auto" and self.device.type == "cpu"
        if auto_found_cpu and (problem := fp16_on_cpu_problem(cfg.amp, cfg.amp_dtype)):
            raise ConfigError(problem)
        self.pin_memory = self.device.type == "cuda"
        if distributed:
            self.data_rank, self.data_world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)  # identical initial weights on every rank, before DDP's broadcast
        self.model = build_model(cfg.model, num_classes, keep_data_sizes=cfg.data.sized_by_data()).to(self.device)
        if distributed and cfg.sync_bn:  # one process already normalises by its whole batch
            self.model = convert_sync_batchnorm(self.model, self.device)
        # In place, before DDP wraps the model: parameters, state dict keys and DDP's hooks stay the eager ones.
        self.compiled = cfg.compile and compile_backbone(self.model, self.device)
        self.seeder = StepSeeder(cfg.seed)
        self.seeder.attach(dict(self.model.named_children()))
        self.optimizer = build_optimizer(self.model, cfg.optim)
        self.scheduler = build_scheduler(self.optimizer, cfg.optim, iters_per_epoch, cfg.total_steps(iters_per_epoch))
        self.scaler = grad_scaler(self.device, cfg.amp, cfg.amp_dtype)
        self.skips_expected = scales_loss(self.device, cfg.amp, cfg.amp_dtype)
        self._skipped: torch.Tensor | None = None
        self.trained = self.model
        self._stop_agreed = False  # the last step's all-reduced stop flag
        if distributed:
            self.wrap()

    def wrap(self) -> None:
        """The model as a DDP replica of the current process group (its constructor is a collective)."""
        ids = [self.device.index] if self.device.type == "cuda" else None
        self.trained = DistributedDataParallel(self.model, device_ids=ids)

    @property
    def distributed(self) -> bool:
        return self.trained is not self.model

    # -- steps ----------------------------------------------------------------------------------

    def train_step(self, step: int, images: Images, targets: Targets) -> dict[str, torch.Tensor]:
        """One step on one batch: this rank's micro-batch of a global batch at the launch's world size."""
        whole = MicroBatch(images, targets, micro=self.data_rank, weight=Fraction(1, self.data_world_size))
        return self.train_micro_batches(step, [whole])

    def train_micro_batches(self, step: int, micro_batches: Sequence[MicroBatch]) -> dict[str, torch.Tensor]:
        weighted = self.accumulate(step, micro_batches)
        # After backward (no parameter has changed yet): a stop asked for during it still ends this step.
        logged = self._mean_over_ranks(weighted)
        self.apply_gradients()
        return logged

    def accumulate(self, step: int, micro_batches: Sequence[MicroBatch]) -> dict[str, torch.Tensor]:
        """The forward and backward of this rank's share of a global batch: gradients accumulate over its
        micro-batches (DDP all-reduces once, in the last one's backward), each loss scaled by its weight x
        world size, as DDP averages over ranks: the step's gradient is the image-weighted mean over the
        global batch. Returns the weighted loss terms, summed over the micro-batches, on the device."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        weighted: dict[str, torch.Tensor] = {}
        for i, micro_batch in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with contextlib.nullcontext() if last or not self.distributed else self.trained.no_sync():
                terms = self._forward_backward(step, micro_batch, float(micro_batch.weight * self.data_world_size))
            for name, value in terms.items():
                weighted[name] = weighted[name] + value if name in weighted else value
        return weighted

    def apply_gradients(self) -> None:
        """The optimizer's and the schedule's step on the gradients backward left (clipped if asked); a
        step whose gradients are not finite is skipped on the device (`skipped`)."""
        if self.cfg.optim.clip_grad_norm:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.clip_grad_norm)
        scale = self.scaler._get_scale_async().clone()  # the scale falls exactly when the step is skipped
        self.scaler.step(self.optimizer)  # fused: found_inf skips the update on the device, no host read
        self.scaler.update()
        self._skipped = self.scaler._get_scale_async() < scale
        self.scheduler.step()

    def skipped(self) -> torch.Tensor | None:
        return self._skipped

    def on_device(self, batches: Iterable[StepBatch]) -> Iterable[StepBatch]:
        return DevicePrefetcher(batches, self.device) if self.device.type == "cuda" else batches

    def _forward_backward(self, step: int, micro_batch: MicroBatch, scale: float) -> dict[str, torch.Tensor]:
        """One micro-batch's forward and backward, its loss scaled by `scale` (1: as it is, bit for bit);
        returns its loss terms, detached and scaled, for the step's record."""
        images, targets = to_device(micro_batch.images, micro_batch.targets, self.device)
        self.seeder.at(step, micro=micro_batch.micro)
        with autocast_context(self.device, self.cfg.amp, self.cfg.amp_dtype):
            loss_dict = self.trained(images, targets)
        loss = sum(loss_dict.values())
        self.scaler.scale(loss if scale == 1.0 else loss * scale).backward()
        return {name: value.detach() if scale == 1.0 else value.detach() * scale for name, value in loss_dict.items()}

    def _mean_over_ranks(self, loss_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loss terms' mean over ranks, left on the device. In ddp this rank's stop flag rides along
        in the same all-reduce, and is the step's one host read (every rank must agree where to stop)."""
        names = sorted(loss_dict)
        terms = [loss_dict[n].detach().float() for n in names]
        if not self.distributed:
            return dict(zip(names, terms))
        # torch.full, not torch.tensor: a fill kernel on the device, no copy from host memory to wait for.
        asked = torch.full((), 1.0 if self.stop is not None and self.stop.requested else 0.0, device=terms[0].device)
        values = self.all_reduce_sum(torch.stack([*terms, asked]))
        self._stop_agreed = self.agreed(bool(values[-1] > 0))
        return dict(zip(names, values[:-1] / self.data_world_size))

    def stop_after_step(self) -> bool:
        return self._stop_agreed if self.distributed else super().stop_after_step()

    def extra_metrics(self) -> dict[str, float]:
        # Each break splits the compiled backbone and runs the code between the pieces eagerly: 0 is the aim.
        return {"compile/graph_breaks": float(graph_breaks())} if self.compiled else {}

    @torch.no_grad()
    def predict(self, images: Images) -> list[dict[str, torch.Tensor]]:
        images, _ = to_device(images, None, self.device)
        self.model.eval()
        with autocast_context(self.device, self.cfg.amp, self.cfg.amp_dtype):
            detections = self.model(images)  # the bare module: inference needs no DDP collectives
        return [{k: v.float().cpu() if v.is_floating_point() else v.cpu() for k, v in d.items()} for d in detections]

    def validation_losses(self, images: Images, targets: Targets) -> dict[str, torch.Tensor]:
        images, targets = to_device(images, targets, self.device)
        devices = [self.device] if self.device.type == "cuda" else []
        with (
            side_effect_free_losses(self.model, devices),
            autocast_context(self.device, self.cfg.amp, self.cfg.amp_dtype),
        ):
            # The bare module, not DDP: DDP's forward may broadcast buffers, a collective that
            # ranks with fewer validation batches would never reach.
            losses = self.model(images, targets)
        return {k: v.float().cpu() for k, v in losses.items()}

    # -- collectives ------------------------------------------------------------------------

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.distributed:
            return tensor
        on_device = tensor.to(self.device)
        dist.all_reduce(on_device)
        return on_device.to(tensor.device)

    def gather_objects(self, obj: Any) -> list[Any] | None:
        if not self.distributed:
            return [obj]
        gathered = [None] * self.data_world_size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.skips_expected else {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if "optimizer" in state:  # every engine saves the optimizer in the same layout
            load_optimizer_state(self.optimizer, state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if state.get("scaler") and self.skips_expected:  # fp16's scale; the guard at 1 keeps none
                self.scaler.load_state_dict(state["scaler"])

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]


class TorchEngines:
    """The local and ddp engines' factory (engines.EngineFactory); `on_rank0` runs the data check once, on
    rank 0, its result broadcast to every rank (an elastic group's factory keeps it in the job's store)."""

    def __init__(self, cfg: TrainConfig, distributed: bool, stop: StopRequest) -> None:
        self.cfg, self.distributed, self.stop = cfg, distributed, stop

    def __call__(self, num_classes: int, iters_per_epoch: int) -> TorchEngine:
        return TorchEngine(self.cfg, num_classes, iters_per_epoch, distributed=self.distributed, stop=self.stop)

    def on_rank0(self, compute: Callable[[], T]) -> T:
        return on_rank0(compute)
