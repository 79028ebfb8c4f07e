"""The master's side of the pipeline engine: micro-batches in, losses out, steps driven over RPC.

One training step, as in PyTorch's "distributed pipeline parallelism using RPC" tutorial, with the
stage hosts reached through functions called by name (hosts.py), never through an RRef to a host:

    for each micro-batch k:                      # none of these calls waits
        y_k = rpc.remote(worker1, hosts.forward, (run, 0, k, batch_k))   # the output stays on worker 1
        z_k = rpc.rpc_async(worker2, hosts.forward, (run, 1, k, y_k))    # worker 2 pulls y_k from worker 1
    losses = weighted mean of wait(z_k)           # the master holds every micro-batch's losses
    dist_autograd.backward(ctx, [sum(losses)])
    every stage: hosts.reduce (its replicas' gradients summed), (clip globally), hosts.apply

Stage 1 works on micro-batch k+1 while stage 2 works on k: the master only waits at the end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from maskrcnn_launcher.contract import StagePlacement, validate_placement
from torch import Tensor

from ...config import TrainConfig
from ...errors import PeerLostError, TrainingError
from ...lifetime.stop import StopRequest
from ..base import Engine, Images, Targets, check_finite
from .hosts import StageClient, new_run_id
from .stages import MicroBatchState
from .state import merge_optimizer_states, split_optimizer_state
from .transport import wire_bytes

log = logging.getLogger(__name__)

MASTER = "master"


def split_batch(images: Images, targets: Targets | None, micro_batches: int) -> list[tuple[Images, Targets | None]]:
    """Up to `micro_batches` contiguous, nearly equal slices (fewer when the batch is smaller)."""
    count = min(micro_batches, len(images))
    bounds = [round(i * len(images) / count) for i in range(count + 1)]
    return [(images[a:b], None if targets is None else targets[a:b]) for a, b in zip(bounds, bounds[1:])]


def weighted_mean(losses: Sequence[dict[str, Tensor]], sizes: Sequence[int]) -> dict[str, Tensor]:
    """Mean of the micro-batches' loss dicts weighted by their image counts.

    torchvision's terms are means over the sampled anchors/RoIs of a (micro-)batch; weighting by
    image count is the closest the micro-batch terms come to the full batch's mean (exact for M=1;
    for M>1 the sampling normalisers and BatchNorm's batch statistics differ per micro-batch).
    """
    total = sum(sizes)
    return {name: sum(d[name] * (n / total) for d, n in zip(losses, sizes)) for name in losses[0]}


def _ping() -> bool:
    return True


class PipelineEngine(Engine):
    """Mask R-CNN split over stage workers; this object lives on the master (RPC rank 0)."""

    name = "pipeline"

    def __init__(
        self,
        cfg: TrainConfig,
        stages: Sequence[StagePlacement],
        num_classes: int,
        iters_per_epoch: int,
        transport: str = "cpu",
        stop: StopRequest | None = None,
    ) -> None:
        """`stages`: the pod plan's placements, in pipeline order. RPC must be initialised, as "master".
        `stop`: the master's stop request (stop.py), which its workers feed over RPC; None: nothing asks."""
        super().__init__(stop)
        validate_placement([s.modules for s in stages])
        self.cfg = cfg
        self.timeout = cfg.peers.timeout
        self.micro_batches = cfg.pipeline.micro_batches
        self.workers = [s.rpc_name for s in stages]
        self.run = new_run_id()
        self.hosts = self._connect(stages)
        with self._rpc_errors("building the stages"):
            created = [h.create(cfg, tuple(stages), num_classes, iters_per_epoch, transport) for h in self.hosts]
            self.layout = torch.futures.wait_all(created)
        self._lr = self.layout[0]["lr"]
        self._round = 0
        self._last_step = 0
        self._metrics: dict[str, float] = {}
        self._failed = False  # an RPC call of this engine failed (_rpc_errors)
        log.info(
            "pipeline: %s, %d micro-batches",
            " -> ".join(f"{s.rpc_name}{list(s.modules)}x{len(s.devices)}" for s in stages),
            self.micro_batches,
        )

    def _connect(self, stages: Sequence[StagePlacement]) -> list[StageClient]:
        """The master's handles on the stage hosts of this engine's run (one per stage)."""
        return [StageClient(s.rpc_name, self.run, i, self.timeout) for i, s in enumerate(stages)]

    # -- failures ---------------------------------------------------------------------------

    @contextmanager
    def _rpc_errors(self, what: str) -> Iterator[None]:
        """Turn an RPC failure into PeerLostError naming the worker that no longer answers."""
        try:
            yield
        except TrainingError:
            raise
        except Exception as exc:
            self._failed = True  # close() then leaves the hosts to their processes' exit
            lost = self._find_lost_worker()
            if lost is None:
                raise
            raise PeerLostError(
                f"{lost} lost while {what} (stage {self.workers.index(lost) + 1}; no answer within "
                f"{self.timeout:g}s or connection closed): {str(exc).splitlines()[0] if str(exc) else exc!r}"
            ) from exc

    def _find_lost_worker(self) -> str | None:
        for name in self.workers:
            try:
                rpc.rpc_sync(name, _ping, timeout=max(1.0, min(5.0, self.timeout / 4)))
            except Exception:
                return name
        return None

    # -- the micro-batch flow ------------------------------------------------------------------

    def _launch(
        self, round_id: int, step: int, micro: int, images: Images, targets: Targets | None, mode: str
    ) -> torch.futures.Future:
        """Send one micro-batch down the pipeline without waiting; the future holds the last stage's
        output. Intermediate outputs stay on their workers (RRefs): the next stage pulls them."""
        carried: MicroBatchState | rpc.RRef = MicroBatchState.from_inputs(images, targets)
        for host in self.hosts[:-1]:
            carried = host.forward_kept(round_id, step, micro, carried, mode)
        return self.hosts[-1].forward(round_id, step, micro, carried, mode)

    def _run_round(
        self, step: int, images: Images, targets: Targets | None, mode: str
    ) -> tuple[list[MicroBatchState], list[int], int]:
        self._round += 1
        micro = split_batch(images, targets, self.micro_batches)
        with self._rpc_errors(f"running step {step} ({mode})"):
            futures = [self._launch(self._round, step, k, imgs, tgts, mode) for k, (imgs, tgts) in enumerate(micro)]
            outputs = torch.futures.wait_all(futures)
        sent = sum(wire_bytes(MicroBatchState.from_inputs(imgs, tgts)) for imgs, tgts in micro)
        return outputs, [len(imgs) for imgs, _ in micro], sent

    # -- Engine ---------------------------------------------------------------------------

    def train_step(self, step: int, images: Images, targets: Targets) -> dict[str, float]:
        started, cpu_started = time.perf_counter(), time.process_time()
        self._last_step = step
        with dist_autograd.context() as context_id:
            outputs, sizes, sent = self._run_round(step, images, targets, "train")
            loss_dict = weighted_mean([o.losses for o in outputs], sizes)
            logged = {name: float(value.detach()) for name, value in loss_dict.items()}
            check_finite(step, logged)  # before backward: no parameter has changed yet
            with self._rpc_errors(f"backward of step {step}"):
                dist_autograd.backward(context_id, [sum(loss_dict.values())])
                reports = self._step(context_id)
        self._record(
            reports, outputs, sent, len(images), time.perf_counter() - started, time.process_time() - cpu_started
        )
        return logged

    def _step(self, context_id: int) -> list[dict[str, float]]:
        clip = self.cfg.optim.clip_grad_norm
        norms = torch.futures.wait_all([h.reduce(context_id, bool(clip)) for h in self.hosts])
        coef = None
        if clip:
            # Global norm over every stage, as clip_grad_norm_ computes it over the whole model.
            total = torch.linalg.vector_norm(torch.cat([n for n in norms]))
            coef = torch.clamp(clip / (total + 1e-6), max=1.0)
        return torch.futures.wait_all([h.apply(coef) for h in self.hosts])

    def _record(
        self,
        reports: list[dict[str, float]],
        outputs: list[MicroBatchState],
        sent: int,
        images: int,
        seconds: float,
        master_cpu_s: float,
    ) -> None:
        self._lr = reports[0]["lr"]
        metrics: dict[str, float] = {"pipeline/step_s": seconds, "pipeline/master_busy_s": master_cpu_s}
        metrics[f"link/{MASTER}->{self.workers[0]}/bytes"] = float(sent)
        for i, report in enumerate(reports):
            src, dst = self.workers[i], ([*self.workers[1:], MASTER])[i]
            metrics[f"link/{src}->{dst}/bytes"] = report["bytes_forward"]
            metrics[f"link/{dst}->{src}/grad_bytes"] = report["bytes_backward"]
            metrics[f"stage{i + 1}/busy_s"] = report["busy_s"]
            metrics[f"stage{i + 1}/forward_s"] = report["forward_s"]
        # A stage is idle (in the bubble) for whatever part of the step it is not busy.
        busy = [r["busy_s"] for r in reports]
        metrics["pipeline/bubble_fraction"] = sum(max(0.0, 1 - b / seconds) for b in busy) / len(busy)
        metrics["pipeline/ideal_images_per_s"] = images / max(max(busy), 1e-9)
        metrics["pipeline/images_per_s"] = images / seconds
        self._metrics = metrics

    def predict(self, images: Images) -> list[dict[str, Tensor]]:
        outputs, _, _ = self._run_round(self._last_step, images, None, "eval")
        return [d for o in outputs for d in o.detections]

    def validation_losses(self, images: Images, targets: Targets) -> dict[str, Tensor]:
        # The same seeding position a local engine's validation uses: the last training step.
        outputs, sizes, _ = self._run_round(self._last_step, images, targets, "validate")
        return {k: v.float() for k, v in weighted_mean([o.losses for o in outputs], sizes).items()}

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        with self._rpc_errors("gathering the checkpoint"):
            parts = torch.futures.wait_all([h.state() for h in self.hosts])
        for name, part in zip(self.workers, parts):
            if len(set(part["checksums"])) > 1:
                raise TrainingError(f"{name}: stage replicas have diverged (checksums {part['checksums']})")
        model: dict[str, Tensor] = {}
        for part in parts:
            model.update(part["model"])
        return {
            "model": model,
            "optimizer": merge_optimizer_states([p["optimizer"] for p in parts]),
            "scheduler": parts[0]["scheduler"],
            "scaler": {},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        model = state["model"]
        expected = [key for layout in self.layout for key in layout["keys"]]
        missing, unexpected = sorted(set(expected) - set(model)), sorted(set(model) - set(expected))
        if missing or unexpected:
            raise KeyError(f"model state: missing {missing[:5]}, unexpected {unexpected[:5]}")
        optimizers = None
        if state.get("optimizer"):  # every engine's optimizer state has the same layout (see state.py)
            optimizers = split_optimizer_state(state["optimizer"], [layout["trainable"] for layout in self.layout])
        with self._rpc_errors("loading the checkpoint"):
            torch.futures.wait_all(
                [
                    h.load(
                        {k: model[k] for k in layout["keys"]},
                        None if optimizers is None else optimizers[i],
                        state.get("scheduler") if optimizers is not None else None,
                    )
                    for i, (h, layout) in enumerate(zip(self.hosts, self.layout))
                ]
            )
        if optimizers is not None and state.get("scheduler"):
            self._lr = state["optimizer"]["param_groups"][0]["lr"]

    def lr(self) -> float:
        return self._lr

    def extra_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def close(self) -> None:
        """Drop this run's stage hosts on their workers (their memory is freed before RPC shuts down).
        A worker that no longer answers has nothing left to free: closing does not fail on it. After an
        RPC failure nothing is dropped: a frozen peer would hold each drop for --rpc-timeout, and every
        process of the session is about to exit (the e2e silent-peer scenario bounds that exit)."""
        clients, self.hosts = self.hosts, []
        if self._failed:
            log.info("pipeline: the session failed; its stage hosts go with their processes")
            return
        pending = []
        for client in clients:
            try:
                pending.append((client, client.drop()))
            except Exception as exc:  # RPC refuses the call at once when the worker is known gone
                log.warning("could not drop stage %d on %s: %s", client.stage + 1, client.worker, exc)
        for client, dropped in pending:
            try:
                dropped.wait()
            except Exception as exc:
                log.warning("could not drop stage %d on %s: %s", client.stage + 1, client.worker, exc)
