"""The step of an elastic ddp group (--elastic, docs/elastic.md): the Trainer's step and its boundary, each
redone in the next generation when the group loses a member during it. The loop is the Trainer's
(loop.py); this replaces the step (`run_step`: guarded, settled), enters each generation, and holds a
group that fell below its minimum size.

What every member holds alike is the position (committed steps) and the weights: a step is committed on
every member or on none (the engine's commit point), and nothing else changes the weights. So after a
loss the survivors form the next generation (lifetime/elastic.py) and take the leader's word for where
they are: its position, and whether its boundary's work (validation, evaluation, the checkpoint) was
done. A member that went further (into the next step, uncommitted) steps back; the work the leader did
not finish is done again by all; the step in flight is redone from the weights they all hold. No
checkpoint is read and no finished step is lost. A replacement receives the leader's state (model,
optimizer, scheduler, scaler, RNG, position, every hook's) once it is in.

The batches come from the Trainer's one source (batches.py: rank `r` of `n`'s share of global batch `b`
of epoch `e`, under the engine's device prefetch), made again at each new generation: every image of the
epoch is trained on once, whatever members come and go, and the per-step sample record
(training/samples.py) says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..data.loader import StepBatch
from ..engines.elastic_ddp import ElasticTorchEngine, is_group_failure
from ..lifetime.elastic import BoundaryDecision, ElasticGroup
from ..lifetime.membership import admits_at, enough
from ..lifetime.stop import RunOver, Stopped
from . import state
from .base import Boundary, Done, HookBase
from .loop import LoaderFactory, Trainer
from .samples import SampleRecordHook
from .state import Position

log = logging.getLogger(__name__)


class ElasticTrainer(Trainer):
    """The Trainer of an elastic ddp member: the same loop, hooks, checkpoints and stops; its step guarded,
    and every failure of the group recovered in place (module docstring)."""

    samples_in_result = False  # each step's line is written ahead of it (`before_step`)

    def __init__(self, engine: ElasticTorchEngine, loader: LoaderFactory, *args: Any) -> None:
        super().__init__(engine, loader, *args)
        self.engine: ElasticTorchEngine = engine
        # Every step delivered to the hooks at once: the elastic step reads its losses anyway (the commit
        # decision needs them on the host), so holding them back would save no read.
        self.read_every = 1
        self.boundary_open = False  # a step is done and its boundary's work is not (yet) finished here
        self.hooks_done: list[str] = []  # the hooks whose work at the open boundary is done (not run again)
        self.sample_record: SampleRecordHook | None = None
        self.newcomer = False  # admitted mid-run: the others were past the start

    @property
    def group(self) -> ElasticGroup:
        return self.engine.group

    @property
    def record_rank(self) -> int:
        return self.group.me  # one file per process, whatever its rank in each generation

    def register_hooks(self, hooks: Sequence[HookBase]) -> None:
        super().register_hooks(hooks)
        self.sample_record = next((h for h in self.hooks if isinstance(h, SampleRecordHook)), None)

    @property
    def finished(self) -> bool:
        return super().finished and not self.boundary_open  # a loss inside the last boundary: finish it first

    def before_train(self) -> None:
        """The first generation entered (a newcomer receives the leader's state there), then the Trainer's start."""
        self.newcomer = self.group.me in self.group.newcomers
        self._settle(self._guarded(self._enter_generation))
        super().before_train()

    def catch_up(self) -> None:
        if not self.newcomer:  # the launch's members start together; a newcomer comes in mid-run
            self._settle(self._guarded(super().catch_up))

    def run_step(self) -> None:
        """The next step and its boundary, guarded; after the last, the replicas compared."""
        self._settle(self._guarded(self._step))
        if self.finished:
            self._settle(self._guarded(self._compare_replicas))

    def _step(self) -> None:
        if self.boundary_open:  # after a recovery: first the boundary's work the leader had left
            self.boundary_work(self.boundary())
            self.boundary_open = False
        elif not enough(self.group.size, self.group.policy):
            self._hold()
        else:
            super().run_step()
            if self.engine.decision.regroup:
                self._regroup(self.engine.decision)

    def before_step(self, batch: StepBatch) -> None:
        """This member's sample line of the step, written before the step: one not committed is dropped
        from every file again when the next generation forms (`_enter_generation`). Written after the
        commit instead, a kill in between would leave the committed step's images out of the record."""
        if self.sample_record is not None:
            self.sample_record.record(self.position.step + 1, self.samples(batch))

    def after_step(self) -> None:
        self.boundary_open, self.hooks_done = True, []
        super().after_step()
        self.boundary_open = False

    def _compare_replicas(self) -> None:
        """At the end, one small gather: whether every member holds the leader's weights, bit for bit (the
        same all-reduced gradients, the same optimizer state: a newcomer's state is checked here too)."""
        digest = self.engine.weights_digest()
        digests: list[Any] = [None] * self.engine.data_world_size
        dist.all_gather_object(digests, digest)
        if self.engine.is_main and len(set(digests)) == 1:
            log.info("elastic: the %d replicas hold the same weights", len(digests))
        elif self.engine.is_main:
            log.warning("elastic: the replicas' weights differ (members in rank order): %s", digests)

    def run_hooks(self, due: list[HookBase], at: Boundary) -> None:
        # After a recovery: only the work the leader had not done (an evaluation counts towards patience).
        super().run_hooks([hook for hook in due if hook.name not in self.hooks_done], at)

    def hook_ran(self, hook: HookBase, done: Done | None) -> None:
        super().hook_ran(hook, done)
        self.hooks_done.append(hook.name)

    # -- changes of membership ------------------------------------------------------------------

    def _regroup(self, decision: BoundaryDecision) -> None:
        """At the boundary: members asked to leave go, the joiners the leader admits come in."""
        self.engine.release()
        if self.group.regroup(decision) is None:  # this member was drained: it leaves alone
            raise Stopped.left_group(self.stop, self.position.step)
        self._enter_generation()

    def _hold(self) -> None:
        """Fewer members than the policy's minimum (--elastic-min-size), at the step boundary: the state
        saved, then the replacements waited for; the group goes on with them, or stops, the minimum named."""
        policy, step, size = self.group.policy, self.position.step, self.group.size
        saved = self.checkpointer.save(step) if step else None
        if self.engine.is_main:
            log.warning(
                "elastic: %d members, fewer than --elastic-min-size %d: holding after step %d (%s); waiting up to "
                "%gs for replacements",
                *(size, policy.min_size, step, f"checkpoint {saved}" if saved else "nothing to save"),
                policy.min_wait_s,
            )
        self.engine.release()
        if self.group.hold() is None:
            self.stop.request(f"--elastic-min-size {policy.min_size}")
            kept = f"every finished step is in the checkpoint of step {step}: {saved}" if saved else "nothing to save"
            self.stop.finish(f"{size} members after waiting {policy.min_wait_s:g}s for replacements; {kept}")
            raise Stopped(self.stop)
        self._enter_generation()

    # -- generations ----------------------------------------------------------------------------

    def _guarded(self, work: Callable[[], None]) -> str | None:
        """`work()`; the group's failure in words when it lost a member (this member's own errors raise).
        Returned, not handled here: the live exception would hold the failed group's sockets."""
        try:
            work()
        except Exception as exc:
            if not is_group_failure(exc):
                raise
            return f"{type(exc).__name__}: {exc}"
        return None

    def _settle(self, failure: str | None) -> None:
        """After a failure of the group: the next generation, as many times as forming it fails."""
        while failure is not None:
            log.warning("elastic: member %d: %s", self.group.me, failure.splitlines()[0][:300])
            self.engine.release()
            admit = admits_at(self.position.step + 1, self.total_steps)  # the leader's position decides
            if self.group.recover(failure, admit) is None:
                raise RunOver("elastic: the leader's run ended while this member waited for the next generation")
            failure = self._guarded(self._enter_generation)

    def _enter_generation(self) -> None:
        """Every member, in a new generation (the first included), in the same order: the model wrapped
        again, the leader's position and open boundary to every member, its state to the newcomers."""
        engine, group = self.engine, self.group
        engine.rejoin()
        engine.decision = BoundaryDecision(stop_all=False, leaving=(), admit=False)
        where = [{**vars(self.position), "open": self.boundary_open, "done": self.hooks_done, "pending": self.pending}]
        if self.sample_record is not None and group.is_leader:  # before anyone writes in this generation
            self.sample_record.drop_after(self.position.step, every_rank=True)
        dist.broadcast_object_list(where, src=0)
        leader = where[0]
        self.position = Position(leader["step"], leader["epoch"], leader["batch"])
        if self.sample_record is not None and not group.is_leader:  # a file the leader cannot see (another pod's)
            self.sample_record.drop_after(self.position.step, every_rank=False)
        self.boundary_open, self.hooks_done = leader["open"], list(leader["done"])
        self.pending = list(leader["pending"])
        sent = self.checkpoint_state() if group.is_leader and group.newcomers else None
        received = group.share_state(sent)
        if group.me in group.newcomers:
            self.position, _ = state.restore(engine, self.hooks, received, Path("<the leader>"))
            log.info("elastic: member %d received the leader's state at step %d", group.me, self.position.step)
        self.batches.reset()
