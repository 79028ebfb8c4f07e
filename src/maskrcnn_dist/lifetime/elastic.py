"""An elastic ddp group: survivors of a lost member go on in a new process group, a replacement joins at a
step boundary, a drained member leaves at one, and a group below its minimum size holds for replacements
(docs/elastic.md). Membership is agreed through the job's TCPStore and decided by the policy's functions
(membership.py); each generation is torch's default process group, so the engines' collectives (DDP,
all_reduce, gather_object) use it unchanged.

The step's protocol, on every member:
  1. the step's collectives (DDP's gradient all-reduce, the loss all-reduce with `boundary_flags`);
  2. `commit(step)`: nothing may change the weights before it returns; it returns on every member of
     the generation or on none (the store's compare_set decides), so the replicas never diverge;
  3. the optimizer step; then at the boundary `read_boundary` says who leaves and whether the leader
     admits joiners, and `regroup` forms the next generation.
A failure in 1 or 2 (a collective that errors, an aborted commit), or a generation that does not form
(a member that never comes), goes to `recover()`: the generation is marked ended (which releases every
member's commit), the old group dropped (which releases peers blocked on this process's sockets), and
the leader forms the next generation of those still here. The step in flight was committed nowhere: the
caller redoes it in the new generation. The caller drops whatever holds the old group (a
DistributedDataParallel wrapper) before `recover()`, `regroup()` and `hold()`, so that dropping it closes
the sockets, and wraps the model again in the new generation; after every new generation it calls
`share_state` (a newcomer receives the leader's state there).
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import PeerLostError
from . import transfer
from .leader import Desk
from .membership import (
    COMMITTED,
    LEADER,
    REFUSED,
    ElasticPolicy,
    Generation,
    Hold,
    after_waiting,
    connect,
    current_generation,
    heartbeat,
    next_members,
    publish_generation,
    read_generation,
    store_wait,
)
from .watcher import Watcher

log = logging.getLogger(__name__)


class GroupFailure(RuntimeError):
    """The generation lost a member: recover, then redo what was in flight."""


class StepAborted(GroupFailure):
    """The step in flight was not committed: a member was lost. Recover, then redo it."""


class FormationFailed(GroupFailure):
    """A generation did not form: one of its members never came to it."""


class LeaderLost(RuntimeError):
    """The master's process fell silent: the group cannot go on (the job restarts from its checkpoint)."""


@dataclass(frozen=True)
class BoundaryDecision:
    """What every member read from the step's flags: stop everyone (the leader was asked), who leaves
    (a member asked to stop: a drain), and whether the leader admits waiting joiners."""

    stop_all: bool
    leaving: tuple[int, ...]
    admit: bool

    @property
    def regroup(self) -> bool:
        return bool(self.leaving) or self.admit


class ElasticGroup:
    """This process's membership of the elastic group; `start()` forms or joins the first generation."""

    def __init__(
        self, host: str, port: int, me: int, launch_world: int, backend: str, policy: ElasticPolicy | None = None
    ) -> None:
        self.me, self.launch_world, self.backend = me, launch_world, backend
        self.policy = policy = policy or ElasticPolicy()
        self.store = connect(host, port, policy.timeout_s)
        self.watcher = Watcher(host, port, me, policy)
        self.generation: Generation | None = None  # the newest this member was in, formed or forming
        self.formed: Generation | None = None  # the newest that formed (the leader's announcements' base)
        self.newcomers: tuple[int, ...] = ()  # members the last generation admitted (they need the state)
        self.steps_done = 0  # steps committed in this process's generations
        self.desk = Desk(self.store, self.watcher, policy)  # the leader's reads behind its decisions

    # -- the generation -------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._generation().rank_of(self.me)

    @property
    def size(self) -> int:
        return self._generation().size

    @property
    def is_leader(self) -> bool:
        return self.me == LEADER

    def start(self) -> Generation | None:
        """Generation 0 of every launch rank, or, when the job is already past it (this process replaces
        a lost one), wait to be admitted at the leader's next step boundary; None when the leader's run
        ended meanwhile (nothing left to join: the watcher is closed, so a caller may simply return)."""
        if current_generation(self.store) is None:
            self.watcher.beat_as(heartbeat(self.me))
            return self._form(Generation(0, tuple(range(self.launch_world))), newcomers=())
        return self._join()

    def _join(self) -> Generation | None:
        """Ask in with a new ticket and wait for the leader's answer as long as it beats. Admitted, form the
        generation within the group's timeout or leave (PeerLostError): a healthy member never waits on it."""
        ticket = self.store.add("joins", 1)
        self.watcher.beat_as(heartbeat(self.me, ticket))  # not its id's: that may be its lost predecessor's
        self.store.set(f"join/{ticket}", str(self.me))
        log.info("elastic: member %d asks to join (ticket %d); waiting for a step boundary", self.me, ticket)
        self.watcher.watch(None, [LEADER])
        if not self._wait_for_leader(f"admitted/{ticket}", timeout_s=float("inf")):
            # Its daemon thread, left beating when the interpreter ends, may be inside a store call then,
            # and that aborts the process (SIGABRT: "terminate called without an active exception").
            self.watcher.close()
            return None
        answer = self.store.get(f"admitted/{ticket}").decode()
        if answer.startswith(REFUSED):
            raise PeerLostError(f"elastic: member {self.me} was not admitted: {answer.removeprefix(REFUSED)}")
        self.watcher.beat_as(heartbeat(self.me))
        try:
            return self._form(read_generation(self.store, int(answer)), newcomers=(self.me,))
        except (GroupFailure, dist.DistError) as exc:
            self._drop_group()
            raise PeerLostError(f"elastic: member {self.me} was admitted but could not join: {exc}") from None

    def _form(self, generation: Generation, newcomers: Iterable[int], leaving: Iterable[int] = ()) -> Generation:
        """This member in `generation`: every member met (`_gather`, after the launch's), then the process
        group; the leader then announces the change (`leaving`: the members that left at the boundary)."""
        self.generation, self.newcomers = generation, tuple(newcomers)
        if generation.number > 0:
            self._gather(generation)
        prefix = dist.PrefixStore(f"g{generation.number}/pg", self.store)
        dist.init_process_group(
            self.backend,
            store=prefix,
            rank=generation.rank_of(self.me),
            world_size=generation.size,
            timeout=timedelta(seconds=self.policy.timeout_s),
        )
        if self.is_leader and generation.number == 0:  # later ones the leader published before forming
            publish_generation(self.store, generation, ())
        if self.is_leader:
            self.desk.announce(self.formed or generation, generation, leaving, self.steps_done)
        self.formed = generation
        self.watcher.watch(generation.number, generation.members)
        return generation

    def _gather(self, generation: Generation) -> None:
        """Wait until every member of `generation` has come to form it, before the process group's
        rendezvous (which would wait the group's timeout for a member that never comes): a member silent
        for the dead time, or absent for the group's timeout, ends the generation (FormationFailed)."""
        number, policy = generation.number, self.policy
        self.store.set(f"g{number}/here/{self.me}", "1")
        self.watcher.watch(number, generation.members)
        deadline = time.monotonic() + policy.timeout_s
        missing = [m for m in generation.members if m != self.me]
        while missing := [m for m in missing if not self.store.check([f"g{number}/here/{m}"])]:
            if self.watcher.ended(number):
                raise FormationFailed(f"generation {number} ended before it formed: {self._abort_reason(number)}")
            silent = [m for m in missing if self.watcher.silent_for(m) > policy.dead_after_s]
            if silent or time.monotonic() > deadline:
                why = f"member {(silent or missing)[0]} did not come to form generation {number}"
                self.store.compare_set(f"g{number}/abort", "", why)
                raise FormationFailed(why)
            time.sleep(self.policy.poll_s)

    def _generation(self) -> Generation:
        if self.generation is None:
            raise RuntimeError("the elastic group has not started")
        return self.generation

    # -- the step -------------------------------------------------------------------------------

    def boundary_flags(self, leave: bool, stop: bool, admit: bool = True) -> torch.Tensor:
        """This member's part of the step's flags, to be summed over the generation with the loss terms:
        [the leader asked to stop, the leader admits joiners, one slot per rank: that rank leaves].
        `admit`: the policy's word on this boundary (membership.admits_at)."""
        flags = torch.zeros(2 + self.size)
        if self.is_leader:
            flags[0] = float(stop)
            flags[1] = float(admit and self.desk.joiners_waiting(self._generation().members))
        elif leave:
            flags[2 + self.rank] = 1.0
        return flags

    def read_boundary(self, summed: torch.Tensor) -> BoundaryDecision:
        members = self._generation().members
        leaving = tuple(m for i, m in enumerate(members) if summed[2 + i] > 0)
        return BoundaryDecision(stop_all=bool(summed[0] > 0), leaving=leaving, admit=bool(summed[1] > 0))

    def commit(self, step: int) -> None:
        """Return on every member of the generation once all have reached it, on none if one is lost
        (StepAborted): the commit point before the optimizer step."""
        number = self._generation().number
        key = f"g{number}/s{step}"
        if self.store.add(f"{key}/n", 1) == self.size:
            self.store.compare_set(f"{key}/d", "", COMMITTED)
        ended = lambda: self.watcher.ended(number) or self._leader_silent()  # noqa: E731
        if not store_wait(self.store, f"{key}/d", self.policy.timeout_s, self.policy.poll_s, give_up=ended):
            self.store.compare_set(f"{key}/d", "", "abort")
        if self.store.get(f"{key}/d").decode() != COMMITTED:
            raise StepAborted(f"step {step + 1} was not committed in generation {number}: {self._abort_reason()}")
        self.steps_done = step + 1

    # -- changes of membership ------------------------------------------------------------------

    def recover(self, cause: str, admit: bool = True) -> Generation | None:
        """After a failed collective, an aborted commit or a generation that did not form (`cause`: what
        failed, in words): the next generation of those still here (and, if `admit`, the joiners waiting).
        A member the leader left out (counted lost while it was only slow) joins again; None if the
        leader's run ended meanwhile.

        Call it after the `except` block, not inside: a live exception keeps the failed collective's
        frames, and through them the old group and its sockets, which peers blocked on them wait for."""
        old = self._generation()
        self.store.compare_set(f"g{old.number}/abort", "", f"member {self.me}: {cause[:200]}")
        self._drop_group()  # closes this process's sockets: peers blocked on them are released
        self.store.set(f"g{old.number}/alive/{self.me}", "1")
        if not self.is_leader:
            return self._follow(old.number + 1)
        staying = self.desk.survivors(old, self.me)
        log.warning("elastic: generation %d ended: %s", old.number, self._abort_reason(old.number))
        return self._lead(old, staying, self.desk.take_joiners(staying) if admit else {})

    def regroup(self, decision: BoundaryDecision) -> Generation | None:
        """At a step boundary, on every member: the next generation without the members leaving and with
        the joiners the leader admits. None on a member that leaves (it is out of the group now)."""
        old = self._generation()
        if self.me in decision.leaving:
            self.store.set(f"g{old.number}/gone/{self.me}", "1")
            self._drop_group()
            self.generation = None
            return None
        self._drop_group()
        if not self.is_leader:
            return self._follow(old.number + 1)
        staying = [m for m in old.members if m not in decision.leaving]
        return self._lead(old, staying, self.desk.take_joiners(staying) if decision.admit else {}, decision.leaving)

    def hold(self) -> Generation | None:
        """Below the policy's minimum size, at a step boundary, on every member: wait for replacements up to
        the policy's `min_wait_s`. The next generation with them once there are enough, or None: too few
        came, and the group stops (the caller has saved the state)."""
        old = self._generation()
        self._drop_group()
        if not self.is_leader:
            came = self._wait_for_leader([f"g{old.number + 1}/members", f"g{old.number}/stop"], self.policy.min_wait_s)
            return None if came in (None, f"g{old.number}/stop") else self._follow(old.number + 1)
        started, joiners = time.monotonic(), {}
        while True:
            staying = [m for m in old.members if m == self.me or self.watcher.silent_for(m) <= self.policy.dead_after_s]
            joiners |= self.desk.take_joiners(staying)
            outcome = after_waiting(len(staying) + len(joiners), time.monotonic() - started, self.policy)
            if outcome is Hold.GO_ON:
                return self._lead(old, staying, joiners)
            if outcome is Hold.STOP:
                self.desk.refuse(joiners, "the group stopped below its minimum size")
                self.store.set(f"g{old.number}/stop", "1")
                return None
            time.sleep(self.policy.poll_s)

    def share_state(self, state: Any) -> Any:
        """After a generation that admitted newcomers: the leader sends `state` (its checkpoint's dict) to
        each; a newcomer returns what it received, every other member its own `state`."""
        generation = self._generation()
        if self.is_leader:
            transfer.send(state, [generation.rank_of(m) for m in self.newcomers])
            return state
        return transfer.receive(generation.rank_of(LEADER)) if self.me in self.newcomers else state

    def close(self, finished: bool = False) -> None:
        """Leave for good; `finished` (the leader's run ended): a joiner still waiting exits."""
        if finished and self.is_leader:
            self.store.set("finished", "1")
        self.watcher.close()
        self._drop_group()

    # -- the leader's side ----------------------------------------------------------------------

    def _lead(
        self, old: Generation, staying: list[int], joiners: dict[int, int], leaving: Iterable[int] = ()
    ) -> Generation:
        """The leader's decision published (the next generation, the joiners' admissions), then formed."""
        generation = Generation(old.number + 1, next_members(staying, joiners.values()))
        publish_generation(self.store, generation, joiners)
        return self._form(generation, joiners.values(), leaving)

    # -- a follower's side ----------------------------------------------------------------------

    def _follow(self, number: int) -> Generation | None:
        if not self._wait_for_leader(f"g{number}/members"):
            return None
        generation = read_generation(self.store, number)
        if self.me not in generation.members:
            log.warning("elastic: generation %d formed without member %d; joining again", number, self.me)
            return self._join()
        return self._form(generation, newcomers=())

    def wait_for_leader(self, key: str) -> bool:
        """Wait for the leader to write `key` (see `_wait_for_leader`)."""
        return self._wait_for_leader(key) is not None

    def _wait_for_leader(self, keys: str | list[str], timeout_s: float = 0.0) -> str | None:
        """Wait for the leader to write `keys` (the first of several), up to the group's timeout plus
        `timeout_s`: None when its run has ended meanwhile, LeaderLost once its heartbeat has stopped."""
        over = lambda: self.store.check(["finished"]) or self._leader_silent()  # noqa: E731
        came = store_wait(self.store, keys, self.policy.timeout_s + timeout_s, self.policy.poll_s, give_up=over)
        if came is not None or self.store.check(["finished"]):
            return came
        raise LeaderLost(f"the master (member {LEADER}) fell silent: the group cannot go on without it")

    def _leader_silent(self) -> bool:
        return self.watcher.silent_for(LEADER) > self.policy.dead_after_s

    def _abort_reason(self, number: int | None = None) -> str:
        key = f"g{self._generation().number if number is None else number}/abort"
        return self.store.get(key).decode() if self.store.check([key]) else "no reason recorded"

    def _drop_group(self) -> None:
        """Tear the current group down; the collector then frees what still held it (its sockets close)."""
        if dist.is_initialized():
            if self.backend == "nccl":  # a communicator with a lost peer must be aborted, not torn down
                dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()
            gc.collect()
