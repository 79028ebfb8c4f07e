"""The master's side of the pipeline engine: micro-batches in, one step driven over plain RPC calls.

One training step, every tensor by value in plain `rpc_async` calls (hosts.py); no RRef, no distributed
autograd, no distributed optimizer:

    for each micro-batch k:                       # none of these calls waits
        rpc_async(stage 1, forward, ticket_k, images_k + targets_k)
            stage s runs F(k) in its schedule's turn, keeps its input leaves and outputs, and calls
            stage s+1 with the activations itself (never through the master); the last stage weighs and
            scales its loss and runs B(k) in its turn: backward from the loss, the input gradients to
            stage s-1, which runs autograd.backward(outputs, grads) in its turn, and so on to stage 1
    wait for every forward chain
    every stage: reduce (after its whole schedule: gradients summed over replicas, unscaled, checked;
                 norms; the last stage's loss terms)        -> one small answer per stage
    the master: any stage's inf/nan skips the step everywhere; the global clipping coefficient
    every stage: apply (optimizer step unless skipped, scheduler step)
    the loss scale's update (scaler.py)

Which turn each forward and backward takes on a replica is the schedule's (`--pipeline-schedule`,
schedule.py): 1F1B keeps at most (stages - s) micro-batches in flight on stage s, GPipe all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.rpc as rpc
from maskrcnn_launcher.contract import StagePlacement, validate_placement
from torch import Tensor

from ...config import TrainConfig
from ...errors import ConfigError, PeerLostError, TrainingError
from ...lifetime.stop import StopRequest
from ..base import Engine, Images, Targets
from .hosts import StageClient, new_run_id
from .micro import fp16_on_cpu_stage, split_batch, weighted_mean
from .rounds import Ticket
from .scaler import LossScaler
from .state import merge_optimizer_states, split_optimizer_state
from .transport import Activation, wire_bytes

log = logging.getLogger(__name__)

MASTER = "master"


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
        if problem := fp16_on_cpu_stage(cfg, stages):
            raise ConfigError(problem)
        self.cfg = cfg
        self.timeout = cfg.peers.timeout
        self.micro_batches = cfg.pipeline.micro_batches
        self.schedule = cfg.pipeline.schedule
        self.workers = [s.rpc_name for s in stages]
        self.run = new_run_id()
        self.hosts = self._connect(stages)
        with self._rpc_errors("building the stages"):
            created = [h.create(cfg, tuple(stages), num_classes, iters_per_epoch, transport) for h in self.hosts]
            self.layout = torch.futures.wait_all(created)
        # fp16 in any stage: the last stage scales the loss and every stage unscales (scaler.py).
        self.scaler = LossScaler(enabled=any(layout["fp16"] for layout in self.layout))
        self.skips_expected = self.scaler.enabled
        self._skipped: Tensor | None = None
        self._lr = self.layout[0]["lr"]
        self._round = 0
        self._last_step = 0
        self._metrics: dict[str, float] = {}
        self._sent = 0  # bytes the master sent the first stage in the last round
        self._failed = False  # an RPC call of this engine failed (_rpc_errors)
        log.info(
            "pipeline: %s, %d micro-batches, %s",
            " -> ".join(f"{s.rpc_name}{list(s.modules)}x{len(s.devices)}" for s in stages),
            self.micro_batches,
            self.schedule,
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

    # -- a round of micro-batches ------------------------------------------------------------

    def _run_round(self, step: int, images: Images, targets: Targets | None, mode: str) -> tuple[int, list, list[int]]:
        """Every micro-batch of the batch into the pipeline; (round id, the last stage's answers, sizes)."""
        self._round += 1
        micro = split_batch(images, targets, self.micro_batches)
        sizes = [len(imgs) for imgs, _ in micro]
        tickets = [
            Ticket(
                self._round,
                step,
                k,
                len(micro),
                mode,
                self.schedule,
                loss_weight=sizes[k] / sum(sizes),
                loss_scale=self.scaler.scale,
            )
            for k in range(len(micro))
        ]
        with self._rpc_errors(f"running step {step} ({mode})"):
            sent = [Activation.of_inputs(imgs, tgts) for imgs, tgts in micro]
            answers = torch.futures.wait_all([self.hosts[0].forward(t, a) for t, a in zip(tickets, sent)])
        self._sent = sum(wire_bytes(a) for a in sent)
        return self._round, answers, sizes

    # -- Engine ---------------------------------------------------------------------------

    def train_step(self, step: int, images: Images, targets: Targets) -> dict[str, Tensor]:
        started, cpu_started = time.perf_counter(), time.process_time()
        self._last_step = step
        round_id, _, sizes = self._run_round(step, images, targets, "train")
        with self._rpc_errors(f"updating at step {step}"):
            reports, losses = self._update(round_id)
        self._record(reports, len(images), time.perf_counter() - started, time.process_time() - cpu_started)
        # Host values already: the loop reads them (and stops at a non-finite one) without a device read.
        return weighted_mean(losses, sizes)

    def _update(self, round_id: int) -> tuple[list[dict[str, float]], list[dict[str, Tensor]]]:
        """Both phases of the step on every stage; the stages' reports and the micro-batches' loss terms."""
        clip = self.cfg.optim.clip_grad_norm
        parts = torch.futures.wait_all([h.reduce(round_id, self.scaler.inv_scale, bool(clip)) for h in self.hosts])
        # Every stage and replica agrees before any optimizer steps: one inf or nan anywhere skips it everywhere.
        skip = any(part["found_inf"] for part in parts)
        coef = None
        if clip and not skip:
            # Global norm over every stage, as clip_grad_norm_ computes it over the whole model.
            total = torch.linalg.vector_norm(torch.cat([p["norms"] for p in parts]))
            coef = torch.clamp(clip / (total + 1e-6), max=1.0)
        reports = torch.futures.wait_all([h.apply(round_id, coef, skip) for h in self.hosts])
        self.scaler.update(found_inf=skip)
        self._skipped = torch.tensor(skip)
        return reports, parts[-1]["losses"]

    def skipped(self) -> Tensor | None:
        return self._skipped

    def _record(self, reports: list[dict[str, float]], images: int, seconds: float, master_cpu_s: float) -> None:
        self._lr = reports[0]["lr"]
        metrics: dict[str, float] = {"pipeline/step_s": seconds, "pipeline/master_busy_s": master_cpu_s}
        metrics[f"link/{MASTER}->{self.workers[0]}/bytes"] = float(self._sent)
        for i, report in enumerate(reports):
            if i + 1 < len(reports):
                src, dst = self.workers[i], self.workers[i + 1]
                metrics[f"link/{src}->{dst}/bytes"] = report["bytes_forward"]
                metrics[f"link/{dst}->{src}/grad_bytes"] = reports[i + 1]["bytes_backward"]
            metrics[f"stage{i + 1}/busy_s"] = report["busy_s"]
            metrics[f"stage{i + 1}/forward_s"] = report["forward_s"]
            metrics[f"stage{i + 1}/backward_s"] = report["backward_s"]
            metrics[f"stage{i + 1}/peak_in_flight"] = report["peak_in_flight"]
        if self.scaler.enabled:
            metrics["pipeline/loss_scale"] = self.scaler.scale
        # A stage is idle (in the bubble) for whatever part of the step it is not busy.
        busy = [r["busy_s"] for r in reports]
        metrics["pipeline/bubble_fraction"] = sum(max(0.0, 1 - b / seconds) for b in busy) / len(busy)
        metrics["pipeline/ideal_images_per_s"] = images / max(max(busy), 1e-9)
        metrics["pipeline/images_per_s"] = images / seconds
        self._metrics = metrics

    def predict(self, images: Images) -> list[dict[str, Tensor]]:
        _, answers, _ = self._run_round(self._last_step, images, None, "eval")
        return [d for answer in answers for d in answer.detections]

    def validation_losses(self, images: Images, targets: Targets) -> dict[str, Tensor]:
        # The same seeding position a local engine's validation uses: the last training step.
        _, answers, sizes = self._run_round(self._last_step, images, targets, "validate")
        return {k: v.float() for k, v in weighted_mean([a.losses for a in answers], sizes).items()}

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
            "scaler": self.scaler.state_dict(),
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
        # fp16's scale goes on where it stopped; a checkpoint without one (bf16, fp32, or a pipeline
        # checkpoint from before fp16 ran in the stages: "scaler" {}) starts from GradScaler's initial scale.
        if optimizers is not None:
            self.scaler.load_state_dict(state.get("scaler") or {})

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
