"""The stage host: the object that lives on a worker and runs one stage's replicas, op by op.

It never leaves its worker: hosts.py keeps it in the worker's registry and reaches it through
module-level functions called by name. What its methods return crosses the wire, so they return
tensors and small plain values only, never a module, an optimizer or anything holding a lock (guard.py).

A micro-batch's forward arrives with its input by value (an `Activation`, transport.py). The stage runs
it in its turn (rounds.py), keeps its input leaves and its outputs (training), and passes the output
on to the next stage itself (`links.forward`), never through the master: the call's answer is the
next stage's. The last stage weighs its loss by the micro-batch's share of the images, scales it
(fp16) and backpropagates from it in the turn its schedule gives that backward; every other stage's
backward arrives from the stage after it with the gradients of what it sent, runs
`torch.autograd.backward(outputs, grads)` and sends its input leaves' gradients to the stage before
(`links.backward`), as torch.distributed.pipelining's stages do. Parameter gradients accumulate on
each replica; the master's step (update.py) adds them over replicas.

Streams. Each replica runs its GPU work on a stream of its own (streams.py: `Lane`), whichever stream
RPC gave the request, so its forwards, backwards and update keep their order on the device.

Random numbers. StepSeeder reseeds the process-wide generator before the transform, RPN and RoI heads
run. Replicas of one stage run in threads of one process, so those modules run under a host-wide lock
(the backbone, the bulk of the work, does not need it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import torch
from maskrcnn_launcher.contract import StagePlacement, edge_device_map

from ...config import TrainConfig
from ...modeling.model import side_effect_free_losses
from ...modeling.perf import autocast_context
from .replica import Replica, autocast_dtype, build_replicas
from .rounds import Kept, Round, Rounds, Ticket, wait_done
from .schedule import BACKWARD, FORWARD, Op
from .stages import MicroBatchState, StageModule
from .streams import StreamOps
from .transport import HOST, Activation, attach, cut, from_wire, route_for, send_gradients, to_wire, wire_bytes
from .update import apply_step, load_stage, reduce_gradients, stage_state


class Links(Protocol):
    """A stage host's calls to its neighbours (hosts.py makes them RPC calls): each returns a future."""

    def forward(self, ticket: Ticket, activation: Activation) -> torch.futures.Future: ...

    def backward(self, ticket: Ticket, grads: list[torch.Tensor | None]) -> torch.futures.Future: ...


def completed(value: Any) -> torch.futures.Future:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(value)
    return future


class StageHost:
    """Stage `index` of `placements` on this worker: one replica per device of its placement.

    `transport`: the pod plan's ("cpu" or "device_maps"): how each replica's tensors leave over each edge
    (transport.route_for). `links`: the calls to the neighbouring stages (None: a stage alone, in tests).
    `streams`: the replicas' stream operations (None: CUDA streams on a GPU, none on a CPU; tests pass a
    recorder)."""

    def __init__(
        self,
        cfg: TrainConfig,
        placements: Sequence[StagePlacement],
        index: int,
        num_classes: int,
        iters_per_epoch: int,
        transport: str = "cpu",
        streams: StreamOps | None = None,
        links: Links | None = None,
    ) -> None:
        self.cfg, self.index, self.links = cfg, index, links
        self.timeout = cfg.peers.timeout
        self.is_first, self.is_last = index == 0, index == len(placements) - 1
        self.replicas: list[Replica] = build_replicas(cfg, placements, index, num_classes, iters_per_epoch, streams)
        devices = placements[index].devices
        after = {} if self.is_last else edge_device_map(transport, devices, placements[index + 1].devices)
        before = {} if self.is_first else edge_device_map(transport, devices, placements[index - 1].devices)
        # Per replica: how its activations leave for the next stage, and its input gradients for the one before.
        self.routes = [(route_for(after, d), route_for(before, d)) for d in devices]
        self.rounds = Rounds(len(placements), index, len(self.replicas))
        self._rng_lock = threading.Lock()

    # -- description ----------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """What the master needs to know of this stage: its state dict's keys, its number of trainable
        parameters (to split an optimizer state), its learning rate and whether it computes in fp16 (the
        loss is then scaled). Plain values only."""
        first = self.replicas[0]
        return {
            "keys": list(first.stage.state_dict()),
            "trainable": len(first.trainable),
            "lr": float(first.optimizer.param_groups[0]["lr"]),
            "fp16": any(autocast_dtype(self.cfg, r.device) == torch.float16 for r in self.replicas),
        }

    # -- forward ----------------------------------------------------------------------------

    def forward(self, ticket: Ticket, incoming: Activation) -> torch.futures.Future:
        """Micro-batch `ticket.micro` on replica micro % R, in its turn. Its output goes on to the next
        stage; the future holds the last stage's answer (None in training, CPU results otherwise)."""
        r = ticket.micro % len(self.replicas)
        replica, round_ = self.replicas[r], self.rounds.for_ticket(ticket, self._begin)
        position = round_.position(r, Op(FORWARD, ticket.micro))
        with replica.turnstile.turn(round_.id, position):
            out = self._forward(r, round_, ticket, incoming)
        if not self.is_last:
            return self.links.forward(ticket, out)
        # The last stage's backwards need nothing from downstream: each runs as soon as its turn comes.
        while round_.next_is(r, position + 1, BACKWARD):
            position += 1
            with replica.turnstile.turn(round_.id, position):
                self._backward(r, round_, replace(ticket, micro=round_.ops[r][position].micro), None)
        return completed(out)

    def _begin(self, round_: Round) -> None:
        if round_.mode == "train":  # the step's gradients accumulate from here
            for replica in self.replicas:
                replica.optimizer.zero_grad(set_to_none=True)

    def _forward(self, r: int, round_: Round, ticket: Ticket, incoming: Activation) -> Activation | Any:
        replica = self.replicas[r]
        started = time.perf_counter()
        with replica.lane.entered(incoming=incoming) as visit:
            state, leaves = attach(incoming)
            dtype = autocast_dtype(self.cfg, replica.device)
            # Under bf16 autocast the stage computes in bf16 anyway: bf16 features stay bf16 on arrival.
            state = from_wire(state, replica.device, keep_bf16=dtype == torch.bfloat16)
            replica.seeder.at(ticket.step, ticket.micro)
            with autocast_context(replica.device, self.cfg.amp, self.cfg.amp_dtype):
                state = self._run(replica.stage, state, ticket.mode)
            if self.is_last:
                out = visit.hand_back(self._answer(r, round_, ticket, state, leaves))
            else:
                bf16 = self.cfg.pipeline.bf16_transport
                out, outputs = cut(to_wire(state, bf16, self.routes[r][0]), ticket.train)
                if ticket.train:
                    round_.keep(ticket.micro, Kept(leaves, outputs))
                visit.hand_back(out)
        round_.ran(r, Op(FORWARD, ticket.micro))
        if ticket.train:
            round_.meter.forward_s += time.perf_counter() - started
            round_.meter.bytes_forward += 0 if self.is_last else wire_bytes(out)
        return out

    def _answer(
        self, r: int, round_: Round, ticket: Ticket, state: MicroBatchState, leaves: list[torch.Tensor]
    ) -> MicroBatchState | None:
        """The last stage: in training, keep the weighted, scaled loss for the backward and its terms for
        the step (nothing goes back now); otherwise the results, in host memory, for the master."""
        if not ticket.train:
            return to_wire(state, False, HOST)
        loss = sum(state.losses.values())
        if ticket.loss_weight != 1.0:
            loss = loss * ticket.loss_weight
        if ticket.loss_scale != 1.0:
            loss = loss * ticket.loss_scale
        round_.flag_nonfinite(r, loss)
        round_.losses[ticket.micro] = {name: value.detach() for name, value in state.losses.items()}
        round_.keep(ticket.micro, Kept(leaves, [loss]))
        return None

    def _run(self, stage: StageModule, state: MicroBatchState, mode: str) -> MicroBatchState:
        if mode == "train":
            stage.train()
            return stage(state, self._guard)
        if mode == "eval":
            stage.eval()
            with torch.no_grad():
                return stage(state, self._guard)
        # Under the guard: the generator's save and restore must not interleave with another replica's draws.
        with self._guard(), side_effect_free_losses(stage, self._cuda_devices()):
            return stage(state)

    def _guard(self) -> threading.Lock:
        return self._rng_lock

    def _cuda_devices(self) -> list[torch.device]:
        return [r.device for r in self.replicas if r.device.type == "cuda"]

    # -- backward ---------------------------------------------------------------------------

    def backward(self, ticket: Ticket, grads: list[torch.Tensor | None]) -> None:
        """The gradients of what micro-batch `ticket.micro` sent on, from the next stage: its backward, in
        its turn. An error is also kept for the step's update to raise (nobody waits on this call)."""
        r = ticket.micro % len(self.replicas)
        round_ = self.rounds.get(ticket.round_id)
        try:
            with self.replicas[r].turnstile.turn(round_.id, round_.position(r, Op(BACKWARD, ticket.micro))):
                self._backward(r, round_, ticket, grads)
        except Exception as exc:
            round_.fail(f"stage {self.index + 1}: backward of micro-batch {ticket.micro}: {exc}")
            raise

    def _backward(self, r: int, round_: Round, ticket: Ticket, grads: list[torch.Tensor | None] | None) -> None:
        """Backward from the kept outputs (`grads` None: the last stage's loss) into the parameters and
        the input leaves; the leaves' gradients go to the stage before."""
        replica = self.replicas[r]
        started = time.perf_counter()
        kept = round_.release(ticket.micro)
        with replica.lane.entered(incoming=grads) as visit:
            if grads is None:
                kept.outputs[0].backward()
            else:
                pairs = [
                    (o, g.to(o.device, o.dtype)) for o, g in zip(kept.outputs, grads, strict=True) if g is not None
                ]
                if pairs:
                    torch.autograd.backward([o for o, _ in pairs], grad_tensors=[g for _, g in pairs])
            sent = visit.hand_back(send_gradients([leaf.grad for leaf in kept.inputs], self.routes[r][1]))
        del kept
        round_.ran(r, Op(BACKWARD, ticket.micro))
        round_.meter.backward_s += time.perf_counter() - started
        if self.is_first:
            return
        round_.meter.bytes_backward += wire_bytes(sent)
        self.links.backward(ticket, sent).add_done_callback(lambda f: _record_failure(f, round_, self.index, ticket))

    # -- the step's update, in two phases driven by the master -------------------------------

    def reduce(self, round_id: int, inv_scale: float, want_norms: bool) -> dict[str, Any]:
        """Phase 1, once every replica has run its whole schedule: gradients summed over replicas,
        unscaled and checked, norms (for global clipping) and, on the last stage, the micro-batches'
        loss terms, read back in one transfer."""
        round_ = self.rounds.get(round_id)
        wait_done(round_, [r.turnstile for r in self.replicas], self.timeout, f"stage {self.index + 1}")
        if round_.errors:
            raise RuntimeError("; ".join(round_.errors))
        found_inf, norms = reduce_gradients(self.replicas, inv_scale, round_.nonfinite, want_norms)
        names = list(next(iter(round_.losses.values()), {}))
        terms = [round_.losses[k][n].float().reshape(1) for k in sorted(round_.losses) for n in names]
        first = self.replicas[0]
        with first.lane.entered():
            parts = [found_inf.reshape(1), *([] if norms is None else [norms]), *(t.to(first.device) for t in terms)]
            flat = torch.cat(parts).cpu()  # the step's one read of this stage
        found, flat = bool(flat[0] > 0), flat[1:]
        count = 0 if norms is None else norms.numel()
        values = flat[count:].reshape(-1, len(names)) if names else flat[count:count]
        return {
            "found_inf": found,
            "norms": None if norms is None else flat[:count],
            "losses": [dict(zip(names, row)) for row in values],
        }

    def apply(self, round_id: int, clip_coef: torch.Tensor | None, skip: bool) -> dict[str, float]:
        """Phase 2: the optimizer's step on every replica unless `skip` (any stage's gradients or loss not
        finite), the scheduler's step; this round's figures."""
        round_ = self.rounds.get(round_id)
        apply_step(self.replicas, clip_coef, skip)
        return {**round_.meter.report(), "lr": float(self.replicas[0].optimizer.param_groups[0]["lr"])}

    # -- checkpoints -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return stage_state(self.replicas)

    def load(self, model: dict[str, torch.Tensor], optimizer: dict | None, scheduler: dict | None) -> None:
        load_stage(self.replicas, model, optimizer, scheduler)


def _record_failure(future: torch.futures.Future, round_: Round, index: int, ticket: Ticket) -> None:
    try:
        future.wait()
    except Exception as exc:
        round_.fail(f"stage {index + 1}: sending micro-batch {ticket.micro}'s gradients to stage {index}: {exc}")
